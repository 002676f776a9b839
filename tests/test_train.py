"""bcos_loss: definition, Trainer integration, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import padded_batch, tiny_model
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from bcos_plugins import bcos_loss, bcosify


def test_bcos_loss_is_bce_on_one_hot_from_logits():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    labels = torch.tensor([0, 2])
    one_hot = torch.tensor([[1.0, 0, 0], [0, 0, 1.0]])
    expected = -(one_hot * F.logsigmoid(logits) + (1 - one_hot) * F.logsigmoid(-logits)).mean()
    torch.testing.assert_close(bcos_loss(logits, labels), expected)
    # large logits stay finite (the sigmoid-then-BCE form would give inf)
    assert torch.isfinite(bcos_loss(torch.tensor([[200.0, -200.0]]), torch.tensor([1])))
    # with num_items_in_batch: summed over rows, divided by the count
    torch.testing.assert_close(bcos_loss(logits, labels, num_items_in_batch=4), expected * 2 / 4)


def test_bcos_loss_errors():
    with pytest.raises(ValueError, match="must lie in"):
        bcos_loss(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="integer class ids"):
        bcos_loss(torch.zeros(2, 3), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="shape \\(batch, classes\\)"):
        bcos_loss(torch.zeros(2, 3, 4), torch.tensor([0, 1]))


def test_one_optimisation_step_lowers_the_loss():
    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch(batch=4)
    labels = torch.tensor([0, 1, 2, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()  # no dropout: the two losses differ only by the step
    losses = []
    for _ in range(2):
        model.zero_grad()
        loss = bcos_loss(model(input_ids=ids, attention_mask=mask), labels)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]


def test_trainer_with_compute_loss_func(tmp_path):
    torch.manual_seed(0)
    model = bcosify(tiny_model("DistilBertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_batch(batch=8, seed=3)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                              "labels": [i % 3 for i in range(8)]})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=5,
                             learning_rate=5e-3, report_to=[], logging_steps=1, save_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, compute_loss_func=bcos_loss)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 5 and losses[-1] < losses[0]


def test_b_warmup_anneals_b_and_ends_at_the_target(tmp_path):
    from bcos_plugins.nn import BcosLinear
    from bcos_plugins.train import BWarmupCallback

    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=2.0, verbose=False)
    seen: list[float] = []
    layer = model.classifier
    original_forward = BcosLinear.forward

    def spy(self, x):
        if self is layer:
            seen.append(self.b)
        return original_forward(self, x)

    ids, mask = padded_batch(batch=4, seed=5)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": [0, 1, 2, 0]})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, compute_loss_func=bcos_loss,
                      callbacks=[BWarmupCallback(model, start=1.0, fraction=0.5)])
    BcosLinear.forward = spy
    try:
        trainer.train()
    finally:
        BcosLinear.forward = original_forward
    assert seen == [1.0, 1.5, 2.0, 2.0]  # steps 0..3, warm-up over the first 2 steps
    assert all(m.b == 2.0 for m in model.modules() if isinstance(m, BcosLinear))


def test_b_warmup_errors():
    from bcos_plugins.train import BWarmupCallback

    with pytest.raises(ValueError, match="needs a model converted with bcosify"):
        BWarmupCallback(tiny_model("BertModel"))
    model = bcosify(tiny_model("BertModel"), b=1.25, verbose=False)
    with pytest.raises(ValueError, match="larger than the model's B"):
        BWarmupCallback(model, start=1.5)
    with pytest.raises(ValueError, match="fraction"):
        BWarmupCallback(model, fraction=0.0)
