"""Trust pass 21 on gated MLPs' activations without an ``x * gate(x)`` form (``GATE_BRANCH_ACTIVATIONS``, session 22).

Tried (each newly accepted activation on Llama, Mistral, Qwen2, Qwen3, Gemma 2 and ModernBERT): padding on either side
against the unpadded row alone, batch 1, foil and position, float64, bfloat16, train mode, the TransformerLens paths
and their refusals, and the ``load_bcos_model`` round trip of config-built models: all exact or refused with the
reason. One silently wrong number, pinned here: a gate-branch activation set by hand (the documented way to hold a
clipped GELU with other bounds, a leaky ReLU with another slope, a tanh in a SiLU Llama) was not written by
save_pretrained (only the config's activation name is), so ``load_bcos_model`` rebuilt the config's activation: another
model, with other logits, without a word. The save now records each gate-branch activation with its settings
(``config.bcos['gate_branch_activations']``) and the load refuses a rebuild that differs.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from test_leftovers_s22 import _stock_with
from transformers.activations import ClippedGELUActivation

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

IDS = torch.tensor([[4, 9, 13, 7, 21]])


def _set_act(model: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


@pytest.mark.parametrize(("name", "config_act", "placed", "saved_as"), [
    # no config name builds a clipped GELU with these bounds
    ("LlamaForCausalLM", "silu", lambda: ClippedGELUActivation(-1.0, 3.0), r"ClippedGELUActivation\(max=3\.0, min=-1\.0\)"),
    # the config's leaky_relu has slope 0.01: a slope of 0.3 was reloaded as 0.01
    ("Qwen2ForCausalLM", "leaky_relu", lambda: torch.nn.LeakyReLU(0.3), r"LeakyReLU\(inplace=False, negative_slope=0\.3\)"),
    ("ModernBertForSequenceClassification", "gelu", torch.nn.Tanh, r"Tanh\(\)"),
])
def test_a_hand_set_gate_branch_activation_is_refused_on_load_not_rebuilt_as_the_configs(tmp_path, name, config_act,
                                                                                        placed, saved_as):
    stock = _stock_with(name, config_act)
    path = "model.layers.0.mlp." + ("act" if name.startswith("ModernBert") else "act_fn")
    _set_act(stock, path, placed())
    model = bcosify(stock, b=1.25, verbose=False)
    assert path in model.bcos_report.gate_branch_activations
    model.save_pretrained(tmp_path)
    # before: loaded without a word, the config's activation in layer 0, logits 1e-2..1e-1 off
    with pytest.raises(BcosValueError, match=rf"^config\.bcos\['gate_branch_activations'\]: .* was saved with "
                                             rf"gated-MLP activations that its config does not rebuild \(1 differ: "
                                             rf"'{path}' saved as {saved_as}, rebuilt as .*an activation set by hand "
                                             r".*Build the model with the activation in its config"):
        load_bcos_model(tmp_path)


def test_a_hand_set_gate_kind_activation_over_a_tanh_config_is_refused_on_load(tmp_path):
    """The other way round: the model ran SiLU in layer 1 (set by hand) and its config names tanh."""
    stock = _stock_with("LlamaForCausalLM", "tanh")
    _set_act(stock, "model.layers.1.mlp.act_fn", torch.nn.SiLU())
    model = bcosify(stock, b=1.25, verbose=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=r"'model\.layers\.1\.mlp\.act_fn' saved as one with a gate kind, "
                                             r"rebuilt as Tanh\(\)"):
        load_bcos_model(tmp_path)


@pytest.mark.parametrize(("name", "activation"), [("Gemma2ForCausalLM", "leaky_relu"),
                                                  ("ModernBertForSequenceClassification", "relu6"),
                                                  ("MistralForCausalLM", "hardswish")])
def test_config_built_gate_branch_activations_reload_bit_identical_with_their_record(tmp_path, name, activation):
    model = bcosify(_stock_with(name, activation), b=1.25, verbose=False)
    record = model.config.bcos["gate_branch_activations"]
    assert sorted(record) == sorted(model.bcos_report.gate_branch_activations)
    model.save_pretrained(tmp_path)
    reloaded = load_bcos_model(tmp_path)
    assert reloaded.config.bcos == model.config.bcos
    for path in record:
        stock_module, kept = model.get_submodule(path), reloaded.get_submodule(path)
        assert type(kept) is type(stock_module)
        assert {k: v for k, v in vars(kept).items() if not k.startswith("_")} == \
            {k: v for k, v in vars(stock_module).items() if not k.startswith("_")}
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=IDS).logits, model(input_ids=IDS).logits)


@pytest.mark.parametrize(("config_act", "placed"), [("silu", torch.nn.Tanh), ("relu2", torch.nn.SiLU)])
def test_hooked_transformer_from_hf_refuses_a_hand_set_mlp_activation_the_bridge_runs_it(config_act, placed):
    """TransformerLens' model runs the config's activation: a tanh set by hand in a SiLU Llama's layer 0 (which bcosify
    keeps as a gate branch) was replaced by SiLU, logits 0.08 off, silently. The bridge runs the model's own modules."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf, transformer_bridge_from_hf

    stock = _stock_with("LlamaForCausalLM", config_act)
    _set_act(stock, "model.layers.0.mlp.act_fn", placed())
    model = bcosify(stock, b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match=rf"^hf_model: its MLP activation 'model\.layers\.0\.mlp\.act_fn' \(\w+\) "
                                             rf"computes another function than the config's '{config_act}'.*Use "
                                             r"transformer_bridge_from_hf\(hf_model\)"):
        hooked_transformer_from_hf(model)
    with torch.no_grad():
        logits = transformer_bridge_from_hf(model)(IDS)
        torch.testing.assert_close(logits, model(input_ids=IDS).logits, rtol=1e-5, atol=1e-6)
