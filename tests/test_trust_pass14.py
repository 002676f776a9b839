"""Trust pass 14: what the user sees. The pages and records built from explanations (``explanations_to_html``,
``explanation_sections_to_html``, ``tokens_to_html``, Captum's ``visualization_records`` / ``records_to_html``),
each shown (token, score) pair checked against the explanation's raw tensors and the tokenizer's
``convert_ids_to_tokens`` (WordPiece, GPT-2 byte-level BPE; HTML-special, right-to-left, zero-width and multi-byte
text; left and right padding; positions; foils). The cases that were silently wrong or crashed unhelpfully, one test
each."""

from __future__ import annotations

import warnings
from html.parser import HTMLParser

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify, explain
from bcos_plugins.data import shipped_data
from bcos_plugins.visualize import explanations_to_html

warnings.filterwarnings("ignore", category=DeprecationWarning)


class _Tokens(HTMLParser):
    """The page's token spans as (text, hover title, style) and its captions."""

    def __init__(self, page: str):
        super().__init__()
        self.spans, self.captions, self._span, self._caption = [], [], None, False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and attrs.get("class") == "tok":
            self._span = ["", attrs["title"], attrs["style"]]
        if tag == "div" and attrs.get("class") == "meta":
            self._caption = True
            self.captions.append("")

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.spans.append(tuple(self._span))
            self._span = None
        if tag == "div":
            self._caption = False

    def handle_data(self, data):
        if self._span is not None:
            self._span[0] += data
        elif self._caption:
            self.captions[-1] += data


@pytest.fixture(scope="module")
def gpt2():
    """A tiny B-cos GPT-2 over the shipped GPT-2 tokenizer (pad = eos), left padding."""
    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return bcosify(T.GPT2LMHeadModel(config).eval(), b=1.5, verbose=False), tokenizer


# the rows' real tokens as the page draws GPT-2's byte-level tokens (trust pass 24: the text they stand for; the emoji,
# split across two tokens, as each token's bytes escaped), written out by hand so that the check does not read them
# through visualize.shown_tokens, the function the page itself draws them with
_SHOWN = (["<", "b", ">", "a", "</", "b", ">", " cat", " sat", " on", " the", " mat"],
          ["\\xf0\\x9f\\x98", "\\x80", " hi"])


def test_the_page_of_an_lm_explained_at_an_inner_position_marks_that_token(gpt2):
    """A causal LM explained at each row's first token (the next-token logit predicted there) was drawn as the
    whole row with the caption 'explained: 11 — value ...': nothing said which token's output was explained, so
    the page read as the last token's prediction, silently. The caption names the token and the span is outlined,
    counted among the shown tokens (left padding removed)."""
    model, tokenizer = gpt2
    batch = tokenizer(["<b>a</b> cat sat on the mat", "😀 hi"], padding=True, return_tensors="pt")
    first = batch["attention_mask"].argmax(1)
    for offset in (0, 1):
        expl = explain(model, batch["input_ids"], batch["attention_mask"], target=11, position=first + offset)
        page = _Tokens(explanations_to_html(expl, tokenizer))
        spans = iter(page.spans)
        for i, shown in enumerate(_SHOWN):
            row = [next(spans) for _ in shown]
            assert [text for text, _, _ in row] == shown
            outlined = [k for k, (_, _, style) in enumerate(row) if "outline" in style]
            assert outlined == [offset]
            assert f"at token {offset} ({shown[offset]})" in page.captions[i]
            assert "explained output" in row[offset][1]


def test_captum_records_of_an_lm_explained_at_an_inner_position_name_that_token(gpt2):
    """The records' attribution label of the same explanation was the token id alone ('11'), the explained
    position nowhere in the record."""
    from bcos_plugins.adapters.captum import visualization_records

    model, tokenizer = gpt2
    batch = tokenizer(["the cat sat", "a longer row of many tokens"], padding=True, return_tensors="pt")
    position = batch["attention_mask"].argmax(1) + 1
    expl = explain(model, batch["input_ids"], batch["attention_mask"], target=11, position=position)
    for record in visualization_records(expl, tokenizer):
        assert record.attr_class == f"11 at token 1 ({record.raw_input_ids[1]})"
    last = explain(model, batch["input_ids"], batch["attention_mask"], target=11)
    for record in visualization_records(last, tokenizer):
        n = len(record.raw_input_ids)
        assert record.attr_class == f"11 at token {n - 1} ({record.raw_input_ids[-1]})"


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("position", [1, -2])
def test_explain_dataset_names_a_position_beyond_a_short_text_as_given(gpt2, side, position):
    """A position past a one-token text was refused naming a number never passed ('position: [18] is outside row(s)
    [1] (length 18 ...)' for position=1 on a left-padded batch: the padded column) or calling the missing token 'a
    padding token'. The refusal names the position as given, the text and its token count."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset
    from bcos_plugins.errors import BcosValueError

    model, tokenizer = gpt2
    tokenizer.padding_side = side
    try:
        with pytest.raises(BcosValueError, match=rf"^position: {position} is not a token of text 1 \('a', 1 "
                                                 r"tokens\)\. Pass a position inside every text"):
            explain_dataset(model, tokenizer, ["the cat sat on the mat today", "a", "x y z"], target=11,
                            position=position, progress=False)
    finally:
        tokenizer.padding_side = "left"


def test_a_figure_column_of_a_signed_method_uses_one_colour_map_in_every_row(tmp_path, monkeypatch):
    """save_explanation_figure chose the colour map per map: a B-cos map without a negative pixel was drawn in jet
    beside the column's other rows in blue-white-red, so its smallest positive contributions showed in the blue
    that means 'opposes' one row up, silently. A column with a negative value anywhere is blue-white-red in every
    row (white at 0, the positive pixels red); a column never negative (rollout) stays sequential."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bcos_plugins.vision.visualize import save_explanation_figure

    drawn = []
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: drawn.append(subplots(*a, **k)) or drawn[-1])
    images = torch.rand(2, 1, 4, 4)
    signed = torch.stack([torch.linspace(-1, 1, 16).reshape(4, 4), torch.linspace(0.1, 1, 16).reshape(4, 4)])
    save_explanation_figure(tmp_path / "fig.png", images, {"W(x)x": signed, "rollout": signed[1:].expand(2, 4, 4)})
    (_, axes), = drawn
    assert [axes[i, 1].images[0].get_cmap().name for i in range(2)] == ["bwr", "bwr"]
    assert axes[1, 1].images[0].norm(0.0) == pytest.approx(0.5)  # zero is white, the middle of bwr
    assert [axes[i, 2].images[0].get_cmap().name for i in range(2)] == ["jet", "jet"]


@pytest.mark.parametrize("token, shown", [("", "∅"), (" ", "␣"), ("\n", "\\n"), ("\t ", "\\t␣"), ("\u200b", "U+200B"),
                                          ("\u200e\u200f", "U+200EU+200F"), ("\u2060", "U+2060")])
def test_a_token_that_would_draw_nothing_shows_its_characters(token, shown):
    """A token of no visible character (decoded tokens of a newline, a space, a zero-width space, a direction mark)
    was drawn as an empty coloured box, or its colour merged into the spacing between its neighbours: its score
    stood beside nothing on the page. It shows its characters as escapes; visible tokens are drawn as they are."""
    from bcos_plugins.visualize import tokens_to_html

    page = _Tokens(tokens_to_html(["a", token, "b\u200bc", "😀"], [0.5, -1.0, 0.25, 0.1]))
    assert [text for text, _, _ in page.spans] == ["a", shown, "b\u200bc", "😀"]
    assert page.spans[1][1] == f"{shown}: -1"


def test_a_right_to_left_override_inside_a_token_stays_inside_it():
    """A token holding U+202E (right-to-left override; SentencePiece tokenizers keep it, decoded tokens too) reversed
    the on-screen order of every later token of the row: the bidi run does not end at a span's end unless the span
    isolates it. Every token span is isolated, so the row shows the tokens in sequence order."""
    from bcos_plugins.visualize import tokens_to_html

    page = _Tokens(tokens_to_html(["a", "\u202eb", "c", "שלום"], [1.0, -1.0, 0.5, 0.2]))
    assert [text for text, _, _ in page.spans] == ["a", "\u202eb", "c", "שלום"]
    assert all("unicode-bidi:isolate" in style for _, _, style in page.spans)


def test_a_tiny_explained_value_is_not_captioned_as_zero():
    """Captions printed 4 decimals: a logit of 3e-6 (a B = 10 model's logits are that small) read 'value 0.0000, sum
    of contributions 0.0000' on the page and 0.000 as the records' attribution score, a zero the model never gave.
    They print 4 significant digits, as the hover text does."""
    from bcos_plugins.adapters.captum import records_to_html, visualization_records

    from bcos_plugins.attribution import TokenExplanation

    class Tokenizer:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    scores = torch.tensor([[1e-6, 2e-6, -5e-7]], dtype=torch.float64)
    expl = TokenExplanation(contributions=scores, input_contributions=scores[..., None], explained=scores.sum(1),
                            target=torch.tensor([1]), input_ids=torch.tensor([[4, 5, 6]]),
                            attention_mask=torch.ones(1, 3, dtype=torch.long))
    (caption,) = _Tokens(explanations_to_html(expl, Tokenizer())).captions
    assert caption == "explained: 1 — value 2.5e-06, sum of contributions 2.5e-06"
    assert "<td>2.5e-06</td>" in records_to_html(visualization_records(expl, Tokenizer()))


def test_tokens_to_html_refuses_a_string_of_tokens_and_boolean_scores():
    """A decoded text passed as the tokens was drawn one character per token beside the scores (silently when the
    lengths matched), and a boolean mask passed as the scores drew as scores 1 and 0."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.visualize import tokens_to_html

    with pytest.raises(BcosTypeError, match=r"^tokens: got one string \('abc'\); each character would be drawn as "
                                            r"a token\. Pass the list of tokens"):
        tokens_to_html("abc", [1.0, 2.0, 3.0])
    with pytest.raises(BcosTypeError, match=r"^scores: must be real numbers, got a torch\.bool tensor\. Pass"):
        tokens_to_html(["a", "b"], torch.tensor([True, False]))


def test_the_pages_say_that_colour_depth_is_per_row(gpt2):
    """Each row's colours are scaled to its own largest |score|, so a row of scores near 0.001 was drawn as deep as a
    row near 10; the pages' legends said only 'green: supports ...; red: opposes it', so rows read as comparable."""
    from bcos_plugins.adapters.captum import records_to_html, visualization_records

    from bcos_plugins.visualize import explanation_sections_to_html

    model, tokenizer = gpt2
    batch = tokenizer(["the cat sat", "a dog"], padding=True, return_tensors="pt")
    expl = explain(model, batch["input_ids"], batch["attention_mask"], target=11)
    note = "Colour depth is relative to the largest |score| in each row"
    for page in (explanations_to_html(expl, tokenizer), explanation_sections_to_html([("a", expl)], tokenizer),
                 records_to_html(visualization_records(expl, tokenizer))):
        assert note in page


def test_tokens_to_html_marks_a_numpy_index_and_refuses_a_boolean_or_outside_one():
    """explained_at (new in this pass) takes any integer index of a shown token; True is not token 1."""
    import numpy as np

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.visualize import tokens_to_html

    page = _Tokens(tokens_to_html(["a", "b", "c"], [1.0, 2.0, 3.0], explained_at=np.int64(2)))
    assert ["outline" in style for _, _, style in page.spans] == [False, False, True]
    for bad in (True, 3, -1, 1.0):
        with pytest.raises(BcosValueError, match=r"^explained_at: must be the index of one of the 3 tokens"):
            tokens_to_html(["a", "b", "c"], [1.0, 2.0, 3.0], explained_at=bad)


def test_captum_records_refuse_a_target_other_than_the_explained_class():
    """visualization_records(explanation, tokenizer, target=...) labelled the explanation's scores (of the class it
    explained) with the class passed: the scores of class 0 shown as the attribution of class 1, silently."""
    from bcos_plugins.adapters.captum import visualization_records

    from bcos_plugins.attribution import TokenExplanation
    from bcos_plugins.errors import BcosValueError

    class Tokenizer:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    scores = torch.tensor([[0.5, -0.25], [1.0, 2.0]])
    expl = TokenExplanation(contributions=scores, input_contributions=scores[..., None], explained=scores.sum(1),
                            target=torch.tensor([0, 1]), input_ids=torch.tensor([[4, 5], [6, 7]]),
                            attention_mask=torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(BcosValueError, match=r"^target: names class 1 for example 0, but the explanation's scores "
                                             r"explain class 0 \(1 such examples\)\. Leave target out"):
        visualization_records(expl, Tokenizer(), target=[1, 1])
    names = ["neg", "pos"]
    same = visualization_records(expl, Tokenizer(), target=torch.tensor([0, 1]), label_names=names)
    assert [r.attr_class for r in same] == ["neg", "pos"]
