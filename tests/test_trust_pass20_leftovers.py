"""Trust pass 20, leftovers of the adapters pass (helper-109's notes), each pinned here:

1. bcos_plugins.bilinear on a TransformerLens bilinear MLP fed ``blocks.L.ln2.hook_normalized`` (recorded before ln2
   multiplies by its weight and adds a LayerNorm's bias): ``bilinear_weights(mlp, input_norm=ln2)`` folds the norm
   in, the same mechanism ``BilinearSAEInteractions(input_norm=)`` uses.
2. ``SAEErrorShare.error_fraction`` of a row whose explained value is exactly 0: NaN, not a share over a 1e-12 floor.
3. inseq's ``attribute(..., step_scores=["deltas"])`` on a model loaded with "bcos": the completeness deltas the
   method always stores, not inseq's "register a step function" error.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from bcos_plugins.adapters.sae_lens import SAEErrorShare, sae_error_share
from test_sae_lens_adapter import _bcos_sae_model

# ------------------------------------------------------------------------------- 2. error_fraction of a zero logit


def test_error_fraction_is_nan_where_the_explained_value_is_exactly_zero_and_exact_elsewhere():
    """A 1e-12 floor divided a rounding-sized error share of a zero logit into a fraction of 1e5 (and a zero share
    into 0, "the SAEs reconstruct everything", for a logit that is 0 whatever they do)."""
    explained = torch.tensor([2.0, 0.0, -4.0])
    share = SAEErrorShare(explanation=SimpleNamespace(explained=explained),
                          error_shares={"a": torch.tensor([0.5, 1e-7, 1.0]), "b": torch.tensor([0.5, 0.0, 1.0])})
    fraction = share.error_fraction
    assert torch.isnan(fraction[1])
    torch.testing.assert_close(fraction[[0, 2]], torch.tensor([0.5, -0.5]), rtol=0, atol=0)


def test_error_fraction_through_sae_error_share_with_one_row_explaining_a_zero_logit():
    model = _bcos_sae_model(True)
    with torch.no_grad():  # token 5's unembedding column is zero: its logit is exactly 0 on every input
        model.unembed.W_U[:, 5] = 0
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    result = sae_error_share(model, tokens, target=torch.tensor([4, 5, 4]))
    explained = result.explanation.explained
    assert explained[1] == 0 and bool((explained[[0, 2]] != 0).all())
    fraction = result.error_fraction
    assert torch.isnan(fraction[1])  # it read 0.0, as if the SAEs reconstructed what the model needs
    torch.testing.assert_close(fraction[[0, 2]], result.error_share[[0, 2]] / explained[[0, 2]], rtol=0, atol=0)
    assert bool(torch.isfinite(fraction[[0, 2]]).all())
