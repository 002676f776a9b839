"""Closing note 22's leftovers B (session 23, helper-141), each pinned here."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T
from conftest import tiny_config

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosKeywordError

# ------------------------------------------------------------------ 1. one TrainingArguments builder


def test_train_causal_lm_logs_a_nan_loss_as_nan_and_takes_the_filter_back_by_keyword(tmp_path):
    """train_causal_lm repeated fine_tuning's keyword check and its logging_nan_inf_filter default; both come from
    one function now: a diverging run logs NaN (not transformers' 0.0), a keyword overrides the default, and a
    misspelt keyword is refused naming train_causal_lm."""
    from bcos_plugins.train_decoder import train_causal_lm

    rows = [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}]
    torch.manual_seed(0)
    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    fresh = {name: value.clone() for name, value in model.state_dict().items()}
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=3, logging_steps=1,
                              learning_rate=1e38, max_grad_norm=0, per_device_train_batch_size=2, disable_tqdm=True)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.args.logging_nan_inf_filter is False
    assert math.isnan(losses[-1])
    model.load_state_dict(fresh)
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=1, disable_tqdm=True,
                              logging_nan_inf_filter=True)
    assert trainer.args.logging_nan_inf_filter is True
    with pytest.raises(BcosKeywordError, match=r"^logging_nan_inf_filtr: is neither an argument of train_causal_lm "
                                               r".*Pass logging_nan_inf_filter= if"):
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, logging_nan_inf_filtr=True)


# ------------------------------------------------------------------ 3. AlignmentPressure reads a stored B in one place


def _bert(b: float = 1.1, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return bcosify(T.BertForSequenceClassification(config).eval(), b=b, verbose=False)


def _buffers(model) -> set[float]:
    return {v.item() for k, v in model.state_dict().items() if k.endswith("bcos_b")}


@pytest.mark.parametrize("assign", [False, True])
def test_a_float32_b_loaded_and_compiled_without_an_eager_call_runs_at_the_recorded_b(assign):
    """A compiled graph reads each layer's bcos_b buffer itself (a float would be baked in), and cannot run the
    reading that maps a float32-stored B (a save on MPS) to the B it records: the buffer must hold B = 1.1, not
    1.100000023841858, as soon as the load returns, before any eager forward."""
    model, fresh = _bert(seed=0), _bert(seed=1)
    state = {k: v.float() if k.endswith("bcos_b") else v for k, v in model.state_dict().items()}
    fresh.load_state_dict(state, assign=assign)
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fresh, backend="eager", fullgraph=True)
        with torch.no_grad():
            assert torch.equal(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    finally:
        torch._dynamo.reset()
    assert _buffers(fresh) == {1.1}
    # the caller's state dict is not written to (assign=True hands its tensors to the model)
    assert {v.item() for k, v in state.items() if k.endswith("bcos_b")} == {torch.tensor(1.1).float().item()}


def test_a_b_written_in_place_under_no_grad_is_read_at_the_next_forward_and_saved():
    """The buffer's version counter tells a write; the value is read, checked and saved as written."""
    model = _bert(b=1.1)
    with torch.no_grad():
        for layer in model.modules():
            if hasattr(layer, "bcos_b"):
                layer.bcos_b.fill_(1.5)
    assert {layer.b for layer in model.modules() if hasattr(layer, "bcos_b")} == {1.5}
    assert _buffers(model) == {1.5}
    with torch.no_grad():
        next(layer for layer in model.modules() if hasattr(layer, "bcos_b")).bcos_b.fill_(0.5)
    from bcos_plugins.errors import BcosValueError
    with pytest.raises(BcosValueError, match=r"bcos_b: the stored alignment pressure is 0\.5, outside \[1, "):
        model(input_ids=torch.tensor([[2, 7, 3]]))

