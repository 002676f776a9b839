"""Trust pass 21, the adapters' leftovers: one check of ``label_names`` for the HTML pages, Captum's
``visualization_records`` and inseq's ``load_classifier`` (two of them had their own inline copy of it, which took
names that are not strings)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------- one check of label_names


class _Tokens:
    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]


def _refusal(where: str, label_names) -> str:
    from bcos_plugins.adapters.captum import visualization_records
    from bcos_plugins.adapters.inseq import load_classifier
    from test_conformance import _word_tokenizer

    from bcos_plugins import explain
    from bcos_plugins.visualize import explanations_to_html

    model = bcosify(_stock("Qwen2ForSequenceClassification", num_labels=3), b=B, verbose=False)
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosTypeError) as caught:
        if where == "load_classifier":
            load_classifier(model, _word_tokenizer(), label_names=label_names)
        else:
            explanation = explain(model, ids, attention_mask=mask)
            with torch.no_grad():
                logits = model(ids, attention_mask=mask).logits
            if where == "visualization_records":
                visualization_records(explanation, _Tokens(), logits=logits, label_names=label_names)
            else:
                explanations_to_html(explanation, _Tokens(), label_names=label_names)
    return str(caught.value)


@pytest.mark.parametrize(("label_names", "words"), [
    ("abc", r"^label_names: must be a list of class names; it is one string, 'abc', whose characters would name the "
            r"classes\. Pass one name per class, in class-id order"),
    ([0, 1, 2], r"^label_names: must be strings, got int 0\. Pass one name per class, in class-id order"),
])
def test_label_names_are_checked_by_one_check_in_the_pages_captum_and_inseq(label_names, words):
    """Captum's and inseq's inline copies took class ids as names (shown as the numbers, and inseq's targets were
    TokenWithId(0, 0)); the three entry points now give the same refusal, word for word."""
    import re

    messages = {where: _refusal(where, label_names)
                for where in ("load_classifier", "visualization_records", "explanations_to_html")}
    assert all(re.match(words, message) for message in messages.values()), messages
    assert len(set(messages.values())) == 1, messages
