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

__all__ = ["DynamicHookPoint"]


class DynamicHookPoint(HookPoint, DynamicWeightModule):
    """A ``HookPoint`` whose output is a constant for autograd in explanation mode."""

    def forward(self, x: Tensor) -> Tensor:
        return self.dynamic_weight(x)
