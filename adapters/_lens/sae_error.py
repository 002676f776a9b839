"""How much of an explained value flows through spliced SAEs' error terms (no sae-lens import needed).

sae-lens' ``HookedSAETransformer.add_sae(sae, use_error_term=True)`` splices ``reconstruction + error`` into
the model, with the error term computed under ``torch.no_grad()``: an explanation at the embeddings sees only
the reconstruction path. Everything after an SAE is linear in explanation mode, so the error term's share of
the explained value is exactly ``sum(error * d explained / d sae_output)``. :func:`sae_error_capture` records
the error terms and those gradients during one explanation (any code that runs a forward and a backward
inside it), and :meth:`SAEErrorCapture.shares` returns them per SAE hook.

Wiring into an explanation function::

    with sae_error_capture(model) as capture:     # a no-op capture when no SAEs are attached
        step = input_x_gradient(compute, model)
    error_shares = capture.shares()               # {hook name: (batch,)}; {} without error terms
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from bcos_plugins.errors import BcosRuntimeError

__all__ = ["SAEErrorCapture", "SAEErrorShares", "sae_error_capture"]


class SAEErrorShares:
    """The ``sae_error_share`` of a result that holds ``sae_error_shares`` ({hook name: (batch,)} or None) and
    ``explained`` (batch,): the lens explanation and the token x component table share it."""

    @property
    def sae_error_share(self) -> Tensor:
        """The spliced SAEs' error terms' share of ``explained`` per row (0 without SAEs): no token carries it."""
        if not self.sae_error_shares:
            return torch.zeros_like(self.explained)
        return sum(self.sae_error_shares.values())


class SAEErrorCapture:
    """Error terms and output gradients of the SAEs attached to a model, filled while the capture is open."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.errors: dict[str, Tensor] = {}
        self.gradients: dict[str, Tensor] = {}

    def keep_error(self, activation: Tensor, hook) -> Tensor:
        self.errors[hook.name.rsplit(".", 1)[0]] = activation.detach()
        return activation

    def keep_gradient(self, activation: Tensor, hook) -> Tensor:
        name = hook.name.rsplit(".", 1)[0]
        if activation.requires_grad:
            activation.register_hook(lambda g: self.gradients.__setitem__(name, g.detach()))
        return activation

    def shares(self) -> dict[str, Tensor]:
        """``{SAE hook name: (batch,) error share}`` for the SAEs that used an error term in the last forward."""
        out = {}
        for name in self.names:
            if name not in self.errors:  # use_error_term=False: the reconstruction replaces the activation
                continue
            if name not in self.gradients:
                raise BcosRuntimeError(
                    f"the explained value has no gradient at the SAE on {name!r} (no active feature reaches the "
                    "embeddings), so its error share cannot be measured. Explain another position or target.")
            out[name] = (self.errors[name] * self.gradients[name]).flatten(1).sum(-1)
        return out


@contextmanager
def sae_error_capture(model: nn.Module) -> Iterator[SAEErrorCapture]:
    """Record the attached SAEs' error terms and output gradients while the block runs (see the module doc)."""
    names = list(getattr(model, "acts_to_saes", None) or {})
    capture = SAEErrorCapture(names)
    if not names:
        yield capture
        return
    hooks = []
    for name in names:
        hooks += [(f"{name}.hook_sae_error", capture.keep_error), (f"{name}.hook_sae_output", capture.keep_gradient)]
    with model.hooks(fwd_hooks=hooks):  # an outer hook level: run_with_hooks inside keeps these
        yield capture
