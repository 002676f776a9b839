"""One check refuses what is not a transformers tokenizer object, for every entry point that takes ``tokenizer=``
(``bcos_plugins._checks.require_tokenizer_object``). ``explain_dataset`` (and the inseq and pre-training paths) and
the TransformerLens converters had one check each, with different words and different acceptance: a callable with
``convert_ids_to_tokens`` passed one and was refused by the other."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError

lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")


class _LooksLikeATokenizer:
    """Callable with ``convert_ids_to_tokens``: no transformers tokenizer (no pad token, no batching)."""

    def __call__(self, texts, **kwargs):
        return {"input_ids": [[1]]}

    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]

    def __repr__(self):
        return "_LooksLikeATokenizer()"


def _message(call) -> str:
    with pytest.raises(BcosTypeError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("bad", ["gpt2", 3, _LooksLikeATokenizer()], ids=["hub-name", "int", "duck-typed"])
def test_explain_dataset_and_the_lens_converters_refuse_a_non_tokenizer_with_the_same_message(bad):
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model = bcosify(tiny_model("GPT2LMHeadModel"), b=1.25, verbose=False)
    corpus = _message(lambda: explain_dataset(model, bad, ["w3 w4"]))
    bridge = _message(lambda: lens.transformer_bridge_from_hf(tiny_model("GPT2LMHeadModel"), tokenizer=bad))
    assert corpus == bridge
    assert corpus == (f"tokenizer: expected a transformers tokenizer, got {type(bad).__name__} {bad!r}. Pass the "
                      "tokenizer object, e.g. AutoTokenizer.from_pretrained(the model's folder or hub name) (nothing "
                      "is fetched from the hub here).")
