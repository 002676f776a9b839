"""Self-contained HTML for signed token explanations.

Written by hand rather than with Captum's ``visualize_text`` because that needs IPython and a notebook;
this page opens in any browser and is what ``make demo`` writes. Green = supports the explained output,
red = opposes it; intensity is relative to the largest magnitude in the row. Every token shows its exact
score on hover (its ``title``), and long sentences wrap at token boundaries instead of running off the page
(the Captum records page of :mod:`bcos_plugins.adapters.captum` uses the same rows). Each token is laid out on its
own, in sequence order (a right-to-left override inside one token does not reorder the others), and a token that
would draw nothing (empty, whitespace, zero-width characters) shows them as escapes (``␣``, ``\\n``, ``U+200B``).
A byte-level BPE tokenizer's tokens (GPT-2, Llama 3, Qwen) are drawn as the text they stand for, not in its byte
alphabet (``ĠcafÃ©`` for the word café with its space); a character split across tokens shows each token's bytes escaped.
"""

from __future__ import annotations

import html as _html
import math
import numbers
import unicodedata
from collections.abc import Sequence

import torch

from ._checks import require_label_names
from .attribution.targets import Direction
from .errors import BcosTypeError, BcosValueError, argument_error

__all__ = ["explanation_sections_to_html", "explanations_to_html", "tokens_to_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 60em; }
.row { margin: 1.2em 0; line-height: 2.1em; }
.tok { padding: 0.15em 0.25em; margin: 0 0.05em; border-radius: 0.25em; }
.meta { color: #555; font-size: 0.9em; }
"""
# Inline on every row, so that pages which bring their own stylesheet (the Captum records table) wrap too:
# tokens are inline spans separated by <wbr> break opportunities; overflow-wrap breaks a single token longer
# than the line (a URL) instead of widening the page.
_ROW_STYLE = "overflow-wrap:anywhere;word-break:normal;white-space:normal;max-width:100%"


def _colour(score: float, scale: float) -> str:
    a = min(1.0, abs(score) / scale) if scale > 0 else 0.0
    return f"rgba(0,150,0,{a:.3f})" if score >= 0 else f"rgba(210,0,0,{a:.3f})"


_SHOWN_AS = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible(token: str) -> str:
    """The token as drawn: one that would draw nothing (empty, or only spaces, line breaks, zero-width or other
    format characters: its score's colour beside no text, or merged into the spacing) shows its characters as
    escapes (``␣``, ``\\n``, ``U+200B``)."""
    if token and any(not (c.isspace() or unicodedata.category(c) in ("Cc", "Cf")) for c in token):
        return token
    return "".join(_SHOWN_AS.get(c, f"U+{ord(c):04X}") for c in token) or "∅"


def signed_share_text(share: float) -> str:
    """A token's signed share as the terminal shows it: 3 decimals (``+0.412``), and 2 significant digits below
    ``5e-4`` (``+1.2e-05``), where 3 decimals wrote ``+0.000`` for a non-zero share (the HTML pages' hover uses
    ``%g``); exactly 0 stays ``+0.000``."""
    share = float(share)
    return f"{share:+.3f}" if share == 0 or not abs(share) < 5e-4 else f"{share:+.2g}"


def _span(token: str, score: float, scale: float, explained: bool) -> str:
    # unicode-bidi:isolate: a right-to-left override or mark inside one token (SentencePiece tokens keep them)
    # reordered every later token of the row on screen; each token is laid out on its own, in sequence order
    shown = _visible(token)
    outline, note = (";outline:2px solid #000", " (the explained output is this token's)") if explained else ("", "")
    hover = _html.escape(f"{shown}: {score:+.4g}{note}", quote=True)  # %g: 1.2e-05 rather than +0.0000
    return (f'<span class="tok" style="background:{_colour(score, scale)};unicode-bidi:isolate{outline}" '
            f'title="{hover}">{_html.escape(shown)}</span>')


def _is_real_score(value) -> bool:
    """A real number that is no boolean: a Python or NumPy int or float, or a one-element real tensor."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.dtype != torch.bool and not value.is_complex()
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require_text(name: str, value) -> str:
    """A caption or title as text: another type failed inside html.escape (``'int' object has no attribute
    'replace'``)."""
    if not isinstance(value, str):
        raise argument_error(name, f"must be a str, got {type(value).__name__} {value!r}", f"Pass the text, e.g. "
                             f"str({name})", kind=BcosTypeError)
    return value


def tokens_to_html(tokens: Sequence[str], scores: torch.Tensor | Sequence[float], caption: str = "",
                   explained_at: int | None = None) -> str:
    """One row of coloured tokens that wraps like text; each token's score shows on hover.

    Args:
        tokens: the tokens of one sequence, as they should be shown.
        scores: one finite score per token (a 1-D tensor or a sequence of numbers).
        caption: a line shown above the tokens.
        explained_at: the index in ``tokens`` of the token whose output was explained (a causal LM's or base
            model's ``position``): it is outlined and its hover text says so.

    Raises:
        BcosTypeError: ``scores`` is not a 1-D tensor or a sequence of numbers.
        BcosValueError: the lengths differ, a score is NaN or infinite, or ``explained_at`` is not a token's index.
    """
    if hasattr(tokens, "tokens") and hasattr(tokens, "scores"):  # was TypeError: object ... has no len()
        raise argument_error("tokens", f"got a {type(tokens).__name__}; tokens_to_html draws one row of tokens",
                             "Pass explanation.tokens(tokenizer)[i] and explanation.scores()[i], or the whole "
                             "explanation to explanations_to_html(explanation, tokenizer)", kind=BcosTypeError)
    if isinstance(tokens, str):  # each character was drawn as a token, beside the scores of the real tokens
        raise argument_error("tokens", f"got one string ({tokens[:40]!r}); each character would be drawn as a token",
                             "Pass the list of tokens, e.g. tokenizer.convert_ids_to_tokens(ids)", kind=BcosTypeError)
    if not hasattr(tokens, "__len__") or not all(isinstance(t, str) for t in tokens):
        # token ids (or a None of an unknown id) failed inside the page builder: "'int' object is not iterable"
        bad = next((t for t in tokens if not isinstance(t, str)), tokens) if hasattr(tokens, "__iter__") else tokens
        raise argument_error("tokens", f"must be a list of strings, got {type(bad).__name__} {bad!r}",
                             "Pass the tokens as text, e.g. tokenizer.convert_ids_to_tokens(ids)", kind=BcosTypeError)
    if type(scores).__module__ == "numpy" and getattr(getattr(scores, "dtype", None), "kind", "") in "biuf":
        # read as the tensor it holds, so that its dtype and shape meet the tensor's checks: a boolean array drew as
        # scores 1 and 0 (the tensor was refused), a 2-D one was refused as "must be numbers"
        scores = torch.as_tensor(scores)
    if isinstance(scores, torch.Tensor) and (scores.dtype == torch.bool or scores.is_complex()):
        # a boolean mask drew as scores 1 and 0
        raise argument_error("scores", f"must be real numbers, got a {scores.dtype} tensor",
                             "Pass the explanation's scores (explanation.scores()[i])", kind=BcosTypeError)
    if isinstance(scores, torch.Tensor):
        if scores.ndim != 1:
            raise argument_error("scores", f"must be one score per token (1-D), got shape {tuple(scores.shape)}",
                                 "Pass one row of an explanation, e.g. explanation.scores()[i]", kind=BcosTypeError)
        values = scores.detach().double().cpu().tolist()
    else:
        # real numbers only: float() also read True / False as 1 and 0 (a mask drew as scores, as a boolean tensor was
        # refused for) and the strings "1" / "0.5" as numbers
        items = list(scores) if hasattr(scores, "__iter__") and not isinstance(scores, str | bytes) else None
        bad = (scores if items is None
               else next((s for s in items if not _is_real_score(s)), None))
        if items is None or bad is not None:
            raise argument_error("scores", f"must be one real number per token, got {type(bad).__name__} {bad!r}",
                                 "Pass one float per token (e.g. explanation.scores()[i])", kind=BcosTypeError)
        values = [float(s) for s in items]
    if len(values) != len(tokens):
        raise argument_error("scores", f"has {len(values)} values for {len(tokens)} tokens",
                             "Pass exactly one score per token (padding removed from both)", kind=BcosValueError)
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise argument_error("scores", f"are NaN or infinite at token positions {bad[:10]}",
                             "Check the explanation (completeness_error) before rendering it", kind=BcosValueError)
    if isinstance(explained_at, numbers.Integral) and not isinstance(explained_at, bool):
        explained_at = int(explained_at)  # a NumPy index; True would mark token 1
    if explained_at is not None and not (type(explained_at) is int and 0 <= explained_at < len(tokens)):
        raise argument_error("explained_at", f"must be the index of one of the {len(tokens)} tokens, got "
                             f"{explained_at!r}", "Pass the explained token's index among the shown tokens")
    caption = _require_text("caption", caption)
    scale = max((abs(v) for v in values), default=0.0)
    spans = "<wbr>".join(_span(t, v, scale, k == explained_at) for k, (t, v) in enumerate(zip(tokens, values,
                                                                                            strict=True)))
    meta = f'<div class="meta">{_html.escape(caption)}</div>' if caption else ""
    return f'<div class="row" style="{_ROW_STYLE}">{meta}{spans}</div>'


def _name(value, label_names: Sequence[str] | None) -> str:
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, int) and label_names and 0 <= value < len(label_names):
        return label_names[value]
    if isinstance(value, Direction):  # its repr prints the whole vector into the caption
        return "a direction"
    if isinstance(value, torch.Tensor):
        return "a direction" if value.is_floating_point() else str(value.tolist())
    return str(value)


def _row_item(values, i: int):
    """The ``i``-th row's target or foil: a per-row id tensor, one shared value, or a direction."""
    if isinstance(values, torch.Tensor) and values.ndim >= 1 and not values.is_floating_point():
        return values[i]
    return values


def _contribution_total(explanation, row_scores: torch.Tensor) -> str:
    """The caption's total of a row's scores. Scores reduced with ``reduce="mean"`` are means over the features, so
    their sum is the value divided by the feature count (not the value): it is shown scaled back."""
    total = float(row_scores.sum())
    if getattr(explanation, "reduce", "sum") != "mean":
        return f"sum of contributions {total:.4g}"
    features = getattr(explanation, "input_contributions", None)
    if not isinstance(features, torch.Tensor):
        return f"sum of mean-reduced contributions {total:.4g} (the value divided by the feature count)"
    d = features.shape[-1]
    return f"sum of contributions (each a mean over {d} features) {total:.4g} × {d} = {total * d:.4g}"


def _byte_alphabet() -> dict[str, int]:
    """The character each byte stands for in a byte-level BPE vocabulary (GPT-2's table, which Llama 3, Qwen and
    every ``tokenizers.decoders.ByteLevel`` share): printable bytes as themselves, the others shifted past 255."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + k): b for k, b in enumerate(shifted)}}


_BYTE_OF = _byte_alphabet()


def _is_byte_level(tokenizer) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__ == "ByteLevel" or isinstance(getattr(tokenizer, "byte_decoder", None), dict)


def shown_tokens(tokenizer, tokens: list[str]) -> list[str]:
    """``tokens`` as the pages draw them: a byte-level BPE tokenizer's tokens (GPT-2, Llama 3, Qwen) as the text
    their bytes stand for, where they were drawn in the byte alphabet (" café" as "ĠcafÃ©", Hebrew as "×©", text not
    in the input); a character split across tokens (an emoji) shows each token's bytes escaped (``\\xf0\\x9f``).
    Other tokenizers' tokens (WordPiece's ``##``, SentencePiece's ``▁``) and tokens outside the byte alphabet (added
    tokens) are drawn as they are."""
    if not _is_byte_level(tokenizer):
        return tokens
    return [bytes(_BYTE_OF[c] for c in token).decode("utf-8", errors="backslashreplace")
            if token and all(c in _BYTE_OF for c in token) else token for token in tokens]


def require_token_explanation(explanation, argument: str = "explanation") -> None:
    """Refuse what is not one token explanation (Captum's attribution tensor, a list of explanations, an image
    explanation: each failed with an AttributeError or TypeError from inside the page builder)."""
    if hasattr(explanation, "tokens") and hasattr(explanation, "scores") and hasattr(explanation, "explained"):
        return
    kind = type(explanation).__name__
    if kind == "ImageExplanation":
        fix = "Draw image explanations with bcos_plugins.vision.visualize.save_explanation_figure"
    elif isinstance(explanation, torch.Tensor):
        fix = ("For another method's (or Captum's) attributions pass per-token scores and tokens: tokens_to_html(tokens, "
               "scores) or visualization_records(scores=..., tokens=...), with (pos, dim) attributions summed over "
               "the last dimension")
    elif isinstance(explanation, list | tuple):
        fix = "Pass one explanation per call (explanation_sections_to_html takes (heading, explanation) pairs)"
    else:
        fix = "Pass the TokenExplanation that bcos_plugins.explain or explain_logits returned"
    raise argument_error(argument, f"expected a token explanation (from explain / explain_logits), got {kind}", fix,
                         kind=BcosTypeError)


def explanation_tokens(explanation, tokenizer) -> list[list[str]]:
    """``explanation.tokens(tokenizer)`` (which refuses ids the tokenizer does not have: another model's tokenizer),
    with a fix text for the page builders' callers when no tokenizer object was passed."""
    if not callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        # token strings or a hub name in the tokenizer's place failed with "'list' object has no attribute
        # 'convert_ids_to_tokens'" (visualization_records, explanations_to_html)
        raise argument_error("tokenizer", f"expected the tokenizer of the explained model (an object with "
                             f"convert_ids_to_tokens), got {type(tokenizer).__name__}",
                             "Pass the tokenizer object (the explanation holds the ids); to show your own tokens "
                             "use visualization_records(scores=..., tokens=...)", kind=BcosTypeError)
    return explanation.tokens(tokenizer)


def explained_token_index(explanation, i: int) -> int | None:
    """The index among row ``i``'s shown tokens (padding removed) of the token whose output was explained, or
    ``None`` (a classifier's, or an explanation without a position)."""
    position = getattr(explanation, "position", None)
    if position is None:
        return None
    column = int(position[i]) if isinstance(position, torch.Tensor) and position.ndim else int(position)
    mask = getattr(explanation, "attention_mask", None)
    if mask is None:
        return column
    # the padded column counted among the row's real tokens (left padding shifts every column)
    return int(mask[i][:column].bool().sum())


def _explanation_rows(explanation, tokenizer, label_names: Sequence[str] | None,
                      captions: Sequence[str] | None) -> str:
    require_token_explanation(explanation)
    label_names = require_label_names(label_names)
    tokens, scores = [shown_tokens(tokenizer, row) for row in explanation_tokens(explanation, tokenizer)], explanation.scores()
    if isinstance(captions, str):  # one caption per character: "ab" captioned two rows "a" and "b"
        raise argument_error("captions", f"got one string ({captions[:40]!r}); each character would caption a row",
                             "Pass a list of captions, one per explained row", kind=BcosTypeError)
    if captions is not None and len(captions) != len(tokens):
        raise argument_error("captions", f"has {len(captions)} entries for {len(tokens)} rows",
                             "Pass one caption per explained row, or none")
    foil = getattr(explanation, "foil", None)
    rows = []
    for i, (row_tokens, row_scores, value) in enumerate(zip(tokens, scores, explanation.explained, strict=True)):
        name = _name(_row_item(explanation.target, i), label_names)
        if foil is not None:
            name = f"{name} − {_name(_row_item(foil, i), label_names)}"
        at = explained_token_index(explanation, i)
        if at is not None:  # a causal LM's or base model's output at one token: the row's other tokens were not it
            name = f"{name} at token {at} ({row_tokens[at]})"
        # 4 significant digits, not 4 decimals: a B = 10 model's logit of 3e-6 read "value 0.0000" (and its sum)
        caption = f"explained: {name} — value {float(value):.4g}, {_contribution_total(explanation, row_scores)}"
        if captions is not None:
            caption = f"{captions[i]} · {caption}"
        rows.append(tokens_to_html(row_tokens, row_scores, caption, explained_at=at))
    return "".join(rows)


# each row's colours are scaled to its own largest |score|: a row of scores near 0.001 was as deep as a row near 10,
# and the legend did not say so
COLOUR_SCALE_NOTE = (" Colour depth is relative to the largest |score| in each row (that token is fully coloured): compare "
               "rows by their scores, not their colours.")


def _page(title: str, body: str) -> str:
    title = _require_text("title", title)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{_STYLE}</style></head><body><h1>{_html.escape(title)}</h1>"
            "<p class='meta'>green: supports the explained output; red: opposes it. Hover over a token for "
            f"its score.{COLOUR_SCALE_NOTE}</p>{body}</body></html>")


def explanations_to_html(explanation, tokenizer, label_names: Sequence[str] | None = None,
                         title: str = "Explanations", captions: Sequence[str] | None = None) -> str:
    """A full HTML page for a :class:`~bcos_plugins.attribution.TokenExplanation` batch, one row per example.

    Each row's caption names what was explained (the class, or ``target − foil`` for a contrastive
    explanation; for a causal LM or base model also the token whose output was explained, which is outlined), the
    explained value and the sum of the contributions (equal for a complete explanation; for
    ``reduce="mean"`` scores, means over the features, the sum times the feature count);
    ``captions`` adds a line of your own per row (e.g. the true label).
    """
    return _page(title, _explanation_rows(explanation, tokenizer, label_names, captions))


def explanation_sections_to_html(sections: Sequence[tuple], tokenizer, label_names: Sequence[str] | None = None,
                                 title: str = "Explanations") -> str:
    """One HTML page with a headed section per explanation batch, e.g. a class, the other class, a contrast.

    Args:
        sections: ``(heading, explanation)`` or ``(heading, explanation, captions)`` tuples, in page order.
        tokenizer, label_names, title: as for :func:`explanations_to_html`.
    """
    if hasattr(sections, "tokens") or isinstance(sections, torch.Tensor):  # was TypeError: ... is not iterable
        raise argument_error("sections", f"got one {type(sections).__name__}, not a list of sections",
                             "Pass [(heading, explanation), ...], or call explanations_to_html(explanation, tokenizer)",
                             kind=BcosTypeError)
    body = []
    for k, section in enumerate(sections):
        if not isinstance(section, tuple) or len(section) not in (2, 3):
            raise argument_error(f"sections[{k}]", "must be (heading, explanation) or (heading, explanation, "
                                 "captions)", "Pass a list of such tuples", kind=BcosTypeError)
        heading, explanation, captions = (*section, None)[:3]
        require_token_explanation(explanation, f"sections[{k}]'s explanation")
        body.append(f"<h2>{_html.escape(str(heading))}</h2>"
                    + _explanation_rows(explanation, tokenizer, label_names, captions))
    return _page(title, "".join(body))
