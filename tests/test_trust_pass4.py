"""Fourth trust pass: the architecture registry's newest families (Qwen2, Qwen3, Mistral, Gemma 2, ModernBERT) and
``explain``'s speed paths (``logits_to_keep``, no cache, ModernBERT's gate units) under unusual inputs, each checked
against a number computed another way (the row explained alone, the model's plain forward). Tiny random models from
test_conformance's configs (sliding and local windows shorter than the sequences).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import padded_rows
from test_conformance import _converted

from bcos_plugins import explain
from bcos_plugins.errors import BcosError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _mixed_padding(lengths: list[int], width: int, sides: list[str], seed: int = 0):
    """Rows of ``lengths`` real tokens, each padded on its own side of ``sides``: one batch mixing left and right."""
    rows = [padded_rows([n], width, side, seed + i) for i, (n, side) in enumerate(zip(lengths, sides, strict=True))]
    return torch.cat([ids for ids, _ in rows]), torch.cat([mask for _, mask in rows])


# ------------------------------------------------------------------ Gemma 2 in float64 with padding


@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "Gemma2Model", "Gemma2ForSequenceClassification"])
@pytest.mark.parametrize("sides", [["left", "left"], ["right", "right"]])
def test_a_padded_float64_gemma2_is_refused_naming_the_cause_and_the_fix(name, sides):
    """transformers' Gemma 2 attention (eager, for its soft-caps) computes its softmax in float32, where the float64 mask
    value is -inf: a padding position whose keys are all masked (left padding; right padding beyond the sliding
    window) gets NaN, which the next layer spreads to the real tokens. explain refused it with the generic "output is
    NaN ... check the embedding rows" message, which points at the inputs. The message now names the float64 +
    padding cause and the fixes, and both fixes it names work: the same batch in float32, and each row alone."""
    model = copy.deepcopy(_converted(name)).double()
    ids, mask = _mixed_padding([9, 3], 9, sides)
    target = {"position": -1} if name != "Gemma2ForSequenceClassification" else {}
    with pytest.raises(BcosValueError, match=r"float64 and the batch is padded.*softmax in float32.*Explain in float32 "
                                             r"\(model.float\(\)\), or explain the padded rows one at a time"):
        explain(model, ids, mask, target=1, **target)
    explain(_converted(name), ids, mask, target=1, **target)  # float32: finite
    for row in range(2):  # float64 without padding: finite
        explain(model, ids[row, mask[row].bool()][None], target=1, **target)


def test_an_unpadded_float64_nan_keeps_the_generic_message():
    """The float64 + padding cause is named only where it applies: a NaN embedding row of an unpadded float64 batch
    still gets the message that points at the inputs and the embedding rows."""
    model = copy.deepcopy(_converted("Gemma2ForCausalLM")).double()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        model.get_input_embeddings().weight[7] = float("nan")
    with pytest.raises(BcosValueError, match=r"nothing finite to explain \(an input or an embedding row") as caught:
        explain(model, ids, target=1)
    assert "float64" not in str(caught.value)


# ------------------------------------------------------------------ ModernBERT in float64 with left padding


@pytest.mark.parametrize("name", ["ModernBertModel", "ModernBertForSequenceClassification"])
def test_a_left_padded_float64_modernbert_row_is_explained_as_alone_to_float64(name):
    """ModernBERT got no position ids (rotary: only distances matter), so a left-padded row ran at positions shifted by
    its padding. transformers computes the rotary tables in float32, so in a float64 model the shift changed the row's
    token scores by about 1e-8 of themselves (float32's rounding) against the row alone: a float64 explanation that
    depended on the batch's padding at float32 precision. ModernBERT is now given position ids counting real tokens, as
    every other registry model whose forward takes them, and a left-padded row (windows shorter than the rows too)
    is the row alone's to float64's rounding."""
    model = copy.deepcopy(_converted(name)).double()
    ids, mask = _mixed_padding([12, 3, 7, 1], 12, ["right", "left", "left", "left"], seed=3)
    target = {} if name == "ModernBertForSequenceClassification" else {"position": -1}
    batch = explain(model, ids, mask, target=1, **target)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = explain(model, ids[row, real][None], target=1, **target)
        torch.testing.assert_close(batch.explained[row], alone.explained[0], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(batch.contributions[row, real], alone.contributions[0], rtol=1e-11, atol=1e-13)
        with torch.no_grad():  # and the model's own plain forward of the row alone
            out = model(input_ids=ids[row, real][None])
        plain = out.logits[0, 1] if name == "ModernBertForSequenceClassification" else out.last_hidden_state[0, -1, 1]
        torch.testing.assert_close(batch.explained[row], plain, rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------ hosvd of a half-precision layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hosvd_of_a_half_precision_layer_is_float32_like_eigendecompose(dtype):
    """eigendecompose returns a half-precision layer's results in float32 (the package's at_least_float32 rule), hosvd
    returned them in the layer's dtype, its interaction matrices computed in half precision (3 significant digits).
    Now float32 throughout, and equal to the float64 decomposition of the same (half-precision) weights to float32's
    rounding, where the half-precision matrices were off by up to 6e-3 of their largest entry (bfloat16; 1e-3 in float16)."""
    from test_bilinear import random_weights

    from bcos_plugins.bilinear import BilinearWeights, eigendecompose, hosvd

    half = BilinearWeights(*(t.to(dtype) for t in (lambda w: (w.W, w.V, w.P))(random_weights(seed=3, d_out=6))))
    decomposition = hosvd(half, rank=3)
    assert {t.dtype for t in decomposition} == {torch.float32}
    assert eigendecompose(half, decomposition.output_directions[:, 0].to(dtype)).eigenvalues.dtype == torch.float32
    exact = hosvd(BilinearWeights(half.W.double(), half.V.double(), half.P.double()), rank=3)
    # singular vectors up to sign: align each term's direction with the float64 one
    signs = torch.sign((decomposition.output_directions.double() * exact.output_directions).sum(0))
    torch.testing.assert_close(decomposition.singular_values.double(), exact.singular_values, rtol=1e-5, atol=0)
    torch.testing.assert_close(decomposition.interaction_matrices.double() * signs[:, None, None],
                               exact.interaction_matrices, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(decomposition.reconstruct().double(), exact.reconstruct(), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ a token x component table bfloat16 cannot verify


def test_a_bfloat16_token_component_table_whose_entries_cancel_warns_that_its_check_cannot_verify_it():
    """token_component_decomposition refuses a table missing terms beyond the dtype's rounding, sqrt(eps) of the row's
    |explained| + sum |table| (0.09 in bfloat16). A row whose entries cancel 11x is then allowed an error of about its
    whole value: a term no token carries, half the explained value, added to that row alone came back without a
    refusal or a warning. It now warns, naming the rows, the allowed error and the fix (float32), where the check
    cannot rule out half the value missing; float32 refuses the same term, and float16 and float32 tables whose check
    means something pass without a word."""
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition
    from test_transformer_lens_adapter import LLAMA_LIKE, tiny_bcos, tokens

    for dtype in (torch.float16, torch.float32):
        quiet = tiny_bcos(LLAMA_LIKE).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            token_component_decomposition(quiet, tokens(), target=5, foil=7)
    model = tiny_bcos(LLAMA_LIKE).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        healthy = token_component_decomposition(model, tokens(), target=5, foil=7)
    cancelling = healthy.table.abs().sum((1, 2)) / healthy.explained.abs()
    row = int(cancelling.argmax())
    assert cancelling[row] > 10  # the row the check cannot verify
    half = 0.5 * float(healthy.explained[row])

    def add_half_the_value_to_one_row(module, args, logits):
        extra = torch.zeros_like(logits)
        extra[row, :, 5] = half
        return logits + extra

    with pytest.warns(UserWarning, match=rf"token_component_decomposition: the table of row\(s\) \[[0-9, ]*{row}"
                                         r".*only as far as torch.bfloat16 rounding can tell.*as large as half the "
                                         r"value would pass unnoticed. Decompose in float32 \(model.float\(\)\)"):
        model.unembed.register_forward_hook(add_half_the_value_to_one_row)
        token_component_decomposition(model, tokens(), target=5, foil=7)
    quiet.unembed.register_forward_hook(add_half_the_value_to_one_row)  # the float32 model of the same weights
    with pytest.raises(BcosError, match="the model adds terms that no input token carries"):
        token_component_decomposition(quiet, tokens(), target=5, foil=7)


# ------------------------------------------------------------------ decoder metrics: NaN of a padded float64 batch,
# half-precision logit differences


def test_perplexity_of_a_padded_float64_gemma2_is_refused_not_nan():
    """perplexity pads its windows on the right; in float64 transformers' Gemma 2 gives NaN at a padding position
    beyond the sliding window, which reaches the real tokens, and perplexity returned nll = nan without a word (each
    window alone: 4.15). It is refused now, naming the windows, the cause and the fixes, and the fix it names
    (batch_size=1) gives the windows' perplexity."""
    from bcos_plugins.metrics import perplexity

    model = copy.deepcopy(_converted("Gemma2ForCausalLM")).double()
    texts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    with pytest.raises(BcosValueError, match=r"^perplexity: the model's logits are NaN for windows \[1\]\. The model "
                                             r"runs in float64 and the batch is padded.*Pass batch_size=1"):
        perplexity(model, texts, max_length=9, batch_size=3)
    one_by_one = perplexity(model, texts, max_length=9, batch_size=1)
    alone = [perplexity(model, [text], max_length=9) for text in texts]
    nll = sum(a.nll * a.n_tokens for a in alone) / sum(a.n_tokens for a in alone)
    assert one_by_one.nll == pytest.approx(nll, rel=1e-12)
    float32 = perplexity(_converted("Gemma2ForCausalLM"), texts, max_length=9, batch_size=3)
    assert float32.nll == pytest.approx(nll, rel=1e-5)


def test_next_token_contrast_of_a_padded_float64_gemma2_names_the_cause():
    """next_token_contrast refused the NaN logits of a padded float64 Gemma 2 with probability_gap's message, which
    names an argument the caller never passed ("logits: contain NaN ... Check the model's output"). It now names the
    rows, the float64 + padding cause and the fixes."""
    from bcos_plugins.metrics import next_token_contrast

    model = copy.deepcopy(_converted("Gemma2ForCausalLM")).double()
    ids, mask = _mixed_padding([9, 3, 6, 1], 9, ["right", "left", "right", "left"])
    with pytest.raises(BcosValueError, match=r"^next_token_contrast: the model's logits are NaN for rows \[1, 3\]\. The "
                                             r"model runs in float64 and the batch is padded.*model.float\(\)"):
        next_token_contrast(model, ids, mask, target=5, foil=7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_next_token_contrast_subtracts_logits_in_at_least_float32(dtype):
    """next_token_contrast subtracted a bfloat16 model's two logits in bfloat16 (-0.20898 for -0.20874: 3 significant
    digits) and cast a float64 model's differences to float32. The difference is now taken in at least float32 and a
    float64 model's kept in float64, as explain returns its values: it equals the float64 difference of the model's own
    logits (each row's, as alone)."""
    from bcos_plugins.attribution.text import rows_as_alone_call
    from bcos_plugins.metrics import next_token_contrast

    model = copy.deepcopy(_converted("Qwen2ForCausalLM")).to(dtype)
    ids, mask = _mixed_padding([9, 3, 6, 1], 9, ["right", "left", "right", "left"])
    result = next_token_contrast(model, ids, mask, target=5, foil=7)
    assert result.logit_difference.dtype == result.probability_gap.dtype == (
        torch.float64 if dtype == torch.float64 else torch.float32)
    with torch.no_grad():
        logits = model(**rows_as_alone_call(model, ids, mask, causal_lm=True)).logits
    last = torch.tensor([8, 8, 5, 8])
    picked = logits[torch.arange(4), last].double()
    torch.testing.assert_close(result.logit_difference.double(), picked[:, 5] - picked[:, 7], rtol=0, atol=0)


# ------------------------------------------------------------------ Captum: token ids given to the model


@pytest.mark.parametrize("name", ["Qwen3ForCausalLM", "ModernBertForSequenceClassification"])
def test_layer_bcos_refuses_float_and_out_of_vocabulary_ids_naming_them(name):
    """LayerBcos(model) calls the model on Captum's inputs as token ids; they passed no check: float ids were truncated
    (5.7 read as 5, the attributions of other tokens than the user's, without a word), ids outside the vocabulary
    failed inside the embedding (IndexError: index out of range in self), and a third additional_forward_args value
    with Python's "takes from 2 to 4 positional arguments". All are refused now, naming the argument and the fix;
    integer ids of any width give the int64 ids' attributions."""
    from bcos_plugins.adapters.captum import LayerBcos

    model = _converted(name)
    ids, mask = _mixed_padding([7, 3, 5], 7, ["right", "right", "right"])
    reference = LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
    with pytest.raises(BcosError, match=r"^input_ids: token ids must be integers, got torch.float32"):
        LayerBcos(model).attribute(ids.float() + 0.7, target=1, additional_forward_args=(mask,))
    with pytest.raises(BcosError, match=r"^input_ids: has ids outside the vocabulary \[0, 60\) at rows \[0, 1, 2\]"):
        LayerBcos(model).attribute(ids + 60, target=1, additional_forward_args=(mask,))
    with pytest.raises(BcosError, match=r"^additional_forward_args: got 3 values.*\(attention_mask, position\)"):
        LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask, None, 3))
    for width in (torch.int32, torch.uint8):
        torch.testing.assert_close(LayerBcos(model).attribute(ids.to(width), target=1, additional_forward_args=(mask,)),
                                   reference, rtol=0, atol=0)


def test_bcos_attribution_of_a_text_model_itself_is_refused_naming_the_embedding_paths():
    """BcosAttribution(model) of a transformers text model passes its float inputs as token ids: torch failed inside
    the embedding ("Expected tensor for argument #1 'indices' to have one of the following scalar types"). Refused
    now, naming the two ways that attribute a text model (EmbeddingForward, LayerBcos)."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward

    model = _converted("Qwen3ForCausalLM")
    ids, mask = _mixed_padding([5, 3], 5, ["right", "right"])
    forward = EmbeddingForward(model)
    with pytest.raises(BcosError, match=r"^forward_func: Qwen3ForCausalLM takes token ids first.*EmbeddingForward\(model\)"
                                        r".*LayerBcos\(model\)"):
        BcosAttribution(model).attribute(forward.embed(ids, mask), target=1, additional_forward_args=(mask,))
    BcosAttribution(forward).attribute(forward.embed(ids, mask), target=1, additional_forward_args=(mask,))


@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "ModernBertModel"])
def test_explain_refuses_inputs_embeds_beside_input_ids_naming_the_fix(name):
    """explain(model, ids, inputs_embeds=e) reached transformers, whose "You must specify exactly one of input_ids or
    inputs_embeds" points at dropping input_ids, which explain needs (its contributions are taken from their
    embeddings). Refused before the model runs, naming the argument, the problem and the ways to go."""
    model = _converted(name)
    ids, mask = _mixed_padding([5, 3], 5, ["right", "right"])
    embeds = model.get_input_embeddings()(ids).detach()
    with pytest.raises(BcosValueError, match=r"^inputs_embeds: would replace the embeddings of input_ids.*\(got a "
                                             r"Tensor\)\. Pass the token ids as input_ids alone.*EmbeddingForward"):
        explain(model, ids, mask, target=1, position=-1, inputs_embeds=embeds)


def test_perturbation_curves_of_a_float64_gemma2_name_the_cause_of_its_nan_logits():
    """perturbation_curves removes tokens through the attention mask; in float64 transformers' Gemma 2 then gives NaN
    where a query sees only masked keys (a removed first token), also on unpadded rows, and the refusal said "returned
    NaN or inf logits. Check the model and its inputs", which points at the inputs. It now names the float64 + masking
    cause and the fixes; the fix it names (float32) gives finite curves."""
    from bcos_plugins.metrics import perturbation_curves

    model = copy.deepcopy(_converted("Gemma2ForSequenceClassification")).double()
    ids, mask = _mixed_padding([9, 9, 9], 9, ["right"] * 3)
    special = torch.zeros_like(ids, dtype=torch.bool)
    scores = explain(model, ids, mask, target=1).contributions
    # the package's one refusal of NaN logits (attribution.text.refuse_nan_logits), naming the examples
    with pytest.raises(BcosValueError, match=r"^perturbation_curves: the model's logits are NaN or infinite for "
                                             r"examples \[0, 1, 2\]\. The model runs in float64 and tokens are masked "
                                             r"out.*Pass the model in float32 \(model\.float\(\)\), or "
                                             r"masking='mask_token' with unpadded rows\.$"):
        perturbation_curves(model, ids, mask, scores, special_tokens=special, target=1)
    curves = perturbation_curves(_converted("Gemma2ForSequenceClassification"), ids, mask, scores.float(),
                                 special_tokens=special, target=1)
    assert torch.isfinite(curves.comprehensiveness).all() and torch.isfinite(curves.sufficiency).all()


def test_perturbation_curves_refuse_an_infinite_logit_naming_the_perturbed_example():
    """An infinite logit (softmax: NaN) on one example's perturbed copies is refused in the package's words for NaN
    logits, naming that example (a perturbed batch holds 2 x len(fractions) copies of each), not a row of the batch."""
    from bcos_plugins.metrics import perturbation_curves

    ids, mask = padded_rows([6, 6, 6], 6, "right", seed=3)

    def classifier(input_ids, attention_mask):
        logits = torch.stack([input_ids.float().mean(-1), attention_mask.float().sum(-1)], -1)
        # example 2's copies with a token removed (fewer than 6 visible tokens) overflow
        broken = (input_ids[:, 0] == ids[2, 0]) & (attention_mask.sum(-1) < 6)
        return torch.where(broken[:, None], torch.tensor([float("inf"), 0.0]), logits)

    assert len({int(i) for i in ids[:, 0]}) == 3  # the first token tells the examples apart
    special = torch.zeros_like(ids, dtype=torch.bool)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BcosValueError, match=r"^perturbation_curves: the model's logits are NaN or infinite for "
                                             r"examples \[2\]\. Check their inputs"):
        perturbation_curves(classifier, ids, mask, scores, special_tokens=special, fractions=(0.5,), batch_size=5)


# ------------------------------------------------------------------ NaN of a padded float64 Gemma 2 on the other paths


def test_layer_bcos_refuses_nan_attributions_naming_the_float64_padding_cause():
    """LayerBcos (Captum's layer method underneath) returned a padded float64 Gemma 2's NaN attributions without a
    word: its completeness warning compares a NaN gap, which is never above the tolerance. It now refuses them, as
    BcosAttribution and explain do, naming the rows, the cause and the fixes; BcosAttribution through EmbeddingForward
    names the same cause (it gave the generic "check the inputs and the embedding rows")."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos

    model = copy.deepcopy(_converted("Gemma2ForCausalLM")).double()
    ids, mask = _mixed_padding([7, 3, 5], 7, ["right", "left", "right"])
    fixes = r"The model runs in float64 and the batch is padded.*Attribute in float32 \(model\.float\(\)\)"
    with pytest.raises(BcosValueError, match=r"^LayerBcos: the attributions or the explained output are NaN or infinite "
                                             r"for row \[1\].*" + fixes):
        LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
    forward = EmbeddingForward(model)
    with pytest.raises(BcosValueError, match=r"^model: its output is NaN or infinite for row\(s\) \[1\].*" + fixes):
        BcosAttribution(forward, model=model).attribute(forward.embed(ids, mask), target=1,
                                                        additional_forward_args=(mask,))
    attributions = LayerBcos(model).attribute(ids[:1], target=1, additional_forward_args=(mask[:1],))  # unpadded
    assert torch.isfinite(attributions).all()


def test_predict_refuses_nan_logits_naming_the_texts_and_the_cause():
    """predict returned a padded float64 Gemma 2 classifier's NaN logits, and accuracy read a NaN row's arg-max as
    class 0 without a word. predict now refuses them, naming the texts (their indices in the caller's list), the
    float64 + padding cause and the fixes; the fix it names (batch_size=1) gives each text's logits alone."""
    from test_conformance import _word_tokenizer

    from bcos_plugins.prediction import accuracy, predict

    model = copy.deepcopy(_converted("Gemma2ForSequenceClassification")).double()
    texts = ["w5 w9 w11 w4 w8 w6 w7 w10 w12", "w7 w3"]
    with pytest.raises(BcosValueError, match=r"^predict: the model's logits are NaN for texts \[1\]\. The model runs in "
                                             r"float64 and the batch is padded.*batch_size=1"):
        predict(model, _word_tokenizer(), texts)
    with pytest.raises(BcosValueError, match=r"^predict: the model's logits are NaN for texts \[1\]"):
        accuracy(model, _word_tokenizer(), texts, [0, 0])
    one_by_one = predict(model, _word_tokenizer(), texts, batch_size=1)
    assert torch.isfinite(one_by_one).all()
    float32 = predict(_converted("Gemma2ForSequenceClassification"), _word_tokenizer(), texts)
    torch.testing.assert_close(one_by_one.float(), float32, rtol=1e-5, atol=1e-6)  # (float64 logits since e38ce59)
