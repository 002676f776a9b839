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
