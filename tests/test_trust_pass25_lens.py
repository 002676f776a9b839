"""Trust pass 25, TransformerLens and sae-lens (helper-198): TransformerLens' own ``run_with_cache`` options (caches
of a subset of positions) on B-cos HookedTransformers, each checked against an independent computation (the full
cache of the same run, sliced by hand; the cached projection the effective weight must reproduce)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_conformance import B, _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)

_BUILT: dict = {}
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def _hooked(name: str):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    if name not in _BUILT:
        _BUILT[name] = hooked_transformer_from_hf(bcosify(_stock(name), b=B, verbose=False).eval())
    return _BUILT[name]


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
@pytest.mark.parametrize("pos_slice", [-1, [0, 3], (2, 5)], ids=["last", "list", "range"])
@pytest.mark.parametrize("remove_batch_dim", [False, True], ids=["batch", "no-batch"])
def test_a_cache_of_a_subset_of_positions_slices_head_split_scales_on_their_positions(name, pos_slice,
                                                                                      remove_batch_dim):
    """``run_with_cache(tokens, pos_slice=-1)`` (TransformerLens' cache of a subset of positions): its caching slices
    positions at dim -3 only for names ending hook_q / k / v / z / result, so the B-cos scales of q / k / v
    (``attn.hook_bcos_scale_q``, (batch, pos, head, d_head)) were sliced on the head axis: the last head's scale at
    every position, and ``effective_weight(cache, 0, "W_Q")`` a (2, 6, 4, 32, 8) weight 1.7 off the cached hook_q,
    without a word; a list of positions failed in torch's broadcasting, and a Llama's own hook_rot_k (2 key heads)
    with an IndexError inside TransformerLens. Those activations are now sliced on their positions: equal to the full
    cache's sliced by hand, and x @ effective_weight reproduces the cached projections."""
    from bcos_plugins.adapters.transformer_lens import effective_weight
    from transformer_lens.utilities import Slice

    model = _hooked(name)
    tokens = TOKENS[:1] if remove_batch_dim else TOKENS
    _, full = model.run_with_cache(tokens, remove_batch_dim=remove_batch_dim)
    _, cache = model.run_with_cache(tokens, pos_slice=pos_slice, remove_batch_dim=remove_batch_dim)
    positions = Slice.unwrap(pos_slice)
    head_split = [key for key in full.keys() if key.endswith(("hook_bcos_scale_q", "hook_bcos_scale_k",
                                                              "hook_bcos_scale_v", "hook_rot_q", "hook_rot_k", "hook_q",
                                                              "hook_z"))]
    assert any("rot_k" in key for key in head_split) == (name == "LlamaForCausalLM")
    for key in head_split:
        torch.testing.assert_close(cache[key], positions.apply(full[key], dim=-3), atol=0, rtol=0)
    for key in ("blocks.0.hook_attn_out", "blocks.1.attn.hook_bcos_scale_o", "blocks.1.mlp.hook_bcos_scale_in"):
        torch.testing.assert_close(cache[key], positions.apply(full[key], dim=-2), atol=0, rtol=0)
    if remove_batch_dim:
        return  # effective_weight reads (batch, pos, ...) caches
    x = cache["blocks.1.ln1.hook_normalized"]
    for projection, produced in (("W_Q", "hook_q"), ("W_K", "hook_k"), ("W_V", "hook_v")):
        weight = effective_weight(cache, 1, projection)
        if weight.shape[2] != cache[f"blocks.1.attn.{produced}"].shape[2]:  # grouped keys / values
            weight = weight.repeat_interleave(cache[f"blocks.1.attn.{produced}"].shape[2] // weight.shape[2], dim=2)
        torch.testing.assert_close(torch.einsum("bpm,bphmd->bphd", x, weight), cache[f"blocks.1.attn.{produced}"],
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.einsum("bphd,bphdm->bpm", cache["blocks.1.attn.hook_z"],
                                            effective_weight(cache, 1, "W_O")), cache["blocks.1.hook_attn_out"],
                               atol=1e-5, rtol=0)
