"""Swish-beta -> bilinear fine-tuning (paper App. J) as a transformers TrainerCallback."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from datasets import Dataset

from bcos_plugins.bilinear import bilinear_weights
from bcos_plugins.bilinear.swish_beta import (
    SwishBeta,
    SwishBetaToBilinear,
    finalize_bilinear,
    set_swish_beta,
)
from bcos_plugins.nn import explanation_mode


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = T.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return T.LlamaForCausalLM(config).eval()


class BetaSpy(T.TrainerCallback):
    def __init__(self):
        self.betas = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.betas.append(model.model.layers[0].mlp.act_fn.beta)


def test_trainer_anneals_beta_then_model_is_bilinear_and_reloads(tmp_path):
    model = tiny_llama()
    ids = torch.randint(0, 40, (8, 12), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = T.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=4, per_device_train_batch_size=4,
                               learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True, logging_steps=100)
    spy = BetaSpy()
    T.Trainer(model=model, args=args, train_dataset=data, callbacks=[SwishBetaToBilinear(anneal_fraction=0.5), spy]).train()
    assert spy.betas == [1.0, 0.5, 0.0, 0.0]  # linear over the first half of 4 steps, then 0
    assert model.config.hidden_act == "linear"
    model.eval()
    for layer in model.model.layers:
        assert isinstance(layer.mlp.act_fn, T.activations.LinearActivation)
        weights = bilinear_weights(layer.mlp)  # reads as a bilinear layer now
        x = torch.randn(3, 16)
        torch.testing.assert_close(weights.forward(x), layer.mlp(x))
    model.save_pretrained(tmp_path / "bilinear")
    reloaded = T.LlamaForCausalLM.from_pretrained(tmp_path / "bilinear").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


def test_finalize_keeps_outputs_and_refuses_unfinished_annealing():
    model = tiny_llama(seed=1)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        original = model(ids).logits
        set_swish_beta(model, 1.0)  # SiLU exactly
        torch.testing.assert_close(model(ids).logits, original)
        with pytest.raises(ValueError, match="beta=0"):
            finalize_bilinear(model)
        set_swish_beta(model, 0.0)
        gated = model(ids).logits
        finalize_bilinear(model)
        torch.testing.assert_close(model(ids).logits, gated)
    with pytest.raises(ValueError, match="no gated MLP"):
        set_swish_beta(T.GPT2LMHeadModel(T.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=20,
                                                       bos_token_id=2, eos_token_id=2)), 0.5)


def test_interrupted_annealing_warns_and_leaves_the_gate():
    model = tiny_llama(seed=2)
    callback = SwishBetaToBilinear(anneal_fraction=0.8)  # 1.0 is refused: no step would train at beta=0
    state = T.TrainerState()
    state.max_steps, state.global_step = 10, 0
    callback.on_train_begin(None, state, None, model=model)
    state.global_step = 4
    with pytest.warns(UserWarning, match="not bilinear"):
        callback.on_train_end(None, state, None, model=model)
    assert model.model.layers[0].mlp.act_fn.beta == pytest.approx(0.5)  # 1 - 4 / (0.8 * 10)
    with pytest.raises(ValueError, match="starting beta"):
        SwishBetaToBilinear(start_beta=None).on_train_begin(
            None, state, None, model=T.LlamaForCausalLM(T.LlamaConfig(
                vocab_size=20, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                hidden_act="relu")))
    with pytest.raises(ValueError, match="anneal_fraction"):
        SwishBetaToBilinear(anneal_fraction=0.0)


def test_swish_beta_gate_is_constant_in_explanation_mode():
    gate = SwishBeta(0.7)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    with explanation_mode(gate):
        y = gate(x).sum()
        torch.testing.assert_close((x * torch.autograd.grad(y, x)[0]).sum(), y)


def test_quick_gelu_model_starts_annealing_at_its_own_activation_bit_for_bit():
    # quick_gelu is x * sigmoid(1.702 x) (transformers' QuickGELUActivation), a gate kind of nn.activation: the
    # callback must start at beta = 1.702, where Swish_beta is the same function, so the first step changes nothing.
    torch.manual_seed(3)
    model = T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, hidden_act="quick_gelu")).eval()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        original = model(ids).logits
    callback = SwishBetaToBilinear(anneal_fraction=0.5)
    state = T.TrainerState()
    state.max_steps, state.global_step = 10, 0
    callback.on_train_begin(None, state, None, model=model)
    assert callback.beta == 1.702
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original)
    # ... and anneals to the bilinear model, which bilinear_weights reads exactly
    state.global_step = 10
    callback.on_train_end(None, state, None, model=model)
    assert model.config.hidden_act == "linear"
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(4))
    for layer in model.model.layers:
        torch.testing.assert_close(bilinear_weights(layer.mlp).forward(x), layer.mlp(x))


@pytest.mark.parametrize("alias, canonical", [("gelu_python", "gelu"), ("gelu_python_tanh", "gelu_pytorch_tanh"),
                                              ("gelu_accurate", "gelu_new")])
def test_gelu_alias_model_anneals_as_its_canonical_name_does(alias, canonical):
    # each alias is its canonical name's function written in Python (transformers' GELUActivation(use_gelu_python),
    # GELUTanh(use_gelu_tanh_python), AccurateGELUActivation): the callback refused the alias ("cannot infer the
    # starting beta") where it anneals the canonical name from 1.702
    def model(act):
        torch.manual_seed(5)
        return T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=32, hidden_act=act)).eval()

    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(5))
    models = {act: model(act) for act in (alias, canonical)}
    with torch.no_grad():  # the same function: the same logits to rounding (not the same kernels)
        torch.testing.assert_close(models[alias](ids).logits, models[canonical](ids).logits)
    callbacks = {act: SwishBetaToBilinear(anneal_fraction=0.5) for act in models}
    state = T.TrainerState()
    state.max_steps = 10
    for step, hook in ((0, "on_train_begin"), (3, "on_step_begin"), (10, "on_train_end")):
        state.global_step = step
        for act, callback in callbacks.items():
            getattr(callback, hook)(None, state, None, model=models[act])
        assert callbacks[alias].beta == callbacks[canonical].beta == 1.702 * max(0.0, 1 - step / 5)
        with torch.no_grad():  # the annealed models are one model, bit for bit, at every step
            assert torch.equal(models[alias](ids).logits, models[canonical](ids).logits)
    assert models[alias].config.hidden_act == models[canonical].config.hidden_act == "linear"


def test_every_gelu_or_silu_name_bcosify_converts_has_a_start_beta():
    # hidden_act names whose transformers class bcosify converts as a GELU / SiLU gate (gelu_python and
    # gelu_python_tanh were missing): each anneals from a known beta. ReLU is Swish_beta only as beta -> inf;
    # gelu_10's clip at +-10 the annealed gate drops, so its start is the user's (swish_beta.START_BETA's comment).
    from transformers.activations import ACT2CLS

    from bcos_plugins.bilinear.swish_beta import START_BETA
    from bcos_plugins.convert.bcosify import ACTIVATION_GATES

    names = {name for name, cls in ACT2CLS.items()
             if ACTIVATION_GATES.get((cls[0] if isinstance(cls, tuple) else cls).__name__) not in (None, "relu", "gelu_10")}
    assert {"gelu", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh", "silu", "swish"} <= names
    assert names <= set(START_BETA), sorted(names - set(START_BETA))


def test_gemma2_anneals_from_hidden_activation_and_reloads_bilinear(tmp_path):
    # Gemma 2's MLP reads config.hidden_activation (its config has no hidden_act): the callback refused to infer the
    # start, and a model annealed with start_beta= was saved with hidden_act = "linear" beside hidden_activation =
    # "gelu_pytorch_tanh", so it reloaded with GELU gates on the halved down_proj (logits 0.03 off, silently)
    torch.manual_seed(6)
    model = T.Gemma2ForCausalLM(T.Gemma2Config(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32)).eval()
    assert model.config.hidden_activation == "gelu_pytorch_tanh"
    callback = SwishBetaToBilinear(anneal_fraction=0.5)
    state = T.TrainerState()
    state.max_steps, state.global_step = 10, 0
    callback.on_train_begin(None, state, None, model=model)
    assert callback.beta == 1.702
    state.global_step = 10
    callback.on_train_end(None, state, None, model=model)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        annealed = model(ids).logits
    model.save_pretrained(tmp_path / "bilinear")
    reloaded = T.Gemma2ForCausalLM.from_pretrained(tmp_path / "bilinear").eval()
    assert reloaded.config.hidden_activation == "linear"
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, annealed)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(7))
    for layer in reloaded.model.layers:
        torch.testing.assert_close(bilinear_weights(layer.mlp).forward(x), layer.mlp(x))
