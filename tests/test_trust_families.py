"""Unusual but plausible inputs on the architecture families added last (Mistral, Qwen2, Qwen3, Gemma 2 and
ModernBERT), against the silently wrong answer: every explanation is complete, equals the model's own forward output
at the explained position, and a row's explanation does not depend on the batch it is in (padding side, a row of one
real token, length-1 inputs); positions at the edges, explicit ``position_ids``, sliding / local attention windows
shorter than the input, float16 / bfloat16 models, keywords that would change what the model computes, Captum and the
TransformerLens bridge. Tiny random models from the conformance suite's configs (2 layers, d_model 32).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import VOCAB, padded_rows
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_conformance import _stock, _word_tokenizer

from bcos_plugins import bcosify, explain, explain_dataset
from bcos_plugins.attribution import real_token_positions
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

RTOL = 1e-4
FAMILIES = ("Mistral", "Qwen2", "Qwen3", "Gemma2", "ModernBert")
NAMES = [n for n in sorted(SPECS) if n.startswith(FAMILIES)]
POSITIONED = [n for n in NAMES if not SPECS[n].is_classifier]  # causal LMs and base models: position= applies
DECODERS = [n for n in NAMES if SPECS[n].kind == "decoder"]
FEW = settings(max_examples=6, deadline=None, derandomize=True)

_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def _bcos(name: str, **config_overrides) -> torch.nn.Module:
    """The B-cos model of ``name`` from its family's conformance config (with overrides), built once; random
    non-zero biases in the stock model so that a bias lost or kept shows."""
    key = (name, repr(sorted(config_overrides.items())))
    if key not in _MODELS:
        _MODELS[key] = bcosify(_stock(name, **config_overrides), b=1.25, verbose=False)
    return _MODELS[key]


def _own_outputs(model, ids, mask, **forward_kwargs):
    """The model's own (not explaining) forward: class logits, else per-position logits / hidden states. Decoders get
    position ids counted over real tokens unless given, as generate() and explain() do."""
    spec = SPECS[model.config.bcos["architecture"]]
    if spec.kind == "decoder" and "position_ids" not in forward_kwargs:
        forward_kwargs["position_ids"] = real_token_positions(mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **forward_kwargs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _assert_complete(expl):
    assert torch.isfinite(expl.input_contributions).all()
    delta = expl.delta.abs()
    assert (delta <= RTOL * expl.explained.abs().clamp_min(1e-2)).all(), (delta.tolist(), expl.explained.tolist())


# ------------------------------------------------------------------ keywords that change what the model computes


@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "Qwen3ForCausalLM"])
def test_keywords_that_slice_the_logits_or_continue_a_cache_are_refused(name):
    """logits_to_keep=k keeps the last k columns' logits, so the logits at the explained position were read from
    another column (position 0 of a 2-token input explained column 1's logit, complete and wrong); a cache's keys and
    values are constants whose share was missing, with the positions restarting at 0 after them."""
    model = _bcos(name)
    ids = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosValueError, match=r"^logits_to_keep: .*another column \(got 1\)\. Leave it out"):
        explain(model, ids[:, :2], target=5, position=0, logits_to_keep=1)
    explained = explain(model, ids, target=5, logits_to_keep=0).explained  # 0 keeps every column: accepted
    torch.testing.assert_close(explained, _own_outputs(model, ids, torch.ones_like(ids))[:, -1, 5])
    with torch.no_grad():
        out = model(input_ids=ids[:, :3], use_cache=True)
    with pytest.raises(BcosValueError, match=r"^cache: holds keys and values of earlier tokens.*without a cache"):
        explain(model, ids[:, 3:], target=5, cache=getattr(out, "cache", None) or out.past_key_values)


# ------------------------------------------------------------------ ModernBERT's [CLS] pooling and left padding


def test_modernbert_cls_pooling_refuses_left_padding_and_is_batch_invariant_right_padded():
    """ModernBertForSequenceClassification with classifier_pooling="cls" (transformers' default) classifies from the
    first column's hidden state: a padding token's on a left-padded row. That row's explanation was complete on the
    model's own logit but of another function than the row's (-1.18 batched against 0.28 alone on this model, the
    padding token carrying -1.32), so left padding is refused by every text path; right padding is exact and the
    same as the row alone."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    model = _bcos("ModernBertForSequenceClassification", classifier_pooling="cls")
    ids, mask = padded_rows([8, 5, 1], 8, "left", seed=4)
    message = (r"^attention_mask: rows \[1, 2\] start with padding, and ModernBertForSequenceClassification with "
               r"config\.classifier_pooling='cls' classifies from the first column.*padding_side = 'right'")
    with pytest.raises(BcosValueError, match=message):
        explain(model, ids, mask, target=1)
    with pytest.raises(BcosValueError, match=message):
        EmbeddingForward(model).embed(ids, mask)
    with pytest.raises(BcosValueError, match=message):
        LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
    ids, mask = padded_rows([8, 5, 1], 8, "right", seed=4)
    batched = explain(model, ids, mask, target=1)
    _assert_complete(batched)
    torch.testing.assert_close(batched.explained, _own_outputs(model, ids, mask)[:, 1])
    for row, n in enumerate([8, 5, 1]):
        alone = explain(model, ids[row:row + 1, :n], target=1)
        torch.testing.assert_close(alone.explained, batched.explained[row:row + 1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(alone.contributions[0], batched.contributions[row, :n], rtol=1e-4, atol=1e-6)
    # mean pooling (the conformance config) reads every real token: left padding is exact there
    left_ids, left_mask = padded_rows([8, 5, 1], 8, "left", seed=4)
    _assert_complete(explain(_bcos("ModernBertForSequenceClassification"), left_ids, left_mask, target=1))


# ------------------------------------------------------------------ a row's explanation is the row's, in any batch


@st.composite
def _batches(draw):
    """Rows of 1 to 12 real tokens (a row of one real token often), padded to the longest row plus 0-2 columns on
    one side, and a negative position (or the default) that is real in every row."""
    lengths = draw(st.lists(st.integers(1, 12) | st.just(1), min_size=1, max_size=3))
    width = max(lengths) + draw(st.integers(0, 2))
    side = draw(st.sampled_from(["left", "right"]))
    back = draw(st.none() | st.integers(1, min(lengths)))
    return lengths, width, side, None if back is None else -back, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("name", NAMES)
@FEW
@given(batch=_batches(), edge=st.sampled_from([0, 1, -1]), with_foil=st.booleans())
def test_a_rows_explanation_is_complete_its_models_output_and_the_same_alone(name, batch, edge, with_foil):
    """``edge``: the target is the first, second or last output (class, token id or hidden unit); the foil the
    next one round."""
    lengths, width, side, position, seed = batch
    model, spec = _bcos(name), SPECS[name]
    ids, mask = padded_rows(lengths, width, side, seed)
    rows = torch.arange(len(lengths))
    n_outputs = _own_outputs(model, ids[:1, :1], torch.ones_like(mask[:1, :1])).shape[-1]
    target, foil = edge % n_outputs, (edge + 1) % n_outputs
    asked = {"target": target, "foil": foil if with_foil else None}
    if not spec.is_classifier:
        asked["position"] = position
    expl = explain(model, ids, mask, **asked)
    _assert_complete(expl)
    out = _own_outputs(model, ids, mask)
    if not spec.is_classifier:
        default = width - 1 - mask.flip(1).argmax(1) if spec.kind == "decoder" else mask.argmax(1)
        column = default if position is None else width - mask.flip(1).argmax(1) + position
        assert torch.equal(expl.position, column)
        out = out[rows, column]
    expected = out[rows, target] - (out[rows, foil] if with_foil else 0)
    torch.testing.assert_close(expl.explained, expected, rtol=1e-5, atol=1e-6)
    assert (expl.input_contributions[mask == 0] == 0).all()  # padding has no share
    for row in range(len(lengths)):
        real = mask[row].bool()
        alone = explain(model, ids[row:row + 1, real], **asked)
        torch.testing.assert_close(alone.explained, expl.explained[row:row + 1], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(alone.contributions[0], expl.contributions[row, real], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", POSITIONED)
@FEW
@given(lengths=st.lists(st.integers(1, 8), min_size=1, max_size=3), side=st.sampled_from(["left", "right"]),
       position=st.integers(-3, 2) | st.integers(-10, 9))
def test_a_position_is_the_column_it_names_or_is_refused(name, lengths, side, position):
    """Non-negative positions are columns, negative ones count back from each row's last real token; a padding or
    outside column is refused (computed here from the mask, independently of the package's parser)."""
    width = max(lengths)
    model = _bcos(name)
    ids, mask = padded_rows(lengths, width, side, seed=len(lengths))
    last = width - 1 - mask.flip(1).argmax(1)
    column = torch.full_like(last, position) if position >= 0 else last + 1 + position
    inside = (column >= 0) & (column < width)
    if not inside.all() or not mask[torch.arange(len(lengths)), column.clamp(0, width - 1)].bool().all():
        event("refused")
        with pytest.raises(BcosValueError, match=r"^position: "):
            explain(model, ids, mask, target=4, position=position)
        return
    event("explained")
    expl = explain(model, ids, mask, target=4, position=position)
    _assert_complete(expl)
    torch.testing.assert_close(expl.explained, _own_outputs(model, ids, mask)[torch.arange(len(lengths)), column, 4])


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].head != "base"])
def test_length_one_inputs_are_explained_exactly(name):
    model, spec = _bcos(name), SPECS[name]
    ids = torch.tensor([[7], [11]])
    asked = {} if spec.is_classifier else {"target": 3, "foil": 9}
    expl = explain(model, ids, **asked)
    _assert_complete(expl)
    out = _own_outputs(model, ids, torch.ones_like(ids))
    expected = out[torch.arange(2), expl.target] if spec.is_classifier else out[:, 0, 3] - out[:, 0, 9]
    torch.testing.assert_close(expl.explained, expected)


@pytest.mark.parametrize("name", POSITIONED)
@FEW
@given(steps=st.lists(st.integers(1, 4), min_size=6, max_size=6), offset=st.integers(0, 20))
def test_explicit_position_ids_are_the_ones_explained(name, steps, offset):
    """position_ids given by the caller (gaps between them change the rotary angles' differences, so the output) are
    used as given, not replaced by the real-token count explain uses by default."""
    model = _bcos(name)
    ids, mask = padded_rows([6, 4], 6, "right", seed=3)
    position_ids = (torch.tensor(steps).cumsum(0) + offset - 1).expand(2, 6).clone()
    expl = explain(model, ids, mask, target=2, position=-1, position_ids=position_ids)
    _assert_complete(expl)
    out = _own_outputs(model, ids, mask, position_ids=position_ids)[torch.arange(2), expl.position, 2]
    torch.testing.assert_close(expl.explained, out)
    if steps != [1] * 6:  # the test has power: these positions give another output than the default ones
        assert not torch.allclose(out, _own_outputs(model, ids, mask)[torch.arange(2), expl.position, 2],
                                  rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_token_type_ids_are_refused_by_models_without_them(name):
    """A BERT-style tokenizer's token_type_ids passed on to a model that has none were dropped by transformers
    without a word: refused, naming them."""
    ids = torch.tensor([[5, 6, 7]])
    asked = {} if SPECS[name].is_classifier else {"target": 1}
    with pytest.raises(BcosTypeError, match=r"^token_type_ids: is not an argument of"):
        explain(_bcos(name), ids, token_type_ids=torch.zeros_like(ids), **asked)


# ------------------------------------------------------------------ attention windows shorter than the input

# every layer windowed (the conformance configs alternate global and windowed layers in Gemma 2 and ModernBERT,
# which let every token reach every other); per layer, how many tokens back (and, bidirectional, ahead) one reaches
WINDOWED = {
    "MistralForCausalLM": ({}, 3),  # sliding_window=4: the query and the 3 tokens before it
    "Gemma2ForCausalLM": ({"layer_types": ["sliding_attention"] * 2}, 3),
    "Qwen2ForCausalLM": ({"use_sliding_window": True, "sliding_window": 4,
                          "layer_types": ["sliding_attention"] * 2}, 3),
    "ModernBertModel": ({"layer_types": ["sliding_attention"] * 2}, 2),  # local_attention=4: 2 either side
}


@pytest.mark.parametrize("name", sorted(WINDOWED))
@pytest.mark.parametrize("side", ["left", "right"])
def test_tokens_beyond_the_windows_reach_have_exactly_no_share(name, side):
    """With every layer windowed, a token farther than 2 layers x the window's reach from the explained position has
    exactly no share, and the farthest token within reach has one: the window is applied in explanation mode, on
    padded rows too, and is not narrower than the model's."""
    overrides, reach = WINDOWED[name]
    model = _bcos(name, **overrides)
    ids, mask = padded_rows([14, 11], 14, side, seed=5)
    # a real token of both rows (0-13 and 0-10 or 3-13) with real tokens out of reach before it (and after it)
    position = {("decoder", "right"): 9, ("decoder", "left"): 12, ("encoder", "right"): 5,
                ("encoder", "left"): 8}[SPECS[name].kind, side]
    expl = explain(model, ids, mask, target=3, position=position)
    _assert_complete(expl)
    torch.testing.assert_close(expl.explained, _own_outputs(model, ids, mask)[torch.arange(2), position, 3])
    ahead = 2 * reach if SPECS[name].kind == "encoder" else 0
    columns = torch.arange(14)
    beyond = (columns < position - 2 * reach) | (columns > position + ahead)
    assert (expl.contributions[:, beyond] == 0).all()
    first = position - 2 * reach
    assert (expl.contributions[:, first] != 0).all() and (expl.contributions[:, position + ahead] != 0).all()


# ------------------------------------------------------------------ float16 / bfloat16 models


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "Qwen3ForCausalLM", "ModernBertForSequenceClassification",
                                  "MistralForSequenceClassification"])
def test_a_half_precision_model_explains_its_own_output_close_to_float32(name, dtype):
    """Cast to float16 / bfloat16 (Gemma's norms compute in float32 and cast back): the explained value is the half
    model's own output, the contributions are in its dtype and within its rounding of the float32 model's (measured
    here: 0.003 of the largest score in float16, 0.04 in bfloat16)."""
    spec = SPECS[name]
    full = _bcos(name)
    half = copy.deepcopy(full).to(dtype)
    ids, mask = padded_rows([10, 6, 1], 10, "left" if spec.kind == "decoder" else "right", seed=5)
    asked = {"target": 1} if spec.is_classifier else {"target": 5, "foil": 7}
    expl = explain(half, ids, mask, **asked)
    assert expl.input_contributions.dtype == dtype
    out = _own_outputs(half, ids, mask)
    rows = torch.arange(3)
    if not spec.is_classifier:
        out = out[rows, -1]
    expected = out[rows, 1] if spec.is_classifier else out[rows, 5] - out[rows, 7]
    torch.testing.assert_close(expl.explained, expected, rtol=0, atol=0)
    reference = explain(full, ids, mask, **asked)
    allowed = 0.01 if dtype == torch.float16 else 0.1
    assert _relative(expl.contributions.float(), reference.contributions) <= allowed
    assert _relative(expl.explained.float(), reference.explained) <= allowed


def _relative(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


# ------------------------------------------------------------------ Captum and the TransformerLens bridge


def test_captum_equals_explain_at_per_row_negative_positions_on_a_left_padded_batch():
    """Captum's BcosAttribution (through EmbeddingForward) and LayerBcos on Mistral (sliding window 4 < the input)
    with a row of one real token and per-row negative positions: explain's contributions, complete."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos

    model = _bcos("MistralForCausalLM")
    ids, mask = padded_rows([10, 6, 1], 10, "left", seed=6)
    target, position = torch.tensor([2, 0, 1]), torch.tensor([-2, -6, -1])
    reference = explain(model, ids, mask, target=target, position=position)
    _assert_complete(reference)
    forward = EmbeddingForward(model)
    attr, delta = BcosAttribution(forward).attribute(forward.embed(ids, mask), target=target,
                                                     additional_forward_args=(mask, position),
                                                     return_convergence_delta=True)
    torch.testing.assert_close(attr, reference.input_contributions, rtol=1e-5, atol=1e-7)
    assert (delta.abs() <= RTOL * reference.explained.abs()).all()
    layer_attr, layer_delta = LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask, position),
                                                         return_convergence_delta=True)
    torch.testing.assert_close(layer_attr, reference.input_contributions, rtol=1e-5, atol=1e-7)
    assert (layer_delta.abs() <= RTOL * reference.explained.abs()).all()


@pytest.mark.parametrize("name", ["MistralForCausalLM", "Gemma2ForCausalLM"])
def test_the_bridge_explains_padded_rows_as_explain_does_and_as_alone(name):
    """transformer_bridge_from_hf + explain_logits on left- and right-padded batches (windows shorter than the
    input, a row of one real token): complete, equal to explain on the transformers model and to each row alone."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    model = _bcos(name)
    bridge = transformer_bridge_from_hf(model)
    for side in ("left", "right"):
        ids, mask = padded_rows([10, 6, 1], 10, side, seed=7)
        expl = explain_logits(bridge, ids, target=5, attention_mask=mask)
        assert expl.completeness_error.max() <= RTOL
        reference = explain(model, ids, mask, target=5)
        torch.testing.assert_close(expl.explained, reference.explained, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(expl.contributions, reference.contributions, rtol=1e-4, atol=1e-6)
        for row in range(3):
            real = mask[row].bool()
            alone = explain_logits(bridge, ids[row:row + 1, real], target=5)
            torch.testing.assert_close(alone.contributions[0], expl.contributions[row, real], rtol=1e-4, atol=1e-6)


DECODER_CLASSIFIERS = [n for n in DECODERS if SPECS[n].is_classifier]


@pytest.mark.parametrize("name", DECODER_CLASSIFIERS)
def test_embedding_forward_refuses_real_tokens_with_the_pad_id_of_a_decoder_classifier(name):
    """A decoder classifier classifies from each row's last token whose id is not config.pad_token_id, so a real
    end-of-sequence token that is also the pad id (tokenizer.pad_token = tokenizer.eos_token) is skipped. Given
    embeddings alone, EmbeddingForward cannot see that: it classified from the last real token, another logit than
    the model's, explain's and LayerBcos's (0.19 against 0.13 on the tiny Qwen2, complete and silent). embed() refuses
    such ids, naming LayerBcos and explain, which read the ids and agree with the model."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    model = _bcos(name)
    pad = model.config.pad_token_id
    ids, mask = padded_rows([6, 4], 6, "left", seed=12)
    ids[:, -1] = pad  # a real last token with the pad id
    with pytest.raises(BcosValueError, match=r"^input_ids: rows \[0, 1\] hold config\.pad_token_id .* LayerBcos"):
        EmbeddingForward(model).embed(ids, mask)
    expected = _own_outputs(model, ids, mask)[:, 1]
    torch.testing.assert_close(explain(model, ids, mask, target=1).explained, expected)
    layer_attr = LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
    torch.testing.assert_close(layer_attr.sum((1, 2)), expected, rtol=1e-4, atol=1e-6)
    ids[:, -1] = 7  # no real token with the pad id: EmbeddingForward computes the model's logits
    forward = EmbeddingForward(model)
    with torch.no_grad():
        torch.testing.assert_close(forward(forward.embed(ids, mask), mask), _own_outputs(model, ids, mask))


# ------------------------------------------------------------------ explain_dataset batches the texts itself


@pytest.mark.parametrize("name", ["Qwen2ForCausalLM", "MistralModel"])
def test_explain_datasets_position_is_a_token_of_each_text_whatever_its_batch(name):
    """explain_dataset pads each batch itself, so a non-negative position cannot be a column of a batch the caller
    never sees: with a left-padding tokenizer, position=4 was column 4, i.e. token 3 of a text one token shorter than
    its batch's longest and token 4 alone (0.052 against 0.032 on the tiny Qwen2, complete and silent). It is token 4
    of every text, whatever the padding side and the batch size; negative positions count from the last token."""
    model = _bcos(name)
    texts = ["w5 w7 w9 w3 w6", "w4 w8 w10 w11 w12 w13", "w20 w21 w22 w23 w24 w25 w26 w27"]
    tokenizer = _word_tokenizer()
    for position in (4, 0, -2):
        alone = [explain(model, tokenizer(text, return_tensors="pt")["input_ids"], target=5,
                         position=position).explained.item() for text in texts]
        for side in ("left", "right"):
            tokenizer.padding_side = side
            for batch_size in (1, 3):
                out = explain_dataset(model, tokenizer, texts, target=5, position=position, batch_size=batch_size,
                                      progress=False)
                torch.testing.assert_close(torch.tensor(out["explained"]), torch.tensor(alone), rtol=1e-5, atol=1e-6)


def test_inseq_attributes_a_prompt_in_a_batch_as_alone():
    """inseq's load_model(m, "bcos") on Gemma 2 (its forward is the package's, the soft-cap in the LM head): a prompt
    generated and attributed in a left-padded batch gets the tokens, logits and attributions it gets alone."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq

    attribution_model = inseq.load_model(_bcos("Gemma2ForCausalLM"), "bcos", tokenizer=_word_tokenizer())
    prompts = ["w5 w9 w11 w4", "w7"]
    generation = {"max_new_tokens": 3, "do_sample": False}
    both = attribution_model.attribute(prompts, generation_args=generation, step_scores=["logit"],
                                       show_progress=False)
    for row, prompt in enumerate(prompts):
        alone = attribution_model.attribute([prompt], generation_args=generation, step_scores=["logit"],
                                            show_progress=False).sequence_attributions[0]
        batched = both.sequence_attributions[row]
        assert [t.id for t in batched.target] == [t.id for t in alone.target]
        torch.testing.assert_close(batched.step_scores["logit"], alone.step_scores["logit"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched.target_attributions.nan_to_num(), alone.target_attributions.nan_to_num(),
                                   rtol=1e-4, atol=1e-6)
