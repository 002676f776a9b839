"""Captum adapter: B-cos explanations as Captum attribution methods.

B-cos explanations are input x gradient inside :func:`~bcos_plugins.nn.explanation_mode` (docs/design.md#one-explanation-mechanism), so
both classes here are thin: they switch the model into explanation mode around Captum's own gradient
machinery and add the completeness check as Captum's convergence delta.

- :class:`BcosAttribution` (a ``captum.attr.GradientAttribution``): attributions ``W(x) x`` at the inputs of
  ``forward_func``. For transformers models the inputs must be the combined embedding (word + position +
  token type), which :class:`EmbeddingForward` provides; then ``sum(attributions) == logit`` exactly and
  ``delta`` (``return_convergence_delta=True``) is ``sum(attributions) - explained output`` per example.
- :class:`LayerBcos` (a ``captum.attr.LayerGradientXActivation``): the same at a layer's input or output
  (default: the model's combined-embedding point). It is accepted by ``captum.attr.LLMGradientAttribution``,
  so Captum's LLM workflow runs with B-cos unchanged. That workflow explains the *log-probability* of each
  target token; B-cos decomposes logits exactly, not log-softmax, so there the attributions do not sum to the
  explained value (use :class:`BcosAttribution` with an :class:`EmbeddingForward` to explain a logit exactly).
- :func:`visualization_records` and :func:`records_to_html`: Captum ``VisualizationDataRecord`` objects from
  an :class:`~bcos_plugins.explain.Explanation` (or any token scores), and a self-contained HTML page for them
  that does not need IPython (Captum's ``visualize_text`` returns an IPython display object).

Which model is put into explanation mode: ``forward_func`` itself when it is an ``nn.Module`` (a B-cos model,
or an :class:`EmbeddingForward` wrapping one); otherwise pass ``model=``. A model without B-cos
(dynamic-weight) modules is refused with a ``TypeError``: its input x gradient is not ``W(x) x``.

>>> fwd = EmbeddingForward(bcos_model)
>>> emb = fwd.embed(input_ids, attention_mask)
>>> attr, delta = BcosAttribution(fwd).attribute(emb, target=1, additional_forward_args=(attention_mask,),
...                                              return_convergence_delta=True)
>>> attr.sum(dim=(1, 2))   # == the class-1 logits; delta ~ 0
"""

from __future__ import annotations

import html as _html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from captum._utils.common import (
    _format_additional_forward_args,
    _format_output,
    _format_tensor_into_tuples,
    _is_tuple,
    _run_forward,
)
from captum._utils.typing import TargetType
from captum.attr import GradientAttribution, LayerGradientXActivation
from captum.attr._utils.visualization import VisualizationDataRecord
from jaxtyping import Float, Int
from torch import Tensor, nn

from bcos_plugins.convert.architectures import spec_for
from bcos_plugins.attribution import last_real_position
from bcos_plugins.explain import Explanation
from bcos_plugins.nn.dynamic import DynamicWeightModule, explanation_mode

__all__ = [
    "BcosAttribution",
    "EmbeddingForward",
    "LayerBcos",
    "records_to_html",
    "save_records_html",
    "visualization_records",
]


def _has_bcos_modules(model: nn.Module) -> bool:
    return any(isinstance(m, DynamicWeightModule) for m in model.modules())


def _resolve_model(forward_func: Callable, model: nn.Module | None, who: str) -> nn.Module:
    """The module to put into explanation mode, checked to contain B-cos modules."""
    if model is None:
        if not isinstance(forward_func, nn.Module):
            raise TypeError(
                f"{who} needs the model to put into explanation mode: forward_func is a plain function, so pass "
                f"model=<the B-cos model it calls>, e.g. {who}(forward_func, model=bcos_model)"
            )
        model = forward_func
    if isinstance(model, EmbeddingForward):
        # explanation_mode restores the training flag of the module it is given; the wrapper's own flag
        # would otherwise overwrite the wrapped model's (and switch dropout on) on exit.
        model = model.model
    if not _has_bcos_modules(model):
        raise TypeError(
            f"{who}: {type(model).__name__} has no B-cos (dynamic-weight) modules, so its input x gradient is "
            "not an exact W(x)x explanation. Convert it with bcos_plugins.bcosify(model) and fine-tune it, or "
            "use captum.attr.InputXGradient for plain input x gradient on a conventional model."
        )
    return model


class _ReplaceEmbedding(Exception):
    """Raised inside the embedding hook to stop a forward pass that only had to compute the embedding."""


class EmbeddingForward(nn.Module):
    """A transformers model as a function of its combined embedding: ``f(embeddings, attention_mask)``.

    The combined embedding (word + position + token type; token embeddings for Llama) is the attribution
    point where B-cos completeness holds (docs/design.md#the-attribution-point). ``forward`` runs the wrapped model with that tensor
    swapped in (a hook at the architecture's embedding point; the ids it is called with are placeholders), so
    Captum methods (B-cos, IxG, IG, Saliency, Occlusion, Shapley sampling, LIME) all attribute at the same
    point and can be compared. ``embed`` computes the combined embedding of real ids (inputs and baselines).

    Output: classifier logits ``(batch, classes)``; causal LMs: next-token logits at the last real token
    ``(batch, vocab)``.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.spec = spec_for(model)
        self.train(model.training)
        if not self.spec.is_classifier and not hasattr(model, "lm_head"):
            raise TypeError(f"EmbeddingForward wraps sequence classifiers and causal LMs; {type(model).__name__} "
                            "has neither class logits nor an LM head")

    def _hook(self, replace: Callable[[Tensor], Tensor]):
        module, where = self.spec.embedding_module(self.model)
        if where == "input":
            return module.register_forward_pre_hook(lambda m, args: (replace(args[0]), *args[1:]))
        return module.register_forward_hook(lambda m, args, out: replace(out))

    def _position_ids(self, attention_mask: Tensor) -> Tensor | None:
        # As explain() does for decoders: positions count real tokens, so left padding does not shift them.
        if self.spec.kind != "decoder":
            return None
        return (attention_mask.cumsum(-1) - 1).clamp_min(0)

    @torch.no_grad()
    def embed(self, input_ids: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None,
              **forward_kwargs) -> Float[Tensor, "batch pos d_model"]:
        """Combined embedding of ``input_ids`` (the forward pass stops right after computing it)."""
        captured: list[Tensor] = []

        def grab(t: Tensor) -> Tensor:
            captured.append(t.detach().clone())
            raise _ReplaceEmbedding

        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        if self.spec.kind == "decoder" and "position_ids" not in forward_kwargs:
            forward_kwargs["position_ids"] = self._position_ids(mask)
        handle = self._hook(grab)
        try:
            self.model(input_ids=input_ids, attention_mask=mask, **forward_kwargs)
        except _ReplaceEmbedding:
            pass
        finally:
            handle.remove()
        return captured[0]

    def forward(self, embeddings: Float[Tensor, "batch pos d_model"],
                attention_mask: Int[Tensor, "batch pos"] | None = None) -> Tensor:
        batch, length = embeddings.shape[:2]
        mask = attention_mask if attention_mask is not None else torch.ones(
            batch, length, dtype=torch.long, device=embeddings.device)
        if mask.shape != (batch, length):
            raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match embeddings "
                             f"{tuple(embeddings.shape[:2])}")
        placeholder_ids = torch.zeros(batch, length, dtype=torch.long, device=embeddings.device)
        kwargs = {}
        if self.spec.kind == "decoder":
            kwargs["position_ids"] = self._position_ids(mask)
        handle = self._hook(lambda t: embeddings.to(t.dtype))
        try:
            out = self.model(input_ids=placeholder_ids, attention_mask=mask, **kwargs)
        finally:
            handle.remove()
        logits = out.logits
        if logits.ndim == 3:
            logits = logits[torch.arange(batch, device=logits.device), last_real_position(mask)]
        return logits


class _Logits(nn.Module):
    """A transformers model called Captum-style (positional tensors) returning a logits tensor.

    Captum selects targets on tensors; transformers returns a ``ModelOutput``. Causal LM logits are taken at
    the last real token (from the attention mask when one is passed second), as in :class:`EmbeddingForward`.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        try:
            self.is_decoder = spec_for(model).kind == "decoder"
        except TypeError:  # a transformers class bcosify does not know: no decoder-specific positions
            self.is_decoder = False

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        kwargs = {"position_ids": (mask.cumsum(-1) - 1).clamp_min(0)} if self.is_decoder else {}
        # keywords: the second positional parameter of transformers decoders is the cache, not the mask
        logits = self.model(input_ids=input_ids, attention_mask=mask, **kwargs).logits
        if logits.ndim == 3:
            logits = logits[torch.arange(logits.shape[0], device=logits.device), last_real_position(mask)]
        return logits


def _returns_model_output(forward_func: Callable) -> bool:
    from transformers import PreTrainedModel

    return isinstance(forward_func, PreTrainedModel)


class BcosAttribution(GradientAttribution):
    """B-cos explanation ``W(x) x`` as a Captum attribution method (see the module docstring).

    Args:
        forward_func: the B-cos model, an :class:`EmbeddingForward` around one, or any function of tensors
            whose computation runs through a B-cos model (then pass ``model=``).
        model: the module to put into explanation mode; defaults to ``forward_func`` if it is a module.
    """

    def __init__(self, forward_func: Callable[..., Tensor], model: nn.Module | None = None) -> None:
        self.model = _resolve_model(forward_func, model, type(self).__name__)
        GradientAttribution.__init__(self, forward_func)

    @property
    def multiplies_by_inputs(self) -> bool:
        return True

    def has_convergence_delta(self) -> bool:
        return True

    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetType = None,
        additional_forward_args: Any = None,
        return_convergence_delta: bool = False,
    ) -> Tensor | tuple[Tensor, ...] | tuple[Tensor | tuple[Tensor, ...], Tensor]:
        """Attributions ``x * d out[target] / d x`` in explanation mode, shaped like ``inputs``.

        Args:
            inputs: tensor or tuple of tensors, first dimension = examples.
            target: Captum's target (int, per-example tensor/list, or None for scalar-per-example outputs).
            additional_forward_args: passed after ``inputs`` to ``forward_func`` (e.g. the attention mask).
            return_convergence_delta: also return ``delta = sum(attributions) - out[target]`` per example
                (the completeness error; ~1e-6 relative for B-cos models, exactly what Captum's IG calls delta
                with a zero baseline, since a bias-free B-cos network maps 0 to 0).
        """
        is_tuple = _is_tuple(inputs)
        inputs_t = _format_tensor_into_tuples(inputs)
        extra = _format_additional_forward_args(additional_forward_args)
        with torch.enable_grad(), explanation_mode(self.model):
            leaves = tuple(x.detach().requires_grad_(True) for x in inputs_t)
            explained = _run_forward(self.forward_func, leaves, target, extra)
            if explained.ndim != 1 or explained.shape[0] != leaves[0].shape[0]:
                raise ValueError(
                    "the selected output must be one scalar per example; got shape "
                    f"{tuple(explained.shape)} for {leaves[0].shape[0]} examples. Pass target= for "
                    "multi-output functions (class index, or one per example)."
                )
            grads = torch.autograd.grad(explained.sum(), leaves)
        attributions = tuple(x.detach() * g for x, g in zip(leaves, grads, strict=True))
        formatted = _format_output(is_tuple, attributions)
        if not return_convergence_delta:
            return formatted
        total = sum(a.reshape(a.shape[0], -1).sum(-1) for a in attributions)
        return formatted, total - explained.detach()


class LayerBcos(LayerGradientXActivation):
    """B-cos explanation at a layer's input or output; usable in ``captum.attr.LLMGradientAttribution``.

    Args:
        forward_func: the B-cos model (``LLMGradientAttribution`` requires the model itself).
        layer: the module to attribute at. Default: the architecture's combined-embedding point (for BERT and
            GPT-2 the *input* of ``embeddings.LayerNorm`` / ``drop``; for Llama the output of
            ``embed_tokens``), where attributions are complete.
        model: the module to put into explanation mode; defaults to ``forward_func`` if it is a module.
        attribute_to_layer_input: default for :meth:`attribute`; ``None`` picks the embedding point's side
            when ``layer`` is left at its default, and the layer output otherwise.
    """

    def __init__(self, forward_func: Callable[..., Tensor], layer: nn.Module | None = None,
                 model: nn.Module | None = None, attribute_to_layer_input: bool | None = None,
                 device_ids: list[int] | None = None) -> None:
        self.model = _resolve_model(forward_func, model, type(self).__name__)
        default_side = False
        if layer is None:
            try:
                layer, where = spec_for(self.model).embedding_module(self.model)
            except TypeError as err:
                raise TypeError(f"LayerBcos: no default embedding layer for {type(self.model).__name__}; "
                                "pass layer=<module>") from err
            default_side = where == "input"
        self._to_layer_input = default_side if attribute_to_layer_input is None else attribute_to_layer_input
        super().__init__(forward_func, layer, device_ids=device_ids, multiply_by_inputs=True)
        # LLMGradientAttribution needs forward_func to be the model itself (it calls generate and replaces
        # forward_func on its copy); called directly, a transformers model's ModelOutput is unwrapped.
        self._model_forward = forward_func if _returns_model_output(forward_func) else None
        self._logits_forward = _Logits(forward_func) if self._model_forward is not None else None

    def has_convergence_delta(self) -> bool:
        return True

    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetType = None,
        additional_forward_args: Any = None,
        attribute_to_layer_input: bool | None = None,
        grad_kwargs: dict[str, Any] | None = None,
        return_convergence_delta: bool = False,
    ):
        """Layer activation x gradient in explanation mode (Captum's ``LayerGradientXActivation`` maths).

        With ``return_convergence_delta=True`` also returns ``sum(attributions) - out[target]`` per example
        (one extra forward pass); it is ~0 at the combined embedding of a B-cos model.
        """
        to_input = self._to_layer_input if attribute_to_layer_input is None else attribute_to_layer_input
        saved_forward = self.forward_func
        if self._model_forward is not None and saved_forward is self._model_forward:
            self.forward_func = self._logits_forward
        try:
            with explanation_mode(self.model):
                attributions = super().attribute(inputs, target=target,
                                                 additional_forward_args=additional_forward_args,
                                                 attribute_to_layer_input=to_input, grad_kwargs=grad_kwargs)
                attributions = (tuple(a.detach() for a in attributions) if isinstance(attributions, tuple)
                                else attributions.detach())
                if not return_convergence_delta:
                    return attributions
                with torch.no_grad():
                    explained = _run_forward(self.forward_func, _format_tensor_into_tuples(inputs), target,
                                             _format_additional_forward_args(additional_forward_args))
        finally:
            self.forward_func = saved_forward
        parts = attributions if isinstance(attributions, tuple) else (attributions,)
        total = sum(a.reshape(a.shape[0], -1).sum(-1) for a in parts)
        return attributions, (total - explained.reshape(total.shape)).detach()


def visualization_records(
    explanation: Explanation | None = None,
    tokenizer=None,
    *,
    scores: Sequence[Tensor] | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
    logits: Tensor | None = None,
    true_labels: Sequence[int] | None = None,
    attributed_class: Sequence[int] | None = None,
    label_names: Sequence[str] | None = None,
) -> list[VisualizationDataRecord]:
    """Captum ``VisualizationDataRecord``s, one per example.

    Either from an :class:`~bcos_plugins.explain.Explanation` plus its tokenizer (tokens, scores, explained
    class and completeness error are taken from it; ``logits`` = the model's class logits give the predicted
    class and its probability), or from any method's per-example ``scores`` and ``tokens``.
    ``convergence_score`` holds the completeness error for B-cos explanations (0 if unknown).
    Class ids are turned into ``label_names`` when given, as Captum's own examples do.
    """
    if explanation is not None:
        if tokenizer is None:
            raise ValueError("visualization_records(explanation, tokenizer): the tokenizer is needed to turn "
                             "input ids into tokens")
        tokens = explanation.tokens(tokenizer)
        scores = explanation.scores()
        attributed_class = attributed_class if attributed_class is not None else explanation.target.tolist()
        delta = explanation.completeness_error.tolist()
    else:
        if scores is None or tokens is None:
            raise ValueError("pass an Explanation (with its tokenizer) or both scores= and tokens=")
        delta = [0.0] * len(scores)
    n = len(scores)
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} token rows but {len(scores)} score rows")

    def name(i):
        if i is None:
            return "-"
        return label_names[int(i)] if label_names is not None else int(i)

    records = []
    for i in range(n):
        row = torch.as_tensor(scores[i], dtype=torch.float32).detach().cpu()
        if row.shape != (len(tokens[i]),):
            raise ValueError(f"example {i}: {len(tokens[i])} tokens but scores of shape {tuple(row.shape)}")
        if logits is not None:
            probs = logits[i].detach().float().softmax(-1)
            pred = int(probs.argmax())
            pred_prob = float(probs[pred])
        else:
            pred, pred_prob = None, float("nan")
        attr_cls = attributed_class[i] if attributed_class is not None else pred
        records.append(VisualizationDataRecord(
            word_attributions=row,
            pred_prob=pred_prob,
            pred_class=name(pred),
            true_class=name(true_labels[i] if true_labels is not None else None),
            attr_class=name(attr_cls),
            attr_score=float(row.sum()),
            raw_input_ids=list(tokens[i]),
            convergence_score=float(delta[i]),
        ))
    return records


def records_to_html(records: Sequence[VisualizationDataRecord], title: str = "Attributions") -> str:
    """A self-contained HTML page (no IPython) with the columns of Captum's ``visualize_text``."""
    from bcos_plugins.visualize import tokens_to_html

    head = ("<tr><th>True label</th><th>Predicted label (prob.)</th><th>Attribution label</th>"
            "<th>Attribution score</th><th>Convergence / completeness error</th><th>Word importance</th></tr>")
    rows = []
    for r in records:
        row_html = tokens_to_html(list(r.raw_input_ids), r.word_attributions)
        rows.append(
            f"<tr><td>{_html.escape(str(r.true_class))}</td>"
            f"<td>{_html.escape(str(r.pred_class))} ({r.pred_prob:.2f})</td>"
            f"<td>{_html.escape(str(r.attr_class))}</td><td>{r.attr_score:.3f}</td>"
            f"<td>{r.convergence_score:.2e}</td><td>{row_html}</td></tr>"
        )
    # the token column takes the width the others leave (a width hint, never a horizontal scrollbar)
    style = ("body{font-family:system-ui,sans-serif;margin:2em} table{border-collapse:collapse;width:100%} "
             "td:last-child{width:55%} "
             "td,th{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left} "
             ".row{margin:0;line-height:2em} .tok{padding:.1em .2em;border-radius:.2em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{_html.escape(title)}</h1>"
            "<p>green: supports the attributed class; red: opposes it.</p>"
            f"<table>{head}{''.join(rows)}</table></body></html>")


def save_records_html(records: Sequence[VisualizationDataRecord], path: str | Path,
                      title: str = "Attributions") -> Path:
    """Write :func:`records_to_html` to ``path`` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(records_to_html(records, title), encoding="utf-8")
    return path
