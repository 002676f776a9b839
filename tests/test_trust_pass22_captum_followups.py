"""Trust pass 22, Captum follow-ups (helper-151): the Captum adapter builds its refusals from the core's one check
or cause (the padding token's NaN embedding, the tokenizer's output as ids), and names the real cause of a gap.
Each test fails on the behaviour before its fix."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch, tiny_bcos_model, with_nan_embedding_row

from bcos_plugins.errors import BcosTypeError, BcosValueError

# ------------------------------------------------ a padding token whose embedding is NaN


def test_layer_bcos_names_the_padding_tokens_nan_embedding():
    """A NaN padding embedding makes every padded row NaN (a masked key's weight 0 times NaN): explain and predict
    name it (attribution.text.non_finite_embedding_cause), LayerBcos's refusal said "check those rows' inputs, the
    embedding rows of their tokens" where the one broken row is the padding's."""
    from bcos_plugins.adapters.captum import LayerBcos

    ids, mask = padded_batch()  # rows 1 and 2 padded with id 0
    with pytest.raises(BcosValueError, match=r"^LayerBcos: .*NaN or infinite for rows \[1, 2\].*The padding "
                                             r"token's input embedding \(model\.get_input_embeddings\(\)\.weight\[0\]\) "
                                             r"is NaN or infinite.*weight\.data\[0\] = 0"):
        LayerBcos(with_nan_embedding_row(tiny_bcos_model(), 0)).attribute(ids, target=1, additional_forward_args=(mask,))
    # a real token's broken row keeps the message that points at the rows' tokens, not the padding
    with pytest.raises(BcosValueError, match=r"^LayerBcos: .*check those rows' inputs") as caught:
        LayerBcos(with_nan_embedding_row(tiny_bcos_model(), int(ids[0, 0]))).attribute(ids, target=1, additional_forward_args=(mask,))
    assert "padding" not in str(caught.value)


# ------------------------------------------------ the tokenizer's output as LayerBcos's inputs


def test_layer_bcos_refuses_the_tokenizers_output_through_the_token_batch_check():
    """LayerBcos had its own copy of token_batch_and_padding's refusal of the tokenizer's output; the one check now
    takes the caller's fix, and LayerBcos's message keeps its argument (inputs) and fix (where the mask goes)."""
    from bcos_plugins.adapters.captum import LayerBcos
    from transformers import BatchEncoding

    from bcos_plugins._checks import token_batch_and_padding

    ids, mask = padded_batch()
    enc = BatchEncoding({"input_ids": ids, "attention_mask": mask})
    fix = "Pass enc['input_ids'] here"
    with pytest.raises(BcosTypeError, match=r"^inputs: got the tokenizer's output \(a BatchEncoding with keys "
                                            r"\['input_ids', 'attention_mask'\]\), not a tensor of token ids \(batch, "
                                            r"pos\)\. Pass enc\['input_ids'\] here\.?$"):
        token_batch_and_padding(enc, name="inputs", tokenizer_output_fix=fix)
    with pytest.raises(BcosTypeError) as shared:
        token_batch_and_padding(enc, name="inputs", tokenizer_output_fix="FIX")
    with pytest.raises(BcosTypeError) as captum:
        LayerBcos(tiny_bcos_model()).attribute(enc, target=1)
    # the same problem, built by the one check; the fix is LayerBcos's
    problem = str(shared.value).split("FIX")[0]
    assert str(captum.value).startswith(problem), (str(captum.value), problem)
    assert "additional_forward_args=(enc['attention_mask'],)" in str(captum.value)
    # explain's fix is unchanged (the keywords it takes)
    with pytest.raises(BcosTypeError, match=r"^input_ids: got the tokenizer's output .*Pass its ids and mask: "
                                            r"input_ids=enc\['input_ids'\], attention_mask=enc\['attention_mask'\] "
                                            r"\(explain\(model, \*\*enc\) unpacks them\)"):
        token_batch_and_padding(enc)


# ------------------------------------------------ float32 embeddings of a bfloat16 model


def test_float32_embeddings_of_a_bfloat16_model_warn_with_the_rounding_not_missing_positions():
    """EmbeddingForward rounds float32 embeddings to the bfloat16 the model computes in, so x * gradient of the
    float32 values misses the logit by that rounding (0.4 %): the completeness warning said positions were missing
    (the inputs_embeds text, whose fix, EmbeddingForward, was the call being made)."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward

    model = tiny_bcos_model().to(torch.bfloat16)
    ids, mask = padded_batch()
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    assert embeddings.dtype == torch.bfloat16
    with pytest.warns(UserWarning, match=r"^BcosAttribution: the attributions do not sum to the explained output .*: "
                                         r"the inputs are float32 and EmbeddingForward rounded them to bfloat16, .*no "
                                         r"position is missing.*Pass embeddings in the model's dtype") as caught:
        BcosAttribution(fwd).attribute(embeddings.float(), target=1, additional_forward_args=(mask,))
    assert not any("inputs_embeds" in str(w.message) for w in caught)
    # the model's own dtype: no gap to name (the bfloat16 rounding of the forward is the explanation's own)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BcosAttribution(fwd).attribute(embeddings, target=1, additional_forward_args=(mask,))
    # a function that is no EmbeddingForward keeps the missing-positions text: model(inputs_embeds=) adds positions
    float_model = tiny_bcos_model()
    with pytest.warns(UserWarning, match=r"does not come from `inputs`.*inputs_embeds="):
        BcosAttribution(lambda e, m: float_model(inputs_embeds=e, attention_mask=m).logits, model=float_model).attribute(
            float_model.get_input_embeddings()(ids), target=1, additional_forward_args=(mask,))
