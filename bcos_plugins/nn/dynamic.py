"""The one explanation mechanism of the package: dynamic-weight modules and ``explanation_mode``.

Every module whose output can be written ``W(x) x`` with an input-dependent ``W`` derives from
:class:`DynamicWeightModule`. Inside :func:`explanation_mode` such a module treats ``W(x)`` as a constant for
autograd (it detaches the factor that makes up the dynamic weight). The whole network is then a
linear map of its input as far as autograd can see, so for any scalar output ``y``

    x · dy/dx = y            (completeness)

and every explanation in the project is plain input x gradient inside this mode. Forward values are
bit-identical in and out of the mode: both paths run the same arithmetic, one of them detached.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn

__all__ = ["DynamicWeightModule", "explanation_mode", "is_explaining"]


class DynamicWeightModule(nn.Module):
    """Mixin for modules computing ``W(x) x``; ``explaining`` switches ``W(x)`` to a constant."""

    explaining: bool = False

    def dynamic_weight(self, factor: Tensor) -> Tensor:
        """Return ``factor`` as it must enter the product: detached while explaining."""
        return factor.detach() if self.explaining else factor

    def dynamic_scope(self) -> AbstractContextManager:
        """Context for computing the dynamic factor: ``torch.no_grad()`` while explaining.

        The factor is detached then anyway; computing it without recording the autograd graph saves the
        time and memory of saving its intermediate tensors. The arithmetic (and so the value) is the same.
        """
        return torch.no_grad() if self.explaining else nullcontext()


def is_explaining(module: nn.Module) -> bool:
    """True if any dynamic-weight submodule of ``module`` is in explanation mode."""
    return any(m.explaining for m in module.modules() if isinstance(m, DynamicWeightModule))


@contextmanager
def explanation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Make every dynamic weight of ``model`` a constant for autograd while the block runs.

    Nested and re-entrant use is safe: each module's previous state is restored on exit, also when the
    block raises. The model is put in eval mode for the duration (dropout would otherwise make the
    explained function random) and its training flag is restored afterwards.

    >>> with explanation_mode(model):
    ...     emb = embeddings.detach().requires_grad_()
    ...     logit = model_from_embeddings(emb)[0, c]
    ...     contributions = emb * torch.autograd.grad(logit, emb)[0]   # sums to logit
    """
    modules = [m for m in model.modules() if isinstance(m, DynamicWeightModule)]
    previous = [m.explaining for m in modules]
    was_training = model.training
    model.eval()
    for m in modules:
        m.explaining = True
    try:
        yield model
    finally:
        for m, state in zip(modules, previous, strict=True):
            m.explaining = state
        model.train(was_training)

