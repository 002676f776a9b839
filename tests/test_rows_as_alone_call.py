"""``rows_as_alone_call``: the one decision of how a text model is called on a padded batch (``explain``,
``perturbation_curves``, ``next_token_contrast``, ``predict``, ``predict_labels``, ``fine_tune_classifier``'s collator),
the one predicate of position ids counting real tokens, and the Space model's encoders outside the registry."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_model

from bcos_plugins.attribution.text import (
    check_first_column_is_real,
    gets_real_token_position_ids,
    position_ids_as_alone,
    rows_as_alone_call,
)
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics import next_token_contrast
from bcos_plugins.space import SpaceModelForSequenceClassification

VOCAB = 50


def _pad(rows: list[list[int]], side: str, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(map(len, rows))
    ids = torch.full((len(rows), length), pad_id)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        cols = slice(length - len(row), length) if side == "left" else slice(0, len(row))
        ids[i, cols], mask[i, cols] = torch.tensor(row), 1
    return ids, mask


def _contrast_alone(model, rows, target, foil) -> torch.Tensor:
    """target - foil logit at each row's last token, each row run alone by the model's own forward."""
    out = []
    with torch.no_grad():
        for row, t, f in zip(rows, target, foil, strict=True):
            logits = model(input_ids=torch.tensor([row])).logits[0, -1]
            out.append(logits[t] - logits[f])
    return torch.stack(out)


def test_a_roberta_causal_lm_outside_the_registry_is_not_given_positions_counted_from_0():
    """next_token_contrast gave every model outside the registry position ids counting from 0. RoBERTa's family counts
    its positions from pad_token_id + 1 (its table has a padding row), so every row, unpadded ones too, ran on other
    positions than the model's own (logit differences off). Now such a model is called as given: it counts its real
    tokens itself, so each row (padded with pad_token_id on either side) is computed as alone."""
    torch.manual_seed(0)
    config = T.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=24, is_decoder=True, pad_token_id=1)
    model = T.RobertaForCausalLM(config).eval()
    assert type(model).__name__ not in SPECS
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    target, foil = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    expected = _contrast_alone(model, rows, target, foil)
    for side in ("left", "right"):
        ids, mask = _pad(rows, side, pad_id=1)
        got = next_token_contrast(model, ids, mask, target=target, foil=foil).logit_difference
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert "position_ids" not in rows_as_alone_call(model, *_pad(rows, "left", pad_id=1))


def test_a_learned_position_causal_lm_outside_the_registry_gets_ids_counting_real_tokens_as_generate_gives():
    """A causal LM outside the registry whose forward names position_ids (GPT-Neo: a learned table without a padding
    row) gets position ids counting real tokens, as generate gives them: a left-padded row is computed as alone. Without
    them its positions would count from the padded column (checked: the numbers differ)."""
    torch.manual_seed(0)
    config = T.GPTNeoConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, max_position_embeddings=24,
                            attention_types=[[["global"], 2]], intermediate_size=32, bos_token_id=2, eos_token_id=2)
    model = T.GPTNeoForCausalLM(config).eval()
    assert type(model).__name__ not in SPECS
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    target, foil = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    expected = _contrast_alone(model, rows, target, foil)
    ids, mask = _pad(rows, "left", pad_id=0)
    got = next_token_contrast(model, ids, mask, target=target, foil=foil).logit_difference
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    call = rows_as_alone_call(model, ids, mask)
    torch.testing.assert_close(call["position_ids"], torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 1, 2]]))
    with torch.no_grad():  # the shift the ids prevent is real on this model
        shifted = model(input_ids=ids, attention_mask=mask).logits[1, -1]
    assert not torch.allclose(shifted[target[1]] - shifted[foil[1]], expected[1], atol=1e-4)
    given = torch.zeros_like(ids)
    assert rows_as_alone_call(model, ids, mask, {"position_ids": given})["position_ids"] is given


def test_a_classifier_outside_the_registry_is_called_with_every_tokenizer_output_as_given():
    """Outside the registry the forward's reading is not second-guessed: every tokenizer output is passed, no position
    ids are added (not a causal LM); a registry model gets only the outputs its forward reads."""
    ids, mask = padded_batch(side="right")
    encoding = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "extra": 1}
    outside = T.ElectraForSequenceClassification(T.ElectraConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=24))
    call = rows_as_alone_call(outside, ids, mask, tokenizer_outputs=encoding)
    assert set(call) == {"input_ids", "attention_mask", "token_type_ids", "extra"}
    assert call["input_ids"] is ids and call["attention_mask"] is mask
    llama = tiny_model("LlamaForSequenceClassification")
    llama.config.pad_token_id = 0
    assert "token_type_ids" not in rows_as_alone_call(llama, ids, mask, tokenizer_outputs=encoding)


@pytest.mark.parametrize("build", [
    lambda: T.ElectraForSequenceClassification(T.ElectraConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=24)),
    lambda: T.GPTNeoForSequenceClassification(T.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, max_position_embeddings=24,
        attention_types=[[["global"], 2]], intermediate_size=32, pad_token_id=0, bos_token_id=2, eos_token_id=2)),
], ids=["ElectraForSequenceClassification", "GPTNeoForSequenceClassification"])
def test_a_classifier_outside_the_registry_with_a_learned_table_is_refused_left_padding(build):
    """A transformers classifier outside the registry (ELECTRA, GPT-Neo) was called as given by perturbation_curves,
    predict, predict_labels and fine_tune_classifier: its learned positions counted from the padded column, so a
    left-padded row's logits were not the row's (checked below), silently. Refused, naming attention_mask, the rows and
    the fix; right padding, and left padding with position_ids counting real tokens, are computed as alone."""
    from bcos_plugins.attribution import real_token_positions
    from bcos_plugins.metrics import perturbation_curves
    from bcos_plugins.space import predict_labels

    torch.manual_seed(0)
    model = build().eval()
    name = type(model).__name__
    assert name not in SPECS
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    left, right = _pad(rows, "left", 0), _pad(rows, "right", 0)
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])
        assert not torch.allclose(model(input_ids=left[0], attention_mask=left[1]).logits[1:], alone[1:], atol=1e-4)
        torch.testing.assert_close(model(**rows_as_alone_call(model, *right)).logits, alone, rtol=1e-5, atol=1e-6)
        counted = {"position_ids": real_token_positions(left[1])}
        if name.startswith("GPTNeo"):  # a decoder reads each row's last token: ids counting real tokens suffice
            torch.testing.assert_close(model(**rows_as_alone_call(model, *left, counted)).logits, alone,
                                       rtol=1e-5, atol=1e-6)
    refusal = (rf"^attention_mask: rows \[1, 2\] start with padding, and the model {name} \(outside the architecture "
               r"registry.*learned position embeddings.*Pad on the right")
    with pytest.raises(BcosValueError, match=refusal):
        rows_as_alone_call(model, *left)
    with pytest.raises(BcosValueError, match=refusal):
        perturbation_curves(model, *left, torch.rand(left[0].shape), special_tokens=left[1] == 0)

    class LeftPadding:
        def __call__(self, texts, pairs=None, **kwargs):
            return T.BatchEncoding(dict(zip(("input_ids", "attention_mask"), left, strict=True)))

    # predict_labels pads the texts itself: it names the tokenizer that padded them, not a mask its caller never passed
    by_tokenizer = refusal.replace("^attention_mask: rows", "^tokenizer: pads on the left, so rows")
    with pytest.raises(BcosValueError, match=by_tokenizer):
        predict_labels(model, LeftPadding(), ["a", "b", "c"])


@pytest.mark.parametrize("name", ["BertModel", "BertForMaskedLM", "DistilBertModel", "RobertaModel", "GPT2Model",
                                  "GPT2LMHeadModel", "LlamaForCausalLM"])
@pytest.mark.parametrize("takes_position_ids", [True, False])
def test_position_ids_are_given_exactly_where_left_padding_is_not_refused_for_a_learned_table(name,
                                                                                               takes_position_ids):
    """One predicate (gets_real_token_position_ids) decides both whether position ids counting real tokens are given
    and whether check_first_column_is_real refuses left padding for a learned table: a model whose forward takes none
    is refused, one that takes them is given them, a decoder is given them."""
    model = tiny_model(name)
    spec = SPECS[name]
    if not takes_position_ids:
        original = model.forward

        def forward(input_ids=None, attention_mask=None, **kwargs):
            return original(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

        model.forward = forward
        assert "position_ids" not in inspect.signature(model.forward).parameters
    ids, mask = padded_batch(side="left")
    given = position_ids_as_alone(model, spec, mask) is not None
    assert given == gets_real_token_position_ids(model, spec)
    refused = spec.position_table is not None and not given
    if refused:
        with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding.*no position_ids"):
            check_first_column_is_real(model, mask, spec)
    else:
        check_first_column_is_real(model, mask, spec)
    assert given == (spec.kind == "decoder" or takes_position_ids)


def _electra_space(**config):
    torch.manual_seed(0)
    encoder = T.ElectraModel(T.ElectraConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=24, **config)).eval()
    return SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=4).eval()


def test_the_space_model_refuses_left_padding_for_an_encoder_outside_the_registry_with_a_learned_table():
    """An encoder outside the registry (ELECTRA) is given no position ids, and its learned table counts from the
    first column: a left-padded row's logits were those of shifted positions, silently. Refused, naming the argument,
    the problem and the fix; right padding, and left padding with position_ids counting real tokens (the fix), give
    each row's logits alone."""
    from bcos_plugins.attribution import real_token_positions

    model = _electra_space()
    assert type(model.encoder).__name__ not in SPECS
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])
        ids, mask = _pad(rows, "left", pad_id=0)
        with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding, and the encoder "
                                                 r"ElectraModel \(outside the architecture registry.*learned position "
                                                 r"embeddings.*Pad on the right.*or pass position_ids="):
            model(input_ids=ids, attention_mask=mask)
        fixed = model(input_ids=ids, attention_mask=mask, position_ids=real_token_positions(mask)).logits
        right = model(input_ids=_pad(rows, "right", 0)[0], attention_mask=_pad(rows, "right", 0)[1]).logits
    torch.testing.assert_close(fixed, alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(right, alone, rtol=1e-5, atol=1e-6)


def test_the_space_model_takes_left_padding_where_the_encoder_counts_real_tokens_itself():
    """XLM-RoBERTa's table has a padding row and its forward counts the tokens that are not pad_token_id: left padding
    written with that id is computed as alone (not refused); written with another id it would not be (refused)."""
    torch.manual_seed(0)
    encoder = T.XLMRobertaModel(T.XLMRobertaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=24, pad_token_id=1)).eval()
    assert type(encoder).__name__ not in SPECS
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=4).eval()
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])
        ids, mask = _pad(rows, "left", pad_id=1)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, alone, rtol=1e-5, atol=1e-6)
        with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding"):
            model(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask)


class _WordTokenizer:
    """Enough of a tokenizer for predict and predict_labels: ids = word lengths + 3, padded on the left."""

    def __call__(self, texts, pairs=None, **kwargs):
        rows = [[min(len(w), 40) + 3 for w in t.split()] for t in texts]
        length = max(map(len, rows))
        ids = torch.tensor([[0] * (length - len(r)) + r for r in rows])
        return T.BatchEncoding({"input_ids": ids, "attention_mask": (ids != 0).long()})


def test_every_path_that_calls_a_text_model_on_a_batch_calls_rows_as_alone_call(monkeypatch):
    """explain, perturbation_curves, next_token_contrast, predict, predict_labels and fine_tune_classifier's collator
    each decided on their own how to call a model (four copies of "registry: model_call_kwargs, else as given", one
    adding position ids outside the registry): each now calls rows_as_alone_call, once per batch, and nothing else in
    the package or its adapters calls model_call_kwargs (the Captum adapter's LayerBcos called it itself, and a model
    outside the registry as given: a sixth copy)."""
    import ast
    import importlib
    from pathlib import Path

    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    import bcos_plugins.attribution.text as text
    from bcos_plugins import bcosify, explain
    from bcos_plugins.fine_tuning import RowsAsAloneCollator
    from bcos_plugins.metrics import perturbation_curves
    from bcos_plugins.prediction import predict
    from bcos_plugins.space import predict_labels

    classifier = tiny_model("GPT2ForSequenceClassification")
    classifier.config.pad_token_id = 0
    lm = tiny_model("GPT2LMHeadModel")
    bcos_lm = bcosify(tiny_model("GPT2LMHeadModel"), verbose=False)
    ids, mask = padded_batch(side="left")
    texts = ["a bb ccc", "dddd e", "ff gg hhh iiii"]
    paths = [
        ("bcos_plugins.explain", lambda: explain(classifier, ids, mask)),
        ("bcos_plugins.metrics.perturbation",
         lambda: perturbation_curves(classifier, ids, mask, torch.rand(ids.shape), special_tokens=mask == 0)),
        ("bcos_plugins.attribution.text", lambda: next_token_contrast(lm, ids, mask, target=1, foil=2)),
        ("bcos_plugins.prediction", lambda: predict(classifier, _WordTokenizer(), texts)),
        # predict_labels runs predict's loop (prediction.batched_logits) since session 26
        ("bcos_plugins.prediction", lambda: predict_labels(classifier, _WordTokenizer(), texts)),
        ("bcos_plugins.fine_tuning", lambda: RowsAsAloneCollator(
            lambda features: {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(3, dtype=torch.long)},
            classifier)([{}])),
        ("bcos_plugins.adapters.captum", lambda: LayerBcos(bcos_lm).attribute(ids, target=1,
                                                                             additional_forward_args=(mask,))),
        ("bcos_plugins.adapters.captum", lambda: EmbeddingForward(bcos_lm).embed(ids, mask)),
    ]
    original = text.rows_as_alone_call
    for module_name, call in paths:
        module = importlib.import_module(module_name)
        assert module.rows_as_alone_call is original, module_name
        calls = []
        with monkeypatch.context() as patch:
            patch.setattr(module, "rows_as_alone_call",
                          lambda *a, calls=calls, **k: calls.append(1) or original(*a, **k))
            call()
        assert len(calls) == 1, (module_name, calls)
    root = Path(text.__file__).resolve().parents[1]
    # adapters/ sits beside the package in the repository and installs as bcos_plugins.adapters
    adapters = Path(importlib.import_module("bcos_plugins.adapters").__file__).resolve().parent
    sources = sorted({*root.rglob("*.py"), *adapters.rglob("*.py")})
    assert adapters / "captum.py" in sources and root / "explain.py" in sources
    copies = [f"{path.relative_to(root.parent)}:{node.lineno}" if path.is_relative_to(root.parent)
              else f"{path}:{node.lineno}" for path in sources
              if path != Path(text.__file__).resolve()
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
              == "model_call_kwargs"]
    assert not copies, "call the model through rows_as_alone_call:\n" + "\n".join(copies)


class _Wrapped(torch.nn.Module):
    """A causal LM behind a module transformers cannot generate with, whose forward takes position_ids."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


@pytest.mark.parametrize("wrap", [lambda lm: torch.compile(lm, backend="eager"), lambda lm: _Wrapped(lm).eval()],
                         ids=["torch.compile", "wrapper module"])
def test_next_token_contrast_gives_any_lm_whose_forward_takes_position_ids_ids_counting_real_tokens(wrap):
    """next_token_contrast reads next-token logits, so its model is a causal LM whatever its class: one outside the
    registry whose forward takes position_ids is given ids counting real tokens, as the old copy there gave every model
    outside the registry, and a left-padded row is computed as alone. That holds for a module transformers cannot
    generate with (not refused as a model of unknown positions is where the caller reads no next-token logits) and for
    ``torch.compile(model)``, an OptimizedModule whose forward takes ``(*args, **kwargs)``: the compiled model's
    forward is read."""
    lm = tiny_model("GPT2LMHeadModel")
    wrapped = wrap(lm)
    assert type(wrapped).__name__ not in SPECS
    ids, mask = padded_batch(side="left")
    target, foil = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    batched = next_token_contrast(wrapped, ids, mask, target=target, foil=foil).logit_difference
    for row in range(ids.shape[0]):
        alone = next_token_contrast(lm, ids[row : row + 1, mask[row].bool()], target=target[row], foil=foil[row])
        torch.testing.assert_close(batched[row : row + 1], alone.logit_difference, rtol=1e-5, atol=1e-5)
    if isinstance(wrapped, _Wrapped):
        with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding, and the model "
                                                 r"_Wrapped \(outside"):
            rows_as_alone_call(wrapped, ids, mask)  # a caller that does not read next-token logits


def test_captum_layer_bcos_calls_a_causal_lm_outside_the_registry_as_every_path_does():
    """The Captum adapter's LayerBcos called a model outside the registry with the batch as given, a sixth decision of
    how to call a text model: a left-padded row of a causal LM with a learned position table (GPT-Neo, given a B-cos
    head) ran on positions counted from its padding, so the explained logit was not the row's. It now calls
    rows_as_alone_call, which gives such a model position ids counting real tokens (as generate does): each row's
    explained logit (the attributions' sum at the B-cos head's input less their delta) is the row's alone."""
    from bcos_plugins.adapters.captum import LayerBcos

    from bcos_plugins.nn import BcosLinear

    torch.manual_seed(0)
    config = T.GPTNeoConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, max_position_embeddings=24,
                            attention_types=[[["global"], 2]], intermediate_size=32, tie_word_embeddings=False,
                            bos_token_id=2, eos_token_id=2)
    model = T.GPTNeoForCausalLM(config).eval()
    model.lm_head = BcosLinear(16, VOCAB, b=2.0)
    assert type(model).__name__ not in SPECS
    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    target = torch.tensor([3, 4, 5])
    with torch.no_grad():
        alone = torch.stack([model(input_ids=torch.tensor([row])).logits[0, -1, t]
                             for row, t in zip(rows, target, strict=True)])
    ids, mask = _pad(rows, "left", pad_id=0)
    attributions, delta = LayerBcos(model, model.lm_head).attribute(
        ids, target=target, additional_forward_args=(mask,), attribute_to_layer_input=True,
        return_convergence_delta=True)
    explained = attributions.sum(dim=(1, 2)) - delta
    torch.testing.assert_close(explained, alone, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # the shift the position ids prevent is real on this model
        shifted = model(input_ids=ids, attention_mask=mask).logits[1, -1, target[1]]
    assert not torch.allclose(shifted, alone[1], atol=1e-3)
