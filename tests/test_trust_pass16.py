"""Trust pass 16: the data the package ships and encodes (loaders, encoders, rationale masks).

Probed against ground truth computed from the raw files in the project's shared data folder (labels vs each
SOURCE.md, rows per split, no train/eval overlap, rationale masks after WordPiece and byte-level BPE
tokenisation, truncation, BLiMP / IOI target and foil ids). What it found and fixed is pinned here:

- ``EncodedTexts`` with fewer labels than texts failed mid-epoch inside ``Trainer`` (IndexError), with more
  labels it dropped the extra ones silently; now refused up front.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bcos_plugins.data import shipped_data
from bcos_plugins.encoded_texts import EncodedTexts
from bcos_plugins.errors import BcosValueError


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return AutoTokenizer.from_pretrained(str(shipped_data("gpt2_tokenizer")))


@pytest.mark.parametrize("labels", [[0], [0, 1, 1]])
def test_encoded_texts_refuses_labels_not_one_per_text(gpt2_tokenizer, labels):
    with pytest.raises(BcosValueError, match="labels: 2 texts but"):
        EncodedTexts(gpt2_tokenizer, ["a good film", "a bad one"], labels, max_length=8)


def test_encoded_texts_keeps_each_label_with_its_text(gpt2_tokenizer):
    data = EncodedTexts(gpt2_tokenizer, ["", "naïve ☃ café"], [1, 0], max_length=8)
    assert [data[i]["labels"] for i in range(len(data))] == [1, 0]
    assert data[0]["input_ids"] == []
