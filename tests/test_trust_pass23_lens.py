"""Trust pass 23, TransformerLens and sae-lens (helper-157): hooks that change activations (``model.hooks``,
``run_with_hooks``-style patches) under the adapter's explanations and TransformerLens' own cache decompositions,
each checked against an independent computation (the SAE's own encode of the cached activation, the cached
residual stream the components claim to sum to)."""

from __future__ import annotations

import warnings

import pytest
import torch
from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig
from test_conformance import B, _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)

_BUILT: dict = {}
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10]])


def _hooked(name: str = "GPT2LMHeadModel"):
    """(B-cos HF model, its HookedSAETransformer), built once."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    if name not in _BUILT:
        hf = bcosify(_stock(name), b=B, verbose=False).eval()
        _BUILT[name] = hf, hooked_transformer_from_hf(hf, model_class=HookedSAETransformer)
    return _BUILT[name]


def _sae(d_in: int, hook: str) -> StandardSAE:
    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=16))
    with torch.no_grad():
        for param in sae.parameters():
            param.normal_(0, 0.3)
    sae.cfg.metadata.hook_name = hook
    return sae


def _own_pre_activation(model, sae, feature: int) -> torch.Tensor:
    """sae-lens' own hook_sae_acts_pre of the activation run_with_cache records (the hooks in place)."""
    _, cache = model.run_with_cache(TOKENS)
    grabbed = []
    with sae.hooks(fwd_hooks=[("hook_sae_acts_pre", lambda t, hook: grabbed.append(t))]):
        sae.encode(cache[sae.cfg.metadata.hook_name])
    return grabbed[0][:, -1, feature].detach()


@pytest.mark.parametrize("hook", ["blocks.0.hook_resid_mid", "blocks.0.hook_resid_post"])
def test_explain_sae_feature_warns_when_the_callers_hook_patches_an_activation(hook):
    """explain_sae_feature under the caller's hook that adds a vector (activation patching, mean ablation) upstream of
    or at the SAE's hook: the pre-activation is right (sae-lens' own encode of the cached activation), but the tokens'
    contributions miss the patched share (95 % of the explained value here), and nothing was said: explain_logits
    warned in the same case, explain_sae_feature did not. It now warns the same way, naming the hook; a hook that
    scales (zero / half ablation) keeps the explanation exact and is not warned about."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    _, model = _hooked()
    sae = _sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    shift = torch.linspace(0, 1, model.cfg.d_model)
    with model.hooks(fwd_hooks=[(hook, lambda x, hook: x + shift)]):
        with pytest.warns(UserWarning, match=rf"explain_sae_feature: .*forward hooks on {hook}.*model.reset_hooks") \
                as record:
            explanation = explain_sae_feature(model, TOKENS, sae, 3)
        own = _own_pre_activation(model, sae, 3)
    assert [w.filename for w in record if "forward hooks" in str(w.message)] == [__file__]  # the caller's line
    torch.testing.assert_close(explanation.pre_activation, own, rtol=1e-5, atol=1e-5)
    gap = (explanation.total - explanation.explained).abs() / explanation.explained.abs()
    assert gap.item() > 0.1  # what the warning is about
    with model.hooks(fwd_hooks=[(hook, lambda x, hook: x * 0.5)]), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        halved = explain_sae_feature(model, TOKENS, sae, 3)
        own = _own_pre_activation(model, sae, 3)
    torch.testing.assert_close(halved.pre_activation, own, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(halved.total + halved.bias_terms, halved.pre_activation, rtol=1e-5, atol=1e-5)
