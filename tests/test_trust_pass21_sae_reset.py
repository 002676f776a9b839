"""Trust pass 21, sae-lens' SAEs spliced into a TransformerBridge: sae-lens' own bridge support
(``SAETransformerBridge``, beta in sae-lens 6) splices an SAE in at a hook point that carries one of the bridge's
dynamic weights, and ``reset_saes`` leaves a plain ``HookPoint`` there. Explanations of such a bridge failed with
"input_x_gradient: no attribution point was reached ... Check the model and the hook point" (its ``hook_dict`` lacks
TransformerLens' aliases, ``hook_embed`` among them), naming neither the cause nor a way out; they are now refused
by name. With the aliases (patched in by hand) a bilinear bridge was explained after the reset with its gate in the
gradient: completeness error 1.1, contributions off by 0.04 (the largest is 0.22)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import _stock
from test_trust_pass21_adapters import _sae

from bcos_plugins.errors import BcosTypeError

warnings.filterwarnings("ignore", category=DeprecationWarning)

_GATE = "blocks.1.mlp.gate.hook_out"  # the bilinear gate: a dynamic weight of the bridge
_REFUSAL = (r"^model: a bridge turned into sae-lens' SAETransformerBridge cannot be explained: its hook_dict lacks "
            r"TransformerLens' hook aliases \(hook_embed\).*add_sae, reset_saes.*Explain the TransformerBridge from "
            r"transformer_bridge_from_hf with no SAE spliced in")


def _sae_bridge():
    """A bilinear Qwen3 bridge from transformer_bridge_from_hf, turned into an SAETransformerBridge the way sae-lens'
    own ``SAETransformerBridge.boot_transformers`` turns the TransformerBridge it boots into one."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf
    from sae_lens import SAETransformerBridge

    bridge = transformer_bridge_from_hf(_stock("Qwen3ForCausalLM", hidden_act="linear"))
    bridge.__class__ = SAETransformerBridge
    bridge._acts_to_saes = {}
    bridge._transcoder_output_hooks = {}
    return bridge


def test_sae_lens_splices_into_a_bridge_at_a_dynamic_weight_hook_and_lacks_the_hook_aliases():
    """The facts the refusal rests on, through sae-lens' own calls. If this fails, sae-lens changed: with
    ``hook_embed`` in its hook_dict an explanation would run, and after reset_saes the gate's plain HookPoint puts the
    gate in the gradient; then make the mark that make_explainable leaves on HookedTransformers
    (model.dynamic_hooks_replaced) cover bridges before lifting the refusal."""
    from bcos_plugins.adapters._lens.hook_point import DynamicHookPoint
    from transformer_lens.hook_points import HookPoint

    bridge = _sae_bridge()
    assert isinstance(bridge.hook_dict[_GATE], DynamicHookPoint)
    bridge.add_sae(_sae(bridge.cfg.d_mlp, _GATE))
    assert type(bridge.hook_dict[f"{_GATE}.hook_sae_acts_post"]).__name__ == "HookPoint"
    assert type(bridge.get_submodule(_GATE)).__name__ == "_SAEWrapper"
    bridge.reset_saes()
    assert type(bridge.get_submodule(_GATE)) is HookPoint  # the DynamicHookPoint is gone
    assert "hook_embed" not in bridge.hook_dict and "embed.hook_out" in bridge.hook_dict


@pytest.mark.parametrize("state", ["no SAE", "SAE attached", "after reset_saes"])
def test_explaining_an_sae_lens_bridge_is_refused_by_name(state):
    """It failed with "input_x_gradient: no attribution point was reached; ... Check the model and the hook point"."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature
    from bcos_plugins.adapters.transformer_lens import explain_logits

    bridge = _sae_bridge()
    if state != "no SAE":
        bridge.add_sae(_sae(bridge.cfg.d_mlp, _GATE))
    if state == "after reset_saes":
        bridge.reset_saes()
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosTypeError, match=_REFUSAL):
        explain_logits(bridge, ids, attention_mask=mask, target=[5, 6, 7])
    with pytest.raises(BcosTypeError, match=_REFUSAL):
        explain_sae_feature(bridge, ids, _sae(bridge.cfg.d_model, "blocks.1.mlp.hook_out"), 3,
                            attention_mask=mask)


def test_the_bridge_from_transformer_bridge_from_hf_is_still_explained():
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    bridge = transformer_bridge_from_hf(_stock("Qwen3ForCausalLM", hidden_act="linear"))
    ids, mask = padded_batch(side="left")
    explanation = explain_logits(bridge, ids, attention_mask=mask, target=[5, 6, 7])
    assert explanation.completeness_error.max() < 1e-4
    torch.testing.assert_close(explanation.contributions.sum(-1), explanation.explained, rtol=1e-4, atol=1e-4)
