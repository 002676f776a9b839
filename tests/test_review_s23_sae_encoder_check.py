"""explain_sae_feature's check of the other features' encoder columns reads them only when the sum of W_enc is not
finite (review of trust pass 22, helper-148): an inf entry is still named, and finite weights whose sum overflows
are not refused (they are read column by column and pass)."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins import BcosError


def _model_sae_tokens():
    from test_sae_feature import _lens_model, _sae

    model = _lens_model("LlamaForCausalLM")
    sae = _sae(model.cfg.d_model)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(4))
    return model, sae, tokens


def test_an_inf_and_a_minus_inf_column_are_named():
    """+inf in one column and -inf in another sum to NaN: both features are named."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    model, sae, tokens = _model_sae_tokens()
    with torch.no_grad():
        sae.W_enc[0, 5], sae.W_enc[1, 7] = float("inf"), float("-inf")
    with pytest.raises(BcosError, match=r"^sae: W_enc holds NaN or infinite values in the encoder column\(s\) of "
                                        r"feature\(s\) \[5, 7\]"):
        explain_sae_feature(model, tokens, sae, 3)


def test_finite_encoder_weights_whose_sum_overflows_are_not_refused():
    """Two columns of 3e38 overflow the float32 sum of W_enc to inf, though every weight is finite: the columns are
    then read one by one and the feature is explained (its pre-activation does not read those columns)."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature
    from test_sae_feature import _sae_lens_pre_activations

    model, sae, tokens = _model_sae_tokens()
    with torch.no_grad():
        sae.W_enc[:, 5], sae.W_enc[:, 7] = 3e38, 3e38
        assert not torch.isfinite(sae.W_enc.sum()) and torch.isfinite(sae.W_enc).all()
    explanation = explain_sae_feature(model, tokens, sae, 3)
    want = _sae_lens_pre_activations(model, sae, tokens)[:, -1, 3]
    torch.testing.assert_close(explanation.total + explanation.bias_terms, want, rtol=1e-4, atol=1e-4)
