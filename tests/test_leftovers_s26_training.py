"""Session 26 leftovers of trust pass 25 (training): SwishBetaToBilinear checkpoints saved while the gates anneal
reload as the model they were (or are refused by a stock from_pretrained), and train_causal_lm resumed from a B
warm-up checkpoint without the BWarmupCallback is refused, as fine_tune_classifier is."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from test_trust_pass22_training import QUIET_LM, _causal_lm, _rows

from bcos_plugins.bilinear.swish_beta import (
    ANNEALING_ACTIVATION,
    SwishBeta,
    SwishBetaToBilinear,
    gated_mlps,
    load_annealing_checkpoint,
    set_swish_beta,
)
from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.train import BWarmupCallback
from bcos_plugins.train_decoder import train_causal_lm

IDS = torch.randint(60, (2, 9), generator=torch.Generator().manual_seed(1))


def _llama() -> T.LlamaForCausalLM:
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, bos_token_id=2, eos_token_id=2, pad_token_id=0))


def _anneal(model, output_dir, **extra):
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(60, (16, 12),
                                                                         generator=torch.Generator().manual_seed(0))]
    args = T.TrainingArguments(str(output_dir), max_steps=6, per_device_train_batch_size=4, learning_rate=1e-2,
                               save_strategy="steps", save_steps=2, report_to="none", use_cpu=True,
                               disable_tqdm=True, logging_steps=100, seed=0, data_seed=0)
    callback = SwishBetaToBilinear(anneal_fraction=0.5)
    # snapshots of the model as it is when each checkpoint is written (on_save runs right after the Trainer's save)
    snapshots = {}

    class _Snapshot(T.TrainerCallback):
        def on_save(self, args, state, control, model=None, **kwargs):
            with torch.no_grad():
                snapshots[state.global_step] = (model(IDS).logits.clone(), callback.beta)

    trainer = T.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback, _Snapshot()])
    trainer.train(**extra)
    return snapshots


def test_swish_beta_checkpoints_load_as_the_model_they_were_and_stock_loads_refuse(tmp_path):
    """Every checkpoint saved while the gates annealed kept hidden_act='silu' and a down_proj without the folded 1/2:
    from_pretrained gave the SiLU model, silently (logits 6e-4 off at beta = 0, 1e-2 mid-annealing). The config now
    records the gates' beta; load_annealing_checkpoint rebuilds exactly the model saved, a stock from_pretrained is
    refused naming it, and the finalised model still loads with from_pretrained as the bilinear one."""
    model = _llama()
    snapshots = _anneal(model, tmp_path)
    assert sorted(snapshots) == [2, 4, 6] and snapshots[2][1] > 0 and snapshots[6][1] == 0.0
    for step, (logits, beta) in snapshots.items():
        checkpoint = tmp_path / f"checkpoint-{step}"
        with pytest.raises(KeyError, match="load_annealing_checkpoint"):
            T.LlamaForCausalLM.from_pretrained(checkpoint)
        with pytest.raises(KeyError, match="load_annealing_checkpoint"):
            T.AutoModelForCausalLM.from_pretrained(checkpoint)
        loaded = load_annealing_checkpoint(checkpoint)
        assert all(isinstance(m.act_fn, SwishBeta) and m.act_fn.beta == beta for m in gated_mlps(loaded))
        with torch.no_grad():
            assert torch.equal(loaded.eval()(IDS).logits, logits)
        # saved again, it still says what it is
        loaded.save_pretrained(tmp_path / f"again-{step}")
        with torch.no_grad():
            assert torch.equal(load_annealing_checkpoint(tmp_path / f"again-{step}").eval()(IDS).logits, logits)
    # the model returned is finalised: bilinear, no record, a stock load gives it back
    assert model.config.hidden_act == "linear" and not hasattr(model.config, "swish_beta")
    model.save_pretrained(tmp_path / "final")
    with torch.no_grad():
        assert torch.equal(T.LlamaForCausalLM.from_pretrained(tmp_path / "final")(IDS).logits, model.eval()(IDS).logits)
    # the final model at beta = 0 is checkpoint-6's model with the 1/2 folded: the same function
    torch.testing.assert_close(model(IDS).logits, snapshots[6][0], rtol=1e-5, atol=1e-5)
    with pytest.raises(BcosValueError, match=r"^path: .* holds no Swish_beta annealing state"):
        load_annealing_checkpoint(tmp_path / "final")


def test_swish_beta_resumed_from_a_checkpoint_is_the_uninterrupted_run(tmp_path):
    """Resuming keeps working with the recorded state: the model given is built as the user builds it (SiLU), the
    checkpoint's weights load into it and the callback sets beta from the step; bit-identical to the run not stopped."""
    uninterrupted = _llama()
    _anneal(uninterrupted, tmp_path / "a")
    for step in (2, 4):
        resumed = _llama()
        _anneal(resumed, tmp_path / f"b{step}", resume_from_checkpoint=str(tmp_path / "a" / f"checkpoint-{step}"))
        assert resumed.config.hidden_act == "linear"
        assert all(torch.equal(a, b) for a, b in zip(uninterrupted.state_dict().values(),
                                                     resumed.state_dict().values(), strict=True))


def test_set_swish_beta_by_hand_records_the_gates_and_a_second_annealing_reads_the_original(tmp_path):
    model = _llama()
    set_swish_beta(model, 0.25)
    assert model.config.hidden_act == ANNEALING_ACTIVATION
    assert model.config.swish_beta == {"beta": 0.25, "down_proj_halved": False, "activations": {"hidden_act": "silu"}}
    assert SwishBetaToBilinear()._start_beta(model) == 1.0  # the original, not the marker
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(load_annealing_checkpoint(tmp_path)(IDS).logits, model.eval()(IDS).logits)


def _bs(model) -> set[float]:
    return {m.b for m in model.modules() if isinstance(m, AlignmentPressure)}


def test_train_causal_lm_resumed_from_a_warmup_checkpoint_without_the_warmup_is_refused(tmp_path):
    """A checkpoint written during a B warm-up holds each layer's B of that step: train_causal_lm resumed from it
    without the BWarmupCallback trained every remaining step at that B (1.1 of the model's 1.5) while
    config.bcos['b'] said 1.5, silently. Refused when training begins, the layers back at their B; resumed with the
    warm-up, the run is the uninterrupted one."""
    settings = {"pad_token_id": 0, "max_steps": 6, "per_device_train_batch_size": 2, "learning_rate": 1e-3,
                "use_cpu": True, **QUIET_LM}
    uninterrupted = _causal_lm()
    train_causal_lm(uninterrupted, _rows(), str(tmp_path / "a"),
                    callbacks=[BWarmupCallback(uninterrupted, fraction=1.0)],
                    save_strategy="steps", save_steps=2, **settings)
    checkpoint = str(tmp_path / "a" / "checkpoint-2")
    resumed = _causal_lm()
    with pytest.raises(BcosValueError, match=r"^resume_from_checkpoint: holds B-cos layers at B \[1\.[0-4]\d*\] .* not the "
                                             r"model's \[1\.5\], and no BWarmupCallback is among the callbacks: .* "
                                             r"pass the BWarmupCallback of the run that wrote the checkpoint in "
                                             r"callbacks="):
        train_causal_lm(resumed, _rows(), str(tmp_path / "b"), resume_from_checkpoint=checkpoint, **settings)
    assert _bs(resumed) == {1.5}
    resumed = _causal_lm()
    train_causal_lm(resumed, _rows(), str(tmp_path / "c"), resume_from_checkpoint=checkpoint,
                    callbacks=[BWarmupCallback(resumed, fraction=1.0)], **settings)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.parameters(), resumed.parameters(), strict=True))
    assert _bs(resumed) == {1.5}


def test_a_gemma2_saved_while_annealing_records_hidden_activation_and_reloads_as_it_was(tmp_path):
    """Gemma 2's MLP reads hidden_activation (its config has no hidden_act): that is the key marked and restored."""
    torch.manual_seed(6)
    model = T.Gemma2ForCausalLM(T.Gemma2Config(
        vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, bos_token_id=2, eos_token_id=2,
        pad_token_id=0)).eval()
    set_swish_beta(model, 0.6)
    assert model.config.swish_beta["activations"] == {"hidden_activation": "gelu_pytorch_tanh"}
    model.save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="load_annealing_checkpoint"):
        T.Gemma2ForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(load_annealing_checkpoint(tmp_path).eval()(IDS).logits, model(IDS).logits)
