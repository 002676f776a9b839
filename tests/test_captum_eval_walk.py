"""Captum's ``BcosAttribution`` puts a model in eval mode for the call only when some module of it is training.

``model.eval()`` and the restoring ``model.train(flag)`` walk the whole model (435 us per call on a 2-layer Qwen2);
a model already wholly in eval mode needs neither. A model in training mode is still explained in eval mode (the
same attributions) and handed back in training mode.
"""

from __future__ import annotations

import torch
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
from conftest import padded_batch, tiny_model

from bcos_plugins import bcosify


def _attribute(fwd: EmbeddingForward) -> torch.Tensor:
    ids, mask = padded_batch()
    emb = fwd.embed(ids, mask)
    return BcosAttribution(fwd).attribute(emb, target=1, additional_forward_args=(mask,))


def test_a_model_in_eval_mode_is_not_walked_by_eval_and_train(monkeypatch):
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False).eval()
    fwd = EmbeddingForward(model)
    calls: list[bool] = []
    real_train = model.train
    monkeypatch.setattr(model, "train", lambda mode=True: calls.append(mode) or real_train(mode))
    in_eval = _attribute(fwd)
    assert calls == []

    model.bert.encoder.layer[0].train()  # one module deep down in training mode: eval for the call
    calls.clear()
    torch.testing.assert_close(_attribute(fwd), in_eval, rtol=0, atol=0)
    assert calls == [False, False]  # eval(), then the restoring train(was_training) of a model in eval mode

    real_train(True)
    calls.clear()
    torch.testing.assert_close(_attribute(fwd), in_eval, rtol=0, atol=0)
    assert calls == [False, True] and model.training and model.bert.encoder.layer[0].training
