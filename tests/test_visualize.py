"""HTML token pages (bcos_plugins.visualize and the Captum records page): every token carries its score on hover,
long sentences can wrap between any two tokens, captions name what was explained, bad scores are refused."""

from __future__ import annotations

import math
import re
import unicodedata
from html.parser import HTMLParser

import pytest
import torch
from bcos_plugins.adapters.captum import records_to_html, visualization_records
from conftest import padded_batch, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.visualize import explanations_to_html, tokens_to_html


class _Page(HTMLParser):
    """Collects token spans (title, text), what sits between consecutive spans of a row, and inline styles."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self._in_token = False
        self.styles: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "style" in attrs:
            self.styles.append(attrs["style"])
        if tag == "div" and attrs.get("class") == "row":
            self.rows.append({"style": attrs.get("style", ""), "tokens": [], "between": []})
        elif tag == "span" and attrs.get("class") == "tok":
            row = self.rows[-1]
            if row["tokens"]:
                row["between"].append(row.pop("gap", ""))
            row["tokens"].append({"title": attrs.get("title"), "text": ""})
            self._in_token = True
        elif tag == "wbr" and self.rows:
            self.rows[-1]["gap"] = self.rows[-1].get("gap", "") + "<wbr>"

    def handle_endtag(self, tag):
        if tag == "span":
            self._in_token = False

    def handle_data(self, data):
        if self._in_token:
            self.rows[-1]["tokens"][-1]["text"] += data
        elif self.rows and self.rows[-1]["tokens"]:
            self.rows[-1]["gap"] = self.rows[-1].get("gap", "") + data


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def _draws_something(token: str) -> bool:
    return any(not (c.isspace() or unicodedata.category(c) in ("Cc", "Cf")) for c in token)


def _assert_wraps_and_hovers(row: dict, tokens: list[str], scores: list[float]):
    for token, score, span in zip(tokens, scores, row["tokens"], strict=True):
        shown_token, shown_score = span["title"].rsplit(": ", 1)
        if _draws_something(token):
            assert span["text"] == shown_token == token
        else:  # a token of spaces or zero-width characters is drawn as escapes, on the page and on hover (pass 14)
            assert span["text"] == shown_token and _draws_something(shown_token) and shown_token != token
        assert math.isclose(float(shown_score), score, rel_tol=1e-3, abs_tol=0.0), (span["title"], score)
    # a break opportunity between every two tokens: a sentence of any length wraps at token boundaries
    assert len(row["between"]) == len(tokens) - 1
    assert all("<wbr>" in gap or gap.isspace() for gap in row["between"])
    assert "overflow-wrap:anywhere" in row["style"]


SENTENCE_TOKENS = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1,
                                   max_size=12), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None)
@given(tokens=SENTENCE_TOKENS, data=st.data())
def test_every_token_shows_its_score_on_hover_and_rows_wrap(tokens, data):
    scores = data.draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False)
                                .filter(lambda v: v == 0 or abs(v) > 1e-30),
                                min_size=len(tokens), max_size=len(tokens)))
    page = _parse(tokens_to_html(tokens, scores, caption="a caption"))
    assert len(page.rows) == 1
    _assert_wraps_and_hovers(page.rows[0], tokens, scores)


def test_no_style_on_the_page_forbids_wrapping_or_adds_a_horizontal_scrollbar():
    row = tokens_to_html(["a" * 300, "b"], [1.0, -1.0])
    for style in _parse(row).styles:
        assert "nowrap" not in style and "overflow-x" not in style and "white-space:pre" not in style


def test_small_scores_stay_readable_on_hover():
    page = _parse(tokens_to_html(["tiny", "big"], [1.234e-7, -3.0]))
    assert [t["title"] for t in page.rows[0]["tokens"]] == ["tiny: +1.234e-07", "big: -3"]


def test_bad_scores_are_refused_naming_the_argument():
    with pytest.raises(BcosValueError, match="scores: has 1 values for 2 tokens"):
        tokens_to_html(["a", "b"], [1.0])
    with pytest.raises(BcosValueError, match=r"scores: are NaN or infinite at token positions \[1\]"):
        tokens_to_html(["a", "b"], [1.0, float("nan")])
    with pytest.raises(BcosTypeError, match="scores: must be one score per token"):
        tokens_to_html(["a", "b"], torch.ones(2, 2))


@pytest.fixture(scope="module")
def bcos_bert_explanations():
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch(length=30)
    return model, ids, mask


class _Tokenizer:
    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]


def test_explanation_page_captions_name_class_or_contrast_and_rows_wrap(bcos_bert_explanations):
    model, ids, mask = bcos_bert_explanations
    names = ["neg", "neu", "pos"]
    plain = explain(model, ids, mask, target=torch.tensor([0, 2, 1]))
    contrast = explain(model, ids, mask, target=2, foil=0)
    for expl, expected in ((plain, ["neg", "pos", "neu"]), (contrast, ["pos − neg"] * 3)):
        page = explanations_to_html(expl, _Tokenizer(), label_names=names, captions=["x", "y", "z"])
        parsed = _parse(page)
        captions = re.findall(r"<div class=\"meta\">([^<]*)</div>", page)
        assert [c.split("explained: ")[1].split(" — ")[0] for c in captions] == expected
        assert [c.split(" · ")[0] for c in captions] == ["x", "y", "z"]
        for row, tokens, scores in zip(parsed.rows, expl.tokens(_Tokenizer()), expl.scores(), strict=True):
            _assert_wraps_and_hovers(row, tokens, scores.tolist())
        assert "nowrap" not in page and "overflow-x" not in page


def test_captum_records_page_rows_wrap_and_hover(bcos_bert_explanations):
    model, ids, mask = bcos_bert_explanations
    expl = explain(model, ids, mask)
    records = visualization_records(expl, _Tokenizer(), label_names=["neg", "neu", "pos"])
    page = records_to_html(records)
    parsed = _parse(page)
    assert len(parsed.rows) == len(records)
    for row, record in zip(parsed.rows, records, strict=True):
        _assert_wraps_and_hovers(row, list(record.raw_input_ids), [float(s) for s in record.word_attributions])
    assert "nowrap" not in page and "overflow-x" not in page


def test_sections_page_has_one_headed_section_per_explanation(bcos_bert_explanations):
    from bcos_plugins.visualize import explanation_sections_to_html

    model, ids, mask = bcos_bert_explanations
    one, other = explain(model, ids, mask, target=0), explain(model, ids, mask, target=1, foil=0)
    page = explanation_sections_to_html([("Class 0", one), ("Contrast", other, ["a", "b", "c"])], _Tokenizer(),
                                        label_names=["neg", "neu", "pos"], title="t")
    assert re.findall(r"<h2>([^<]*)</h2>", page) == ["Class 0", "Contrast"]
    assert len(_parse(page).rows) == 6
    with pytest.raises(BcosTypeError, match=r"sections\[0\]: must be"):
        explanation_sections_to_html([("only a heading",)], _Tokenizer())
