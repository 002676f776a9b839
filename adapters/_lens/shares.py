"""Each head's and each neuron's share of a B-cos output projection: the one computation behind the exact
per-head and per-neuron results of both model classes (``BcosActivationCache`` for ``HookedTransformer``, the
boot guard for ``TransformerBridge``; TransformerLens 3.x and 4.x).

A B-cos output projection computes ``y = scale ⊙ (x @ ŵ)`` per output unit, with ``ŵ`` its unit-norm weight and
``scale`` an input-dependent factor of the whole input ``x``. Holding ``scale`` at the forward's value, ``y`` is
linear in ``x``, so splitting ``x`` by head (``z_h``) or by neuron (``post_n``) splits ``y`` into shares that sum to
it: ``scale ⊙ (z_h @ ŵ_O[h])`` and ``post_n * ŵ_out[n] ⊙ scale``. TransformerLens' own results use the raw
``W_O`` / ``W_out`` and no scale, so they do not sum to ``attn_out`` / ``mlp_out``.
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["head_shares", "neuron_shares"]


def head_shares(z: Float[Tensor, "... head d_head"], weight: Float[Tensor, "head d_head d_model"],
                scale: Float[Tensor, "... d_model"] | None) -> Float[Tensor, "... head d_model"]:
    """Each head's share of the output projection: ``scale ⊙ (z_h @ weight[h])`` (``weight`` unit-norm per output
    unit, in TransformerLens' ``W_O`` layout); ``scale=None``: no scale (B = 1)."""
    shares = einops.einsum(z, weight, "... h d, h d m -> ... h m")
    return shares if scale is None else shares * scale.unsqueeze(-2)


def neuron_shares(post: Float[Tensor, "... pos d_mlp"], weight: Float[Tensor, "d_mlp d_model"],
                  scale: Float[Tensor, "... pos d_model"] | None, neuron_slice=None, pos_slice=None,
                  project_output_onto: Tensor | None = None) -> Tensor:
    """Each neuron's share of the output projection, ``post_n * weight[n] ⊙ scale`` (``weight`` unit-norm per output
    unit, in TransformerLens' ``W_out`` layout), with the arguments and output shapes of TransformerLens'
    ``ActivationCache.get_neuron_results``: ``(..., pos, neuron, d_model)``; an int ``neuron_slice`` drops the
    neuron axis; ``project_output_onto`` (``(d_model,)`` or ``(d_model, k)``) replaces ``d_model`` by its
    projection (dropped for a vector); ``scale=None``: no scale (B = 1)."""
    # imported when needed, not at the top: the boot guard imports this module, and importing the guard must not
    # import TransformerLens, whose import installs that guard (bcos_plugins._host_import_guard)
    from transformer_lens.utilities import Slice

    if scale is None:  # no scale (B = 1): ones, broadcast without copying
        scale = post.new_ones(()).expand(*post.shape[:-1], weight.shape[-1])
    neuron_slice = neuron_slice if isinstance(neuron_slice, Slice) else Slice(neuron_slice)
    pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
    post, scale = pos_slice.apply(post, dim=-2), pos_slice.apply(scale, dim=-2)
    index = neuron_slice.apply(torch.arange(weight.shape[0], device=weight.device), dim=0)
    single = index.ndim == 0
    index = index.reshape(-1)
    post, weight = post[..., index], weight[index]
    neuron_axis = -2
    if project_output_onto is None:
        out = post[..., None] * weight * scale[..., None, :]
    else:
        project = project_output_onto if project_output_onto.ndim == 2 else project_output_onto[:, None]
        out = post[..., None] * einops.einsum(weight, scale, project, "n m, ... m, m o -> ... n o")
        if project_output_onto.ndim == 1:
            out, neuron_axis = out.squeeze(-1), -1
    return out.select(neuron_axis, 0) if single else out
