"""Unit-norm weights of the B-cos projections of the TransformerLens components.

B-cos layers keep raw weights and use ``ŵ = w / ||w||`` (per unit, over its inputs). The components reuse
``ŵ`` while it cannot change and no gradient reaches ``w`` through it, by the one cache of the package,
:func:`bcos_plugins.nn.functional.cached_unit_norm` (its docstring says when a cached value is used).
"""

from __future__ import annotations

from torch import Tensor, nn

from bcos_plugins.nn.functional import cached_unit_norm

__all__ = ["unit_weight"]


def unit_weight(module: nn.Module, name: str, dim: int | tuple[int, ...]) -> Tensor:
    """``unit_norm(getattr(module, name), dim)``, through the package's cache of unit-norm weights."""
    return cached_unit_norm(getattr(module, name), dim)
