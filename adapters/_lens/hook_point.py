"""``DynamicHookPoint``: a TransformerLens hook point that carries a dynamic weight.

Every input-dependent factor ``W(x)`` of a TransformerLens model passes through a hook point: the norms'
``hook_scale`` (``1/scale`` is the dynamic weight of ``x / scale``), attention's ``hook_pattern`` (the
dynamic weight of ``pattern @ v``), a gated MLP's ``hook_pre`` (the whole gate branch is the dynamic weight
of ``act(pre) * pre_linear``) and the B-cos components' ``hook_bcos_scale_*``. Replacing those hook points
by this subclass makes the model explainable with the package's one mechanism,
:func:`bcos_plugins.nn.explanation_mode`: inside it the factor leaves the hook point detached::

    hook(x) = x                     (forward value, in and out of explanation mode)
    d hook(x) / dx = 0              (in explanation mode)

Hooks added by users still run (on the detached tensor while explaining) and the hook's name is unchanged.
"""

from __future__ import annotations

from torch import Tensor
from transformer_lens.hook_points import HookPoint

from bcos_plugins.nn.dynamic import DynamicWeightModule
from bcos_plugins.nn.functional import bcos_product, bcos_scale

__all__ = ["DynamicHookPoint", "hooked_bcos_product"]


class DynamicHookPoint(HookPoint, DynamicWeightModule):
    """A ``HookPoint`` whose output is a constant for autograd in explanation mode."""

    def forward(self, x: Tensor) -> Tensor:
        return self.dynamic_weight(x)


def hooked_bcos_product(lin: Tensor, x_norm: Tensor, b: float, hook: DynamicHookPoint) -> Tensor:
    """``scale * lin`` with ``scale = |lin / ||x|| | ** (B - 1)``, the scale passing through ``hook``.

    Without hooks on ``hook`` (a plain forward pass, or a cache that leaves the scale out) the hook point is
    the identity (detaching in explanation mode), so the product runs as the fused B-cos kernel of
    :func:`bcos_plugins.nn.functional.bcos_product`. A hook must see (and may replace) the scale tensor
    itself, and a backward hook its gradient, so then the scale is computed as a tensor and passed through.
    Both compute the same values (the fused and reference paths agree to rounding).
    """
    if hook._forward_hooks or hook._forward_pre_hooks or hook._backward_hooks or hook._backward_pre_hooks \
            or _global_module_hooks():
        return hook(bcos_scale(lin, x_norm, b)) * lin
    return bcos_product(lin, x_norm, b, hook.holds_constant())


def _global_module_hooks() -> bool:
    """Whether hooks registered for every module (``torch.nn.modules.module.register_module_*_hook``) exist."""
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks or module._global_backward_hooks
                or module._global_backward_pre_hooks)
