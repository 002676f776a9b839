"""``torch.compile(model)`` of a registry model is treated, and called, as the model itself.

The compiled model is an ``OptimizedModule`` whose class is torch's and whose forward takes ``(*args, **kwargs)``:
every path read it as a model outside the registry (a left-padded compiled GPT-2 classifier was refused, naming
"OptimizedModule", and ``explain`` refused it as not transformers' class), and ``forward_keywords`` read the wrapper's
signature. The registry lookup and the forward's reading now go through the wrapper
(``bcos_plugins.convert.architectures.uncompiled``); the call itself still goes through the compiled wrapper.

The graphs are compiled by a backend that records them and runs them as traced (``backend="eager"`` with a count):
the wrapper path is the same as under inductor, without a C++ build per test.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_config, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution.text import forward_keywords, registry_spec, rows_as_alone_call
from bcos_plugins.convert.architectures import uncompiled
from bcos_plugins.errors import BcosTypeError
from bcos_plugins.prediction import predict


class _RecordingBackend:
    """A torch.compile backend that runs each traced graph as it is and counts the graphs it was given."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


class _LeftPaddingWordTokenizer:
    """Enough of a tokenizer for predict: ids = word lengths + 3, padded on the left, with token_type_ids (which
    GPT-2's forward names) and a special_tokens_mask (which no forward reads)."""

    def __call__(self, texts, pairs=None, **kwargs):
        rows = [[min(len(w), 40) + 3 for w in t.split()] for t in texts]
        length = max(map(len, rows))
        ids = torch.tensor([[0] * (length - len(r)) + r for r in rows])
        return T.BatchEncoding({"input_ids": ids, "attention_mask": (ids != 0).long(),
                                "token_type_ids": torch.zeros_like(ids), "special_tokens_mask": (ids == 0).long()})


def _same_call(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[name], value), name
        else:
            assert got[name] is value, name


@pytest.fixture(scope="module")
def bcos_classifier():
    torch.manual_seed(0)
    return bcosify(T.GPT2ForSequenceClassification(tiny_config("gpt2")).eval(), verbose=False)


def test_a_compiled_registry_model_is_looked_up_and_called_as_the_model_itself(bcos_classifier):
    """registry_spec, forward_keywords and rows_as_alone_call read through the wrapper: a compiled stock GPT-2
    classifier on a left-padded batch was refused as a model outside the registry reading a learned position table
    ("the model OptimizedModule ... outside the architecture registry"), and the tokenizer outputs the wrapper's
    ``(*args, **kwargs)`` did not name (GPT-2's token_type_ids) were dropped. Now both models get the same keyword
    arguments: position ids counting real tokens, the forward's tokenizer outputs, nothing it does not read (a
    misspelt keyword is refused naming the model's forward and its arguments, not the wrapper's)."""
    ids, mask = padded_batch(side="left")
    encoding = _LeftPaddingWordTokenizer()(["a bb ccc", "dddd e", "ff gg hhh iiii"])
    for model in (tiny_model("GPT2ForSequenceClassification"), bcos_classifier):
        compiled = torch.compile(model, backend=_RecordingBackend())
        assert registry_spec(compiled) is registry_spec(model) is not None
        assert forward_keywords(compiled) == forward_keywords(model)
        _same_call(rows_as_alone_call(compiled, ids, mask), rows_as_alone_call(model, ids, mask))
        call = rows_as_alone_call(compiled, encoding["input_ids"], encoding["attention_mask"],
                                  tokenizer_outputs=encoding)
        _same_call(call, rows_as_alone_call(model, encoding["input_ids"], encoding["attention_mask"],
                                            tokenizer_outputs=encoding))
        assert "token_type_ids" in call and "special_tokens_mask" not in call
        with pytest.raises(BcosTypeError, match=r"^token_type_id: is not an argument of "
                                                r"GPT2ForSequenceClassification\.forward.*token_type_ids"):
            rows_as_alone_call(compiled, ids, mask, {"token_type_id": torch.zeros_like(ids)})
        assert type(compiled).__name__ == "OptimizedModule" and uncompiled(compiled) is model


def test_explain_and_predict_of_a_compiled_b_cos_classifier_equal_the_models_on_left_padding(bcos_classifier):
    """explain refused a compiled B-cos GPT-2 classifier ("OptimizedModule is not transformers'
    GPT2ForSequenceClassification"); now explain and predict of the compiled model, called through the compiled
    wrapper (the backend is given graphs), equal those of the model itself on a left-padded batch. The wrapper is
    first run outside explanation mode, so explain's call must not reuse that graph (whose dynamic weights are not
    held constant): the contributions would then not be W(x)x."""
    backend = _RecordingBackend()
    compiled = torch.compile(bcos_classifier, backend=backend)
    ids, mask = padded_batch(side="left")
    with torch.no_grad():
        compiled(**rows_as_alone_call(compiled, ids, mask))
    traced_outside_explanation = backend.graphs
    assert traced_outside_explanation >= 1
    expected = explain(bcos_classifier, ids, mask, target=1)
    got = explain(compiled, ids, mask, target=1)
    assert backend.graphs > traced_outside_explanation  # explain's call ran through the compiled wrapper
    torch.testing.assert_close(got.explained, expected.explained, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.input_contributions, expected.input_contributions, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.input_contributions.sum(dim=(1, 2)), got.explained, rtol=1e-4, atol=1e-5)
    texts = ["a bb ccc", "dddd e", "ff gg hhh iiii"]
    torch.testing.assert_close(predict(compiled, _LeftPaddingWordTokenizer(), texts),
                               predict(bcos_classifier, _LeftPaddingWordTokenizer(), texts), rtol=1e-5, atol=1e-6)


def test_bcosify_of_a_compiled_model_says_to_bcosify_before_compiling():
    """bcosify converts the model's own modules; a compiled wrapper's graph would not see them, so the wrapper is
    refused with the order that works (it was refused as "OptimizedModule is not transformers' X")."""
    from bcos_plugins.convert.architectures import UnsupportedModuleError

    stock = T.GPT2ForSequenceClassification(tiny_config("gpt2")).eval()
    compiled = torch.compile(stock, backend=_RecordingBackend())
    with pytest.raises(UnsupportedModuleError, match=r"torch\.compile wrapper of GPT2ForSequenceClassification.*"
                                                     r"bcosify first, then compile"):
        bcosify(compiled)
