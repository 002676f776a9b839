"""Self-contained HTML for signed token explanations.

Written by hand rather than with Captum's ``visualize_text`` because that needs IPython and a notebook;
this page opens in any browser and is what ``make demo`` writes. Green = supports the explained class,
red = opposes it; intensity is relative to the largest magnitude in the row.
"""

from __future__ import annotations

import html as _html

import torch

__all__ = ["explanations_to_html", "tokens_to_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 60em; }
.row { margin: 1.2em 0; line-height: 2.1em; }
.tok { padding: 0.15em 0.25em; margin: 0 0.05em; border-radius: 0.25em; }
.meta { color: #555; font-size: 0.9em; }
"""


def _colour(score: float, scale: float) -> str:
    a = min(1.0, abs(score) / scale) if scale > 0 else 0.0
    return f"rgba(0,150,0,{a:.3f})" if score >= 0 else f"rgba(210,0,0,{a:.3f})"


def tokens_to_html(tokens: list[str], scores: torch.Tensor | list[float], caption: str = "") -> str:
    """One row of coloured tokens; the score shows on hover."""
    values = [float(s) for s in scores]
    if len(values) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(values)} scores")
    scale = max((abs(v) for v in values), default=0.0)
    spans = "".join(
        f'<span class="tok" style="background:{_colour(v, scale)}" title="{v:+.4f}">{_html.escape(t)}</span>'
        for t, v in zip(tokens, values, strict=True)
    )
    meta = f'<div class="meta">{_html.escape(caption)}</div>' if caption else ""
    return f'<div class="row">{meta}{spans}</div>'


def explanations_to_html(explanation, tokenizer, label_names: list[str] | None = None,
                         title: str = "Explanations") -> str:
    """A full HTML page for an :class:`~bcos_plugins.explain.Explanation` batch."""
    rows = []
    for tokens, scores, logit, target in zip(explanation.tokens(tokenizer), explanation.scores(),
                                             explanation.logits, explanation.target, strict=True):
        name = label_names[int(target)] if label_names and not target.is_floating_point() else str(target.tolist())
        caption = (f"explained: {name} — value {float(logit):.4f}, sum of contributions "
                   f"{float(scores.sum()):.4f}")
        rows.append(tokens_to_html(tokens, scores, caption))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{_html.escape(title)}</h1>"
            f"<p class='meta'>green: supports the explained output; red: opposes it.</p>{''.join(rows)}"
            "</body></html>")
