"""``recording_forward_autocast`` notes the autocast dtype that the module's own calls ran under: modules outside the
recorded one are not noted; an autocast entered inside a submodule's forward is; no hook is left behind.

(A version with one global hook per call, which also left other threads' calls out, made a compiled model compile
its graph again at every ``explain`` call: tests/test_fused_layers.py counts the graphs.)
"""

from __future__ import annotations

import torch
from torch import nn

from bcos_plugins.explain import recording_forward_autocast


class _AutocastInside(nn.Module):
    """Enters bfloat16 autocast in its own forward, as an accelerate-wrapped forward does."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            return self.inner(x)


def test_an_autocast_entered_inside_the_modules_forward_is_noted():
    model = nn.Sequential(nn.Linear(4, 4), _AutocastInside())
    with recording_forward_autocast(model, []) as seen:
        model(torch.randn(2, 4))
    assert seen == [torch.bfloat16]  # the inner Linear's call; the outer modules ran in float32


def test_modules_outside_the_recorded_one_are_not_noted():
    model, other = nn.Linear(4, 4), nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with recording_forward_autocast(model, []) as seen:
        with torch.autocast("cpu", torch.bfloat16):
            other(x)
    assert seen == []
    with recording_forward_autocast(model, []) as seen, torch.autocast("cpu", torch.bfloat16):
        model(x)
    assert seen == [torch.bfloat16]


def test_no_hook_is_left_behind_and_a_module_without_parameters_is_recorded():
    hooks_before = dict(torch.nn.modules.module._global_forward_pre_hooks)
    model = nn.ReLU()
    with recording_forward_autocast(model, []) as seen, torch.autocast("cpu", torch.bfloat16):
        model(torch.randn(2))
    assert seen == [torch.bfloat16]
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks_before
    assert not model._forward_pre_hooks
