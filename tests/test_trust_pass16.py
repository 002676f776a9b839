"""Trust pass 16: the data the package ships and encodes (loaders, encoders, rationale masks).

Probed against ground truth computed from the raw files in the project's shared data folder (labels vs each
SOURCE.md, rows per split, no train/eval overlap, rationale masks after WordPiece and byte-level BPE
tokenisation, truncation, BLiMP / IOI target and foil ids). What it found and fixed is pinned here:

- ``EncodedTexts`` with fewer labels than texts failed mid-epoch inside ``Trainer`` (IndexError), with more
  labels it dropped the extra ones silently; now refused up front.
- ``gold_mask_from_spans`` / ``gold_mask_from_words`` on an encoding truncated before the rationale returned an
  all-zero row, read by the metrics and the guidance as "no rationale"; now refused, naming the rows. A
  rationale inside the kept text still gives its tokens under WordPiece ('##') and byte-level BPE ('Ġ').
- ``encode_blimp`` stood for a target or foil of several GPT-2 tokens (" alumnus", " waitresses": 89 of 300
  animate_subject_passive pairs) by its first piece without saying so; the paper's convention stays the
  default, the pairs are listed in ``first_piece``, and ``multi_token="drop"`` keeps whole-word ids only.
- ``load_blimp(n=-1)`` kept all pairs but the last (a slice); ``load_sst2(path=...)`` of a file without its
  header line dropped the first row as the header. Both refused now.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bcos_plugins.data import encode_blimp, load_blimp, load_sst2, shipped_data
from bcos_plugins.encoded_texts import EncodedTexts
from bcos_plugins.errors import BcosValueError
from bcos_plugins.guided import find_span, gold_mask_from_spans, gold_mask_from_words
from bcos_plugins.pretrained import minilm_path


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


@pytest.fixture(scope="module", params=["wordpiece", "bpe"])
def fast_tokenizer(request):
    if request.param == "wordpiece":
        return AutoTokenizer.from_pretrained(str(minilm_path()))
    return AutoTokenizer.from_pretrained(str(shipped_data("gpt2_tokenizer")), add_prefix_space=True)


def _marked(tokenizer, enc, mask, row=0):
    return tokenizer.decode([t for t, m in zip(enc["input_ids"][row], mask[row].tolist(), strict=True) if m]).strip()


def test_span_rationale_cut_by_truncation_is_refused(fast_tokenizer):
    text = " ".join(["word"] * 40) + " rationale"
    enc = fast_tokenizer([text], truncation=True, max_length=12, return_offsets_mapping=True)
    with pytest.raises(BcosValueError, match=r"spans: rows \[0\] mark only text that truncation cut off"):
        gold_mask_from_spans(enc, [[find_span(text, "rationale")]])
    full = fast_tokenizer([text], return_offsets_mapping=True)
    assert _marked(fast_tokenizer, full, gold_mask_from_spans(full, [[find_span(text, "rationale")]])) == "rationale"
    # A row without a rationale stays an empty row; a kept rationale is unaffected by the truncation.
    assert gold_mask_from_spans(enc, [[]]).sum() == 0
    kept = gold_mask_from_spans(enc, [[find_span(text, "word")]])
    assert _marked(fast_tokenizer, enc, kept) == "word"


def test_word_rationale_cut_by_truncation_is_refused(fast_tokenizer):
    words = ["plain"] * 40 + ["unbelievably", "hateful"]
    highlight = [0.0] * 40 + [1.0, 1.0]
    enc = fast_tokenizer([words], is_split_into_words=True, truncation=True, max_length=12)
    with pytest.raises(BcosValueError, match=r"word_rationales: rows \[0\] highlight only words that truncation"):
        gold_mask_from_words(enc, [highlight])
    full = fast_tokenizer([words], is_split_into_words=True)
    assert _marked(fast_tokenizer, full, gold_mask_from_words(full, [highlight])) == "unbelievably hateful"


def _ids(tokenizer, word):
    return tokenizer(" " + word, add_special_tokens=False)["input_ids"]


def test_blimp_multi_token_words_are_listed_or_dropped(gpt2_tokenizer):
    pairs = load_blimp("asp", n=60)
    batch = encode_blimp(pairs, gpt2_tokenizer)
    split = [i for i, p in enumerate(batch.pairs)
             if len(_ids(gpt2_tokenizer, p.target)) > 1 or len(_ids(gpt2_tokenizer, p.foil)) > 1]
    assert split and batch.first_piece == split
    for i, p in enumerate(batch.pairs):
        assert batch.target_ids[i].item() == _ids(gpt2_tokenizer, p.target)[0]
        assert batch.foil_ids[i].item() == _ids(gpt2_tokenizer, p.foil)[0]
    whole = encode_blimp(pairs, gpt2_tokenizer, multi_token="drop")
    assert whole.first_piece == [] and len(whole) == len(batch) - len(split)
    for i, p in enumerate(whole.pairs):
        assert [whole.target_ids[i].item()] == _ids(gpt2_tokenizer, p.target)
        assert [whole.foil_ids[i].item()] == _ids(gpt2_tokenizer, p.foil)
    assert sum(r == "target or foil is several tokens" for _, r in whole.dropped) == len(split)
    with pytest.raises(BcosValueError, match="multi_token: must be one of"):
        encode_blimp(pairs, gpt2_tokenizer, multi_token="last")


def test_load_blimp_refuses_a_negative_n():
    with pytest.raises(BcosValueError, match=r"^n: must be >= 0, got -1\. Pass the number of rows to keep, an int >= 0 "
                                             r"\(None keeps all\)\.$"):
        load_blimp("aga", n=-1)
    assert len(load_blimp("aga", n=3)) == 3


def test_sst2_file_without_header_is_refused_not_short_of_its_first_row(tmp_path):
    headerless = tmp_path / "rows.tsv"
    headerless.write_text("a good film\t1\na bad one\t0\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match="line 1 is a row"):
        load_sst2(path=headerless)
    with_header = tmp_path / "with_header.tsv"
    with_header.write_text("sentence\tlabel\r\na good film\t1\r\na bad one\t0\r\n", encoding="utf-8")
    assert list(load_sst2(path=with_header)) == [("a good film", 1), ("a bad one", 0)]
