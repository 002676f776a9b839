"""Trust pass 23, the hosts a third time (Captum and inseq, called the way their tutorials write the calls): inseq's
aggregators, step scores of merged spans and output concatenation, Captum's metrics, wrappers and LLM API. Each test
fails on the behaviour before its fix: a number that no longer added up to the explained logit without a word, or a
crash that named neither the argument nor the fix."""

from __future__ import annotations

import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
import inseq
import pytest
import torch
import transformers as T
from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def bcos_gpt2(gpt2_tokenizer):
    return inseq.load_model(_tiny_lm("gpt2", len(gpt2_tokenizer)), "bcos", tokenizer=gpt2_tokenizer)


def _column_totals(scores: torch.Tensor) -> torch.Tensor:
    """Each generated token's column summed over the prefix tokens (and d_model where not aggregated yet)."""
    return torch.nansum(scores, dim=tuple(d for d in range(scores.ndim) if d != 1))


# ------------------------------------------------ inseq: step scores of a merged word of the generation


@pytest.mark.parametrize("attributed_fn", ["logit", "probability"])
def test_inseq_merged_generated_subwords_keep_their_logit_and_deltas_as_the_columns_sum(bcos_gpt2, gpt2_tokenizer,
                                                                                        attributed_fn):
    """``out.aggregate("subwords")`` over a generated word of two subwords (" EVENTUMP": ĠEVENT + UMP) sums the two
    columns' contributions, which explain the sum of the two logits; the step score ``logit`` of the merged column was
    the larger one (inseq's default ``absmax``) and ``deltas`` the larger gap, so the merged column summed to 0.91 while
    its logit said 0.46 and its deltas said 1e-7: complete on paper, 0.45 off, silently. Now a merged column's
    ``logit`` and ``deltas`` are sums, so sum(contributions) - logit = deltas holds after merging as before."""
    generated = "Hello EVENTUMP starters"
    assert gpt2_tokenizer.tokenize(generated)[1:3] == ["ĠEVENT", "UMP"]
    out = bcos_gpt2.attribute("Hello", generated, attributed_fn=attributed_fn, step_scores=["logit"],
                              show_progress=False)
    seq = out.sequence_attributions[0]
    logits, deltas = seq.step_scores["logit"], seq.step_scores["deltas"]
    assert len(logits) == 3
    for merged in (out.aggregate("subwords", special_chars=("Ġ",)), out.aggregate("spans", target_spans=[(1, 3)])):
        word = merged.sequence_attributions[0]
        assert [t.token for t in word.target][1] == "ĠEVENTUMP" and word.target_attributions.shape[1] == 2
        totals = _column_totals(word.target_attributions)
        columns = _column_totals(seq.target_attributions)
        # the merged column holds the two steps' contributions together (inseq's merge, unchanged)
        torch.testing.assert_close(totals, torch.stack([columns[:2].sum(), columns[2]]), rtol=1e-5, atol=1e-6)
        # and its step scores explain the two steps' values together
        torch.testing.assert_close(word.step_scores["logit"], torch.stack([logits[:2].sum(), logits[2]]))
        torch.testing.assert_close(word.step_scores["deltas"], torch.stack([deltas[:2].sum(), deltas[2]]))
        if attributed_fn == "logit":  # complete: the merged contributions sum to the merged logit
            torch.testing.assert_close(totals, word.step_scores["logit"], rtol=1e-4, atol=1e-5)
        # sum(contributions) - attributed value = deltas per column, before the merge and after it
        attributed = columns - deltas
        torch.testing.assert_close(totals - word.step_scores["deltas"],
                                   torch.stack([attributed[:2].sum(), attributed[2]]), rtol=1e-4, atol=1e-5)


# ------------------------------------------------ inseq: the aggregator "sum" named by the user


def test_inseq_aggregate_sum_of_a_bcos_output_is_the_signed_sum_that_adds_up_to_the_logit(bcos_gpt2):
    """``out.aggregate("sum")`` (and ``"scores"``, ``show(aggregator="sum")``, ``get_scores_dicts(aggregator="sum")``)
    ran inseq's scores aggregator with its default normalisation: each column divided by its L1 norm, so the token
    scores of a B-cos output, whose point is that they add up to the logit, summed to 0.48 less than the logit, with
    nothing said (the default ``aggregate()`` is the unnormalised signed sum). A user who names the sum gets the sum;
    asking for ``normalize=True`` still gives inseq's normalised view."""
    out = bcos_gpt2.attribute(["The cat sat on the mat", "Hello"], generation_args={"max_new_tokens": 3,
                              "do_sample": False}, step_scores=["logit"], show_progress=False)
    for aggregator in ("sum", "scores", ["sum"]):
        aggregated = out.aggregate(aggregator)
        for seq, before in zip(aggregated.sequence_attributions, out.sequence_attributions, strict=True):
            assert seq.target_attributions.ndim == 2
            torch.testing.assert_close(seq.target_attributions, before.aggregate().target_attributions, equal_nan=True)
            torch.testing.assert_close(_column_totals(seq.target_attributions), before.step_scores["logit"],
                                       rtol=1e-4, atol=1e-5)
    for seq, scores in zip(out.sequence_attributions, out.get_scores_dicts(aggregator="sum"), strict=True):
        totals = [sum(v for v in column.values() if v == v) for column in scores["target_attributions"].values()]
        torch.testing.assert_close(torch.tensor(totals), seq.step_scores["logit"], rtol=1e-4, atol=1e-5)
    assert isinstance(out.show(aggregator="sum", display=False, return_html=True), str)
    # inseq's normalisation, asked for by name, is still inseq's: every column's |scores| sum to 1
    normalised = out.aggregate("sum", normalize=True).sequence_attributions[0].target_attributions
    torch.testing.assert_close(torch.nansum(normalised.abs(), 0), torch.ones(3), rtol=1e-5, atol=1e-6)


# ------------------------------------------------ Captum: LayerBcos at layers Captum cannot take, named


@pytest.mark.parametrize(("class_name", "attention"), [
    ("GPT2LMHeadModel", lambda m: m.transformer.h[0].attn),
    ("BertForSequenceClassification", lambda m: m.bert.encoder.layer[0].attention),
    ("LlamaForCausalLM", lambda m: m.model.layers[0].self_attn),
])
def test_layer_bcos_at_an_attention_module_names_its_tuple_output_and_the_fix(class_name, attention):
    """``LayerBcos(model, layer=<an attention module>)``: transformers' attention modules return (output, attention
    weights), the weights None unless asked for, and Captum failed on the None with a bare "AssertionError: Given input
    is not a torch.Tensor", naming neither the layer nor what to pass instead."""
    from bcos_plugins.adapters.captum import LayerBcos
    from conftest import padded_batch, tiny_bcos_model

    from bcos_plugins.errors import BcosValueError

    model = tiny_bcos_model(class_name)
    ids, mask = padded_batch()
    layer = attention(model)
    with pytest.raises(BcosValueError, match=rf"layer: {type(layer).__name__} returns a tuple holding None.*"
                                             r"Given input is not a torch.Tensor.*Attribute at the block"):
        LayerBcos(model, layer=layer).attribute(ids, target=1, additional_forward_args=(mask,))
    # in a list of layers too, naming the one whose output Captum refuses
    block = model.transformer.h[0] if class_name.startswith("GPT2") else (
        model.bert.encoder.layer[0] if class_name.startswith("Bert") else model.model.layers[0])
    with pytest.raises(BcosValueError, match=rf"layer: {type(layer).__name__} returns a tuple holding None"):
        LayerBcos(model, layer=[block, layer]).attribute(ids, target=1, additional_forward_args=(mask,))
    # the block around it is attributed as before
    assert LayerBcos(model, layer=block).attribute(ids, target=1, additional_forward_args=(mask,)).shape[:2] \
        == ids.shape


def test_noise_tunnel_over_layer_bcos_at_several_layers_names_layer():
    """``NoiseTunnel(LayerBcos(..., layer=[a, b]))`` failed inside Captum with "AssertionError: `inputs` must be a
    torch.Tensor or a tuple[torch.Tensor] but found: <class 'list'>": NoiseTunnel averages one attribution per input
    and cannot take the per-layer list."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos
    from captum.attr import NoiseTunnel
    from conftest import padded_batch, tiny_bcos_model

    from bcos_plugins.errors import BcosValueError

    model = tiny_bcos_model("GPT2LMHeadModel")
    ids, mask = padded_batch(side="left")
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    layers = [model.transformer.h[0], model.transformer.h[1]]
    with pytest.raises(BcosValueError, match=r"layer: NoiseTunnel averages one attribution.*2 layers.*one "
                                             r"NoiseTunnel\(LayerBcos\(.*layer=layer"):
        NoiseTunnel(LayerBcos(fwd, layer=layers, model=model)).attribute(
            embeddings, nt_samples=2, stdevs=0.01, target=5, additional_forward_args=(mask,))
    # one layer per NoiseTunnel, as the fix says, runs (no noise: each sample is the plain call)
    smoothed = NoiseTunnel(LayerBcos(fwd, layer=layers[1], model=model)).attribute(
        embeddings, nt_samples=2, stdevs=0.0, target=5, additional_forward_args=(mask,))
    plain = LayerBcos(fwd, layer=layers[1], model=model).attribute(embeddings, target=5,
                                                                   additional_forward_args=(mask,))
    torch.testing.assert_close(smoothed, plain, rtol=1e-5, atol=1e-6)


def test_llm_gradient_attribution_over_layer_bcos_at_several_layers_names_layer():
    """``LLMGradientAttribution(LayerBcos(model, layer=[a, b]), tokenizer).attribute(...)`` failed inside Captum with
    "AttributeError: 'list' object has no attribute 'detach'": Captum's LLM workflow takes one attribution per target
    token, and LayerBcos at a list of layers returns one per layer."""
    from bcos_plugins.adapters.captum import LayerBcos
    from captum.attr import LLMGradientAttribution, TextTokenInput
    from conftest import tiny_bcos_model
    from test_captum_adapter import _word_tokenizer

    from bcos_plugins.errors import BcosValueError

    model = tiny_bcos_model("GPT2LMHeadModel", b=1.1)
    tokenizer = _word_tokenizer()
    layers = [model.transformer.h[0], model.transformer.h[1]]
    with pytest.raises(BcosValueError, match=r"layer: LLMGradientAttribution takes one attribution.*2 layers.*one "
                                             r"LLMGradientAttribution\(LayerBcos\(model, layer=layer\)"):
        LLMGradientAttribution(LayerBcos(model, layer=layers), tokenizer).attribute(
            TextTokenInput("w5 w7 w9 w11", tokenizer), target="w3 w4")
    # one layer runs, and LayerBcos at a list of layers called directly still returns one attribution per layer
    one = LLMGradientAttribution(LayerBcos(model, layer=layers[1]), tokenizer).attribute(
        TextTokenInput("w5 w7 w9 w11", tokenizer), target="w3 w4")
    assert one.token_attr.shape == (2, 4)
    ids = torch.tensor([[5, 7, 9, 11]])
    per_layer = LayerBcos(model, layer=layers).attribute(ids, target=3, additional_forward_args=(torch.ones_like(ids),))
    assert isinstance(per_layer, list) and len(per_layer) == 2


# ------------------------------------------------ Captum: embeddings of a padded batch attributed without their mask


def test_embeddings_of_a_padded_batch_attributed_without_their_mask_are_refused_naming_the_mask():
    """``BcosAttribution(fwd).attribute(fwd.embed(ids, mask), target=t)`` with the mask left out of
    ``additional_forward_args``: the embeddings (positions counted from the mask) ran with every padding position
    attended, another function than the model's on those rows (a left-padded row's logit 0.14 where the model's is
    0.0015), silently. The embeddings remember the mask they were embedded with; leaving it out, or passing another,
    is refused naming additional_forward_args. A batch without padding needs no mask, and the mask given explains the
    model's own logits."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
    from conftest import padded_batch, tiny_bcos_model

    from bcos_plugins import explain
    from bcos_plugins.errors import BcosValueError

    model = tiny_bcos_model("GPT2LMHeadModel")
    ids, mask = padded_batch(side="left")
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    reference = explain(model, ids, mask, target=5).contributions.sum(-1)
    with pytest.raises(BcosValueError, match=r"additional_forward_args: the embeddings were embedded with an attention "
                                             r"mask that pads rows \[1, 2\].*Pass additional_forward_args="
                                             r"\(attention_mask,\)"):
        BcosAttribution(fwd).attribute(embeddings, target=5)
    with pytest.raises(BcosValueError, match=r"attention_mask: .*another mask than the one the embeddings"):
        BcosAttribution(fwd).attribute(embeddings, target=5, additional_forward_args=(torch.ones_like(mask),))
    with pytest.raises(BcosValueError, match=r"additional_forward_args: the embeddings were embedded"):
        fwd(embeddings)  # Captum's own methods call the wrapper with the embeddings as given
    with pytest.raises(BcosValueError, match=r"additional_forward_args: the embeddings were embedded"):
        LayerBcos(fwd, layer=model.transformer.h[0], model=model).attribute(embeddings, target=5)
    attributions = BcosAttribution(fwd).attribute(embeddings, target=5, additional_forward_args=(mask,))
    torch.testing.assert_close(attributions.sum((1, 2)), reference, rtol=1e-5, atol=1e-6)
    # without padding no mask is needed (every position is real either way)
    full = torch.ones_like(mask[:1])
    alone = fwd.embed(ids[:1], full)
    torch.testing.assert_close(BcosAttribution(fwd).attribute(alone, target=5).sum(),
                               explain(model, ids[:1], full, target=5).contributions.sum(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------ Captum: additional_forward_args as a list or a dict


@pytest.mark.parametrize("form", ["list", "dict"])
def test_additional_forward_args_as_a_list_or_dict_names_captums_tuple_convention(form):
    """Captum unpacks a tuple of additional forward arguments and passes anything else whole as the first one:
    ``additional_forward_args=[mask]`` (or ``{"attention_mask": mask}``) reached the model as its attention mask and was
    refused with "attention_mask: expected shape (3, 9) ..., got <class 'list'>. Pass the mask the tokenizer
    returned" (BcosAttribution) or "expected a tensor, got list" (LayerBcos): a fix telling the caller to pass what
    they had passed. Now named as additional_forward_args with Captum's convention; the tuple runs as before."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
    from conftest import padded_batch, tiny_bcos_model

    from bcos_plugins.errors import BcosTypeError

    model = tiny_bcos_model("BertForSequenceClassification")
    ids, mask = padded_batch()
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    given = [mask] if form == "list" else {"attention_mask": mask}
    expected = rf"additional_forward_args: got a {form}.*Captum unpacks a tuple.*additional_forward_args=\(attention_mask,\)"
    with pytest.raises(BcosTypeError, match=expected):
        BcosAttribution(fwd).attribute(embeddings, target=1, additional_forward_args=given)
    with pytest.raises(BcosTypeError, match=expected):
        LayerBcos(model).attribute(ids, target=1, additional_forward_args=given)
    torch.testing.assert_close(BcosAttribution(fwd).attribute(embeddings, target=1, additional_forward_args=(mask,)),
                               BcosAttribution(fwd).attribute(embeddings, target=1, additional_forward_args=mask))


# ------------------------------------------------ Captum: LayerBcos asked for the token ids going into a layer


@pytest.mark.parametrize(("class_name", "embedding"), [
    ("LlamaForCausalLM", None),  # the attribution point is the token embedding's output
    ("GPT2LMHeadModel", lambda m: m.transformer.wte),
])
def test_layer_bcos_at_the_input_of_an_embedding_names_the_token_ids(class_name, embedding):
    """``LayerBcos(model).attribute(ids, ..., attribute_to_layer_input=True)`` where the layer's input is token ids (a
    Llama's default point is its token embedding's output; GPT-2's ``wte`` named by hand) failed inside autograd with
    "RuntimeError: One of the differentiated Tensors does not require grad", naming neither the argument nor that ids
    have no gradient. The output side is attributed as before."""
    from bcos_plugins.adapters.captum import LayerBcos
    from conftest import padded_batch, tiny_bcos_model

    from bcos_plugins import explain
    from bcos_plugins.errors import BcosValueError

    model = tiny_bcos_model(class_name)
    ids, mask = padded_batch(side="left")
    layer = embedding(model) if embedding else None
    with pytest.raises(BcosValueError, match=r"attribute_to_layer_input: the input of .*Embedding.* is token ids "
                                             r"\(torch.int64\), which have no gradient.*attribute_to_layer_input=False"):
        LayerBcos(model, layer=layer).attribute(ids, target=1, additional_forward_args=(mask,),
                                                attribute_to_layer_input=True)
    attributions = LayerBcos(model, layer=layer).attribute(ids, target=1, additional_forward_args=(mask,),
                                                           attribute_to_layer_input=False)
    if embedding is None:  # the attribution point: complete
        torch.testing.assert_close(attributions.sum(-1), explain(model, ids, mask, target=1).contributions,
                                   rtol=1e-5, atol=1e-6)
