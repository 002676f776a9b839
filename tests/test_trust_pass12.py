"""Trust pass 12: a valid model whose state changes between calls (weights edited in place or through ``.data``,
``load_state_dict``, dtype round trips, B changed, optimiser steps, ``requires_grad`` and train/eval toggles, hooks,
adapters, copies, exceptions inside ``explanation_mode``), each next answer checked against the model's own forward
on :func:`~bcos_plugins.nn.functional.reference_path` (normalised afresh) or a freshly built model with the same
weights. The cases that were silently wrong or crashed unhelpfully, one test each."""

from __future__ import annotations

import warnings

import torch

from bcos_plugins.nn import BcosLinear
from bcos_plugins.nn.functional import reuse_unit_weights

warnings.filterwarnings("ignore", category=DeprecationWarning)


def test_a_reused_unit_weight_is_not_served_after_its_storage_is_replaced_at_the_same_address():
    """``model.half()`` then ``.float()`` replaces each parameter's storage (``param.data = t``), which keeps the
    parameter's version counter; where the new storage landed at the freed one's address, reuse_unit_weights() served
    the unit-norm copy of the weights before the float16 rounding. Here the address is the same by construction."""
    torch.manual_seed(0)
    layer = BcosLinear(16, 8, b=2.0).eval()
    x = torch.randn(3, 16)
    memory = layer.weight.detach().numpy().copy()
    layer.weight.data = torch.from_numpy(memory)
    with reuse_unit_weights(), torch.no_grad():
        layer(x)  # caches the unit-norm copy of these weights
        layer.half()
        memory[:] = layer.weight.float().numpy()  # the rounded weights, written at the old address
        layer.weight.data = torch.from_numpy(memory)  # a new storage object there; the version counter is kept
        served = layer(x)
    with torch.no_grad():
        fresh = layer(x)
    assert torch.equal(served, fresh)

