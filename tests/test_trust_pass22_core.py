"""Trust pass 22, the explanation core (``explain``, the attribution package, ``predict`` / ``accuracy``): unusual
inputs on every registry family, each checked against an independent computation (the row alone, the model's own
forward, float64). The cases that were silently wrong or crashed unhelpfully, one test each (the tally is in the
CHANGELOG and the session's report).

- A row with padding between its real tokens (a 0 of the mask inside the row) on a model with a sliding attention
  window (Mistral, Gemma 2, ModernBERT's local layers): the window counts columns, the padding ones included, while
  the position ids count real tokens, so the row was computed as neither alone nor with the padding as tokens
  (complete, and 0.46 against 0.53 alone). Refused now, naming the rows; models without a window still explain such a
  row as the row alone.
- ``Direction([...])`` read a list of Python floats as float32 (``torch.as_tensor``), where every other entry point
  reads them at float64 since pass 21: a float64 model explained ``outputs @ float32(vector)``, 7e-7 of the value off.
- A ``Direction`` vector with entries beyond the model's dtype (a float64 vector of 1e300 on a float32 model, 1e5 on a
  float16 one) became inf inside ``explain``, and the refusal blamed the model's inputs and embedding rows.
- ``TokenExplanation.to(torch.float64)`` cast the token ids, mask, positions and targets to float64 (``tokens()``
  then looked up float ids); a dtype now casts the floating-point tensors only, as ``nn.Module.to`` does.
- ``accuracy`` returned a float32 mean: 0.6666666865 for 4 of 6 texts, a number no count gives.
- A ``"dynamic"`` rotary embedding keeps the frequencies an earlier, longer call grew (transformers' generation cache):
  a row explained after a longer row got the longer row's frequencies (0.09351 against 0.09338 fresh). Every call
  through ``model_call_kwargs`` puts the original frequencies back first.
- The attribution package's public helpers: ``last_real_position`` / ``resolve_positions`` read a mask entry of 2 as
  the last real token wherever it stood and a ``default`` other than "last" as "first"; ``relative_completeness_error``
  broadcast a ``(1,)`` delta to every row; ``select_explained`` failed on an int target, a 1-d mask with "Dimension out
  of range", ``model_call_kwargs`` without a spec with "'NoneType' object has no attribute"; an empty target was
  refused as "a float".
"""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
from conftest import VOCAB, padded_rows
from test_conformance import _stock, _word_tokenizer

from bcos_plugins import Direction, bcosify, explain
from bcos_plugins.attribution.text import real_token_position_ids
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

_MODELS: dict[str, torch.nn.Module] = {}


def _bcos(name: str) -> torch.nn.Module:
    """The B-cos model of ``name`` from its family's conformance config (built once; tests copy it to change it)."""
    if name not in _MODELS:
        _MODELS[name] = bcosify(_stock(name), b=1.25, verbose=False)
    return _MODELS[name]


def _alone(model, row_ids: torch.Tensor) -> torch.Tensor:
    """The model's own outputs for one row without padding: class logits ``(classes,)``, else per position
    ``(pos, n)``."""
    with torch.no_grad():
        out = model(input_ids=row_ids[None])
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state)[0]


# ------------------------------------------------------------------ padding between real tokens and a sliding window

WINDOWED = ["MistralForCausalLM", "MistralModel", "Gemma2ForSequenceClassification", "Gemma2ForCausalLM",
            "ModernBertForSequenceClassification"]


def _inner_padding_batch():
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 3:5] = 0  # row 1: 3 real tokens, 2 padding, 4 real tokens
    return ids, mask


@pytest.mark.parametrize("name", WINDOWED)
def test_padding_between_real_tokens_is_refused_where_a_sliding_window_counts_it(name):
    """The window is counted in columns, the positions in real tokens: row 1 was explained (complete) as neither the
    row alone nor the row with its padding as tokens (MistralForSequenceClassification 0.46 against 0.53 alone)."""
    model = _bcos(name)
    ids, mask = _inner_padding_batch()
    position = {} if SPECS[name].is_classifier else {"position": -1}
    with pytest.raises(BcosValueError, match=r"^attention_mask: row \[1\] has padding between real tokens, and "
                                             rf"{name} attends within a sliding window of config\.sliding_window="
                                             r"\d+ columns.*Pass each row's real tokens next to each other"):
        explain(model, ids, mask, target=1, **position)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Qwen3ForSequenceClassification", "BertModel"])
def test_padding_between_real_tokens_of_a_model_without_a_window_is_the_row_alone(name):
    model = _bcos(name)
    ids, mask = _inner_padding_batch()
    spec = SPECS[name]
    explanation = explain(model, ids, mask, target=1, **({} if spec.is_classifier else {"position": -1}))
    row = ids[1][mask[1].bool()]
    alone = _alone(model, row)
    expected = alone[1] if spec.is_classifier else alone[-1, 1]
    torch.testing.assert_close(explanation.explained[1], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(explanation.total, explanation.explained, rtol=1e-4, atol=1e-6)


def test_padding_between_real_tokens_within_the_windows_width_is_explained_as_the_row_alone():
    """Real tokens spanning no more columns than the window are all inside it either way: not refused."""
    model = _bcos("MistralForCausalLM")  # sliding_window=4
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 1] = 0
    mask[1, 4:] = 0  # row 1: token, padding, two tokens (4 columns)
    explanation = explain(model, ids, mask, target=1, position=torch.tensor([8, 3]))
    torch.testing.assert_close(explanation.explained[1], _alone(model, ids[1][mask[1].bool()])[2, 1],
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ Direction: the package's reading of lists, dtypes


def test_a_direction_given_as_a_list_of_floats_is_read_at_float64_and_explained_so_by_a_float64_model():
    model = copy.deepcopy(_bcos("LlamaForCausalLM")).double()
    ids, mask = padded_rows([6, 4], 6, "right", seed=11)
    values = (torch.randn(VOCAB, generator=torch.Generator().manual_seed(0), dtype=torch.float64) / 3).tolist()
    direction = Direction(values)
    assert direction.vector.dtype == torch.float64
    explanation = explain(model, ids, mask, target=direction)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=real_token_position_ids(SPECS["LlamaForCausalLM"], model.config, mask)).logits
    expected = logits[torch.arange(2), mask.sum(1) - 1] @ torch.tensor(values, dtype=torch.float64)
    # was 7e-7 of the value off (the vector rounded to float32)
    torch.testing.assert_close(explanation.explained, expected, rtol=1e-12, atol=0)
    with pytest.raises(BcosValueError, match=r"^Direction\(vector\): vector must have shape"):
        Direction([[[0.5]]])


@pytest.mark.parametrize(("dtype", "vector_dtype", "huge"), [(torch.float32, torch.float64, 1e300),
                                                              (torch.float16, torch.float32, 1e5)])
@pytest.mark.parametrize("role", ["target", "foil"])
def test_a_direction_beyond_the_models_dtype_is_refused_naming_it_not_the_models_inputs(dtype, vector_dtype, huge,
                                                                                         role):
    model = copy.deepcopy(_bcos("LlamaForCausalLM")).to(dtype)
    ids, mask = padded_rows([6, 4], 6, "right", seed=11)
    vector = torch.zeros(VOCAB, dtype=vector_dtype)
    vector[5] = huge
    given = {"target": Direction(vector)} if role == "target" else {"target": 1, "foil": Direction(vector)}
    with pytest.raises(BcosValueError, match=rf"^{role}: holds {re.escape(f'{huge:.3g}')} in row \[5\], beyond the range of {dtype}"):
        explain(model, ids, mask, **given)
    vector[5] = 2.0  # a wider vector within range is explained
    given = {"target": Direction(vector)} if role == "target" else {"target": 1, "foil": Direction(vector)}
    explanation = explain(model, ids, mask, **given)
    assert torch.isfinite(explanation.explained).all()


# ------------------------------------------------------------------ the result object


def test_explanation_to_a_dtype_casts_the_numbers_and_keeps_the_ids_integers():
    model = _bcos("LlamaForCausalLM")
    ids, mask = padded_rows([6, 3, 5], 6, "left", seed=5)
    tokenizer = _word_tokenizer()
    explanation = explain(model, ids, mask, target=Direction(torch.randn(VOCAB)))
    for cast in (explanation.to(torch.float64), explanation.to("cpu", torch.float64),
                 explanation.to(dtype=torch.float64)):
        assert cast.contributions.dtype == cast.input_contributions.dtype == cast.explained.dtype == torch.float64
        assert cast.target.vector.dtype == torch.float64
        # were float64 (tokens() then looked up float ids)
        assert cast.input_ids.dtype == cast.attention_mask.dtype == cast.position.dtype == torch.long
        torch.testing.assert_close(cast.explained, explanation.explained.double(), rtol=0, atol=0)
        assert cast.tokens(tokenizer) == explanation.tokens(tokenizer)
    ids_explanation = explain(model, ids, mask, target=2)
    assert ids_explanation.to(torch.bfloat16).target.dtype == torch.long
    moved = ids_explanation.to("cpu")
    assert moved.explained.dtype == torch.float32 and torch.equal(moved.input_ids, ids)
    with pytest.raises(BcosValueError, match=r"^dtype: is torch\.int64; .*Pass a floating-point dtype"):
        explanation.to(torch.int64)
    with pytest.raises(BcosValueError, match=r"^device: is the dtype torch\.float64 and dtype= is"):
        explanation.to(torch.float64, torch.float32)


# ------------------------------------------------------------------ predict / accuracy


def test_accuracy_is_the_count_of_correct_texts_over_their_number():
    from bcos_plugins.train import accuracy, predict

    model = _bcos("LlamaForSequenceClassification")
    tokenizer = _word_tokenizer()
    texts = [" ".join(f"w{3 + (i * 7 + j) % 50}" for j in range(n)) for i, n in enumerate([12, 1, 7, 3, 15, 2])]
    predicted = predict(model, tokenizer, texts).argmax(-1).tolist()
    labels = [p if i < 4 else (p + 1) % 3 for i, p in enumerate(predicted)]  # 4 of 6 right
    assert accuracy(model, tokenizer, texts, labels) == 4 / 6  # was 0.6666666865348816


# ------------------------------------------------------------------ a dynamic rotary embedding grown by an earlier call


def _dynamic_rope_llama(name: str) -> torch.nn.Module:
    import transformers as T

    from bcos_plugins.convert.architectures import stock_class

    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=8, num_labels=3,
                           pad_token_id=0, bos_token_id=2, eos_token_id=2,
                           rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(0)
    return bcosify(stock_class(name)(config).eval(), b=1.25, verbose=False)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "LlamaForSequenceClassification"])
def test_a_row_is_explained_with_its_own_lengths_rotary_frequencies_whatever_was_explained_before(name):
    """transformers keeps a "dynamic" rotary embedding's frequencies grown to the longest call until a call shorter
    than max_position_embeddings comes: a 15-token row explained after a 20-token one got the 20-token frequencies
    (0.09351 against 0.09338 on the fresh model), silently."""
    model = _dynamic_rope_llama(name)
    fresh = copy.deepcopy(model)
    row = torch.randint(3, VOCAB, (1, 15), generator=torch.Generator().manual_seed(2))
    longer = torch.randint(3, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
    expected = explain(fresh, row, target=1).explained
    with torch.no_grad():
        torch.testing.assert_close(expected, (fresh(row).logits[:, -1] if name.endswith("CausalLM")
                                              else fresh(row).logits)[:, 1], rtol=1e-5, atol=1e-6)
    explain(model, longer, target=1)
    torch.testing.assert_close(explain(model, row, target=1).explained, expected, rtol=0, atol=0)
    with torch.no_grad():
        model(longer)  # the model's own call grows them too
    torch.testing.assert_close(explain(model, row, target=1).explained, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ the attribution package's public helpers


def test_last_real_position_and_resolve_positions_refuse_a_mask_that_is_not_0_1_or_not_2d_naming_it():
    from bcos_plugins.attribution import last_real_position, resolve_positions

    counts = torch.tensor([[2, 1, 0]])  # a 2 was read as the last real token wherever it stood: position 0, silently
    for call in (lambda: last_real_position(counts), lambda: resolve_positions(-1, counts),
                 lambda: resolve_positions(None, counts)):
        with pytest.raises(BcosValueError, match=r"^attention_mask: must be a 0/1 mask, got values \[0, 1, 2\]"):
            call()
    with pytest.raises(BcosValueError, match=r"^attention_mask: must be a \(batch, pos\) tensor of 0s and 1s, got "
                                             r"shape \(3,\).*mask\[None\]"):
        last_real_position(torch.tensor([1, 1, 0]))  # failed with torch's "Dimension out of range"
    with pytest.raises(BcosTypeError, match=r"^attention_mask: must be a \(batch, pos\) tensor.*got a list"):
        resolve_positions(-1, [[1, 1, 0]])
    with pytest.raises(BcosValueError, match=r"^default: must be 'last' or 'first', got 'Last'"):
        resolve_positions(None, torch.tensor([[0, 1, 1]]), default="Last")  # was read as "first", silently
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    for form in (mask, mask.bool(), mask.float()):
        assert last_real_position(form).tolist() == [2, 1]
        assert resolve_positions(None, form).tolist() == [2, 1]
        assert resolve_positions(None, form, default="first").tolist() == [1, 0]
        assert resolve_positions(-2, form).tolist() == [1, 0]


def test_select_explained_and_relative_completeness_error_take_their_documented_forms_or_name_the_argument():
    from bcos_plugins.attribution import relative_completeness_error, resolve_explained, select_explained

    outputs = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    # an int or a list failed with "'int' object has no attribute 'to'"
    assert select_explained(outputs, 1).tolist() == outputs[:, 1].tolist()
    assert select_explained(outputs, [1, 3], foil=0).tolist() == (outputs[[0, 1], [1, 3]] - outputs[:, 0]).tolist()
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 4\)"):
        select_explained(outputs, [1, 9])
    with pytest.raises(BcosValueError, match=r"^outputs: must be a \(batch, n_outputs\) tensor, got shape \(4,\)"):
        select_explained(outputs[0], torch.tensor([1]))
    with pytest.raises(BcosValueError, match=r"^values: must be a \(batch, n_outputs\) tensor, got shape \(2, 1, 4\)"):
        resolve_explained(outputs[:, None], 1)
    # a (1,) delta against 3 explained values was broadcast: one row's delta read as every row's
    with pytest.raises(BcosValueError, match=r"^explained: has shape \(3,\) but delta has \(1,\)"):
        relative_completeness_error(torch.tensor([0.1]), torch.ones(3))
    error = relative_completeness_error([1e-9], [1.0 + 1e-9])  # lists: Python floats at float64, as everywhere
    assert error.dtype == torch.float64 and error.item() == pytest.approx(1e-9 / (1 + 1e-9), rel=1e-12)


def test_model_call_kwargs_names_a_missing_spec_and_takes_no_forward_keywords_as_none():
    from bcos_plugins.attribution import model_call_kwargs

    model = _bcos("LlamaForCausalLM")
    ids = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
    with pytest.raises(BcosTypeError, match=r"^spec: must be the model's ArchitectureSpec, got NoneType.*spec_for"):
        model_call_kwargs(model, None, ids, None, {})  # failed with "'NoneType' object has no attribute ..."
    call = model_call_kwargs(model, SPECS["LlamaForCausalLM"], ids, None, None)
    assert torch.equal(call["input_ids"], ids) and call["position_ids"].tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("empty", [[], (), torch.tensor([], dtype=torch.long), torch.tensor([])])
def test_an_empty_target_or_position_is_refused_as_empty_not_as_a_float(empty):
    model = _bcos("LlamaForCausalLM")
    ids, mask = padded_rows([6, 4], 6, "right", seed=11)
    for given in ({"target": empty}, {"target": 1, "foil": empty}, {"target": 1, "position": empty}):
        name = next(k for k, v in given.items() if v is empty)
        # [] was refused as "got a float (torch.float32)"; an empty integer tensor as "expected ... got shape (0,)"
        with pytest.raises(BcosValueError, match=rf"^{name}: is empty \(shape \(0,\)\), with no id for any row\. Pass"):
            explain(model, ids, mask, **given)


def test_predict_refuses_rows_a_dynamic_rotary_embedding_would_compute_with_another_length_naming_batch_size():
    """The refusal told predict's caller to "Explain rows of equal length together"; predict's fix is batch_size=1,
    which computes each text with its own length's frequencies (as the fresh model alone)."""
    from bcos_plugins.train import predict

    model = _dynamic_rope_llama("LlamaForSequenceClassification")
    fresh = copy.deepcopy(model)
    tokenizer = _word_tokenizer()
    texts = [" ".join(f"w{3 + j}" for j in range(n)) for n in (15, 12, 20)]
    with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[0, 1\] are shorter than the batch's longest row "
                                             r"\(20 tokens\).*\(predict: batch_size=1\)\.$"):
        predict(model, tokenizer, texts, max_length=32)
    logits = predict(model, tokenizer, texts, max_length=32, batch_size=1)
    for row, text in enumerate(texts):
        with torch.no_grad():
            alone = copy.deepcopy(fresh)(**tokenizer(text, return_tensors="pt")).logits[0]
        torch.testing.assert_close(logits[row], alone, rtol=1e-5, atol=1e-6)
