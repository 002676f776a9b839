"""Trust pass 25, training: the B warm-up callback as transformers' Trainer finds, removes and counts its callbacks, and
the training helpers' own settings given as NumPy numbers; each pinned where it was silently wrong or crashed
unhelpfully."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T
from conftest import tiny_config
from test_pretrain import QUIET, corpus, word_tokenizer
from test_trust_pass22_training import QUIET_LM, _causal_lm, _rows

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.pretrain import pretrain_masked_lm
from bcos_plugins.train import BWarmupCallback, fine_tune_classifier
from bcos_plugins.train_decoder import train_causal_lm


def _bs(model) -> set[float]:
    return {m.b for m in model.modules() if isinstance(m, AlignmentPressure)}


class _RecordB(T.TrainerCallback):
    """The B of every B-cos layer during each optimiser step (read when the step ends)."""

    def __init__(self, model):
        self.model, self.b = model, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.b[state.global_step] = _bs(self.model)


def test_trainer_remove_callback_finds_the_b_warmup_by_its_class(tmp_path):
    """Each BWarmupCallback was an instance of a class built for it alone, unrelated to BWarmupCallback:
    isinstance(callback, BWarmupCallback) was False, so transformers' trainer.remove_callback(BWarmupCallback) (and
    pop_callback) left the warm-up in, and a second train() of the same trainer annealed B again from 1.0 (steps at
    1.0, 1.25 where the warm-up was asked out), without a word; transformers' warning of a second callback of the same
    class never came either. The instances now share one class that isinstance / issubclass count as BWarmupCallback."""
    model, rows = _causal_lm(), _rows(8)
    warmup, other = BWarmupCallback(model, fraction=0.5), BWarmupCallback(model, fraction=0.25)
    assert isinstance(warmup, BWarmupCallback) and issubclass(type(warmup), BWarmupCallback)
    assert type(warmup) is type(other)  # transformers' add_callback compares classes to warn of a second one
    assert not isinstance(T.TrainerCallback(), BWarmupCallback)
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=4, per_device_train_batch_size=2,
                              learning_rate=1e-6, callbacks=[warmup], **QUIET_LM)
    assert _bs(model) == {1.5}
    trainer.remove_callback(BWarmupCallback)
    assert not any(isinstance(c, BWarmupCallback) for c in trainer.callback_handler.callbacks)
    record = _RecordB(model)
    trainer.add_callback(record)
    trainer.train()
    assert record.b == {1: {1.5}, 2: {1.5}, 3: {1.5}, 4: {1.5}}


def test_two_b_warmups_of_one_model_in_one_run_are_refused(tmp_path):
    """Two warm-ups of the same model in one run (a callback list that already held one) each set B before every step:
    the layers followed the one called last (fraction 0.25: B 1.5 from step 2 on), not the one whose evaluation
    refusals had been checked, without a word. Refused when training begins, the model left at its B; one warm-up
    runs its own schedule."""
    model, rows = _causal_lm(), _rows(8)
    settings = {"pad_token_id": 0, "max_steps": 4, "per_device_train_batch_size": 2, "learning_rate": 1e-6,
                **QUIET_LM}
    first, second = BWarmupCallback(model, fraction=0.5), BWarmupCallback(model, fraction=0.25)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BcosValueError, match=r"^callbacks: holds two BWarmupCallback instances for the same model: "
                                             r".*trainer\.remove_callback\(BWarmupCallback\)"):
        train_causal_lm(model, rows, str(tmp_path / "a"), callbacks=[first, second], **settings)
    assert _bs(model) == {1.5}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    record = _RecordB(model)
    train_causal_lm(model, rows, str(tmp_path / "b"), callbacks=[first, record], **settings)
    assert record.b == {1: {1.0}, 2: {1.25}, 3: {1.5}, 4: {1.5}}


@pytest.mark.parametrize("setting", ["batch_size", "seed", "learning_rate"])
@pytest.mark.parametrize("helper", ["fine_tune_classifier", "pretrain_masked_lm"])
def test_the_helpers_own_settings_may_be_numpy_numbers(helper, setting, tmp_path):
    """The helpers check batch_size, seed and learning_rate as numbers (NumPy's among them) and handed them to
    TrainingArguments as given: a NumPy batch_size failed in torch's sampler ("batch_size should be a positive integer
    value, but got batch_size=4"), a NumPy seed in transformers' set_seed ("The only supported seed types are ..."),
    a NumPy float32 learning_rate at the first checkpoint ("Object of type float32 is not JSON serializable"), naming
    none of the helper's arguments. They now train as with the Python numbers, bit for bit."""
    texts, labels = corpus(8)
    given = {"batch_size": np.int64(4), "seed": np.int64(3), "learning_rate": np.float32(1e-3)}[setting]
    settings = {"batch_size": 4, "seed": 3, "learning_rate": float(np.float32(1e-3)), "max_steps": 2,
                "save_strategy": "steps", "save_steps": 1, **QUIET}

    def trained(value, folder):
        torch.manual_seed(0)
        run = {**settings, setting: value, "output_dir": str(tmp_path / folder)}
        if helper == "fine_tune_classifier":
            model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)
            fine_tune_classifier(model, word_tokenizer(), texts, labels, **run)
            return model
        return pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), texts, b=1.25,
                                  **run).model

    numpy_run, python_run = trained(given, "numpy"), trained(given.item(), "python")
    assert all(torch.equal(a, b) for a, b in zip(numpy_run.parameters(), python_run.parameters(), strict=True))
    assert (tmp_path / "numpy" / "checkpoint-2" / "trainer_state.json").is_file()


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand
@pytest.mark.parametrize(("given", "plain"), [({"layers": np.int64(-1)}, {"layers": -1}),
                                              ({"layers": np.array([0, 1])}, {"layers": [0, 1]}),
                                              ({"heads": np.int64(1)}, {"heads": 1}),
                                              ({"heads": torch.tensor([0, 1])}, {"heads": [0, 1]})])
def test_the_supervised_layers_and_heads_may_be_numpy_or_torch_integers(given, plain):
    """attention_supervision_loss (attention_token_scores) took NumPy integers as query_position and inside a list of
    layers or heads, but refused layers=np.int64(-1) or heads=torch.tensor([0, 1]) as "must be a layer index or a list
    of them", which they are. They now give the loss of the same Python indices."""
    from bcos_plugins.guided import attention_supervision_loss

    g = torch.Generator().manual_seed(0)
    attentions = [torch.softmax(torch.randn(2, 2, 4, 4, generator=g, dtype=torch.float64), -1) for _ in range(2)]
    gold = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    assert torch.equal(attention_supervision_loss(attentions, gold, **given),
                       attention_supervision_loss(attentions, gold, **plain))


def test_resuming_a_warmup_checkpoint_without_the_warmup_is_refused(tmp_path):
    """A checkpoint written during a B warm-up holds each layer's B of that step: fine_tune_classifier resumed from it
    without b_warmup trained every remaining step at that B (1.1 of the model's 1.5) and returned a model running at
    1.1 under config.bcos['b'] = 1.5 (saved and reloaded at 1.1 too), without a word. Refused when training begins,
    the layers back at their B; resumed with the warm-up, the run is the uninterrupted one."""
    texts, labels = corpus(16)
    settings = {"batch_size": 4, "max_steps": 6, "learning_rate": 1e-3, "output_dir": str(tmp_path), **QUIET}

    def model():
        torch.manual_seed(0)
        config = tiny_config("bert", num_labels=2)
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
        return bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False)

    uninterrupted = model()
    fine_tune_classifier(uninterrupted, word_tokenizer(), texts, labels, b_warmup=1.0, save_strategy="steps",
                         save_steps=2, **settings)
    checkpoint = str(tmp_path / "checkpoint-2")
    resumed = model()
    with pytest.raises(BcosValueError, match=r"^resume_from_checkpoint: holds B-cos layers at B \[1\.1\] .* not the "
                                             r"model's \[1\.5\], and b_warmup is not given: .* pass the b_warmup of "
                                             r"the run that wrote the checkpoint"):
        fine_tune_classifier(resumed, word_tokenizer(), texts, labels, resume_from_checkpoint=checkpoint, **settings)
    assert _bs(resumed) == {1.5}
    resumed = model()
    fine_tune_classifier(resumed, word_tokenizer(), texts, labels, b_warmup=1.0, resume_from_checkpoint=checkpoint,
                         **settings)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.parameters(), resumed.parameters(), strict=True))
    assert _bs(resumed) == {1.5}


def test_two_swish_beta_annealings_in_one_run_are_refused_before_the_first_step(tmp_path):
    """Two SwishBetaToBilinear in one trainer each set beta before every step (the gates followed the one called
    last), and the run failed only after its last step, the second finalising a model the first had made bilinear
    ("model: is already bilinear ... without SwishBetaToBilinear"), naming neither callback. Refused when training
    begins, before any step; one annealing runs and finalises the model."""
    from bcos_plugins.bilinear import SwishBetaToBilinear

    torch.manual_seed(0)
    llama = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2))
    ids = torch.randint(60, (8, 12), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = T.TrainingArguments(str(tmp_path), max_steps=6, per_device_train_batch_size=4, report_to="none",
                               use_cpu=True, disable_tqdm=True, save_strategy="no")
    before = [p.detach().clone() for p in llama.parameters()]
    trainer = T.Trainer(model=llama, args=args, train_dataset=rows,
                        callbacks=[SwishBetaToBilinear(0.5), SwishBetaToBilinear(0.2)])
    with pytest.raises(BcosValueError, match=r"^callbacks: holds two SwishBetaToBilinear instances for the same "
                                             r"model: each sets beta before every step"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, llama.parameters(), strict=True))
    trainer.pop_callback(SwishBetaToBilinear)
    trainer.train()
    assert llama.config.hidden_act == "linear"


@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_gradient_accumulation_steps_below_one_is_refused_by_name(steps, tmp_path):
    """TrainingArguments took gradient_accumulation_steps=0 (or -1), and the training helpers' runs failed inside the
    Trainer with a bare "ZeroDivisionError: integer division or modulo by zero". Refused by name before training, by
    every helper (their one TrainingArguments builder)."""
    texts, labels = corpus(8)
    message = r"^gradient_accumulation_steps: must be a whole number >= 1 .* pass 1 \(no accumulation\) or more"
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)
    with pytest.raises(BcosValueError, match=message):
        fine_tune_classifier(model, word_tokenizer(), texts, labels, batch_size=4, max_steps=1,
                             gradient_accumulation_steps=steps, **QUIET)
    with pytest.raises(BcosValueError, match=message):
        train_causal_lm(_causal_lm(), _rows(), str(tmp_path), pad_token_id=0, max_steps=1,
                        gradient_accumulation_steps=steps, **QUIET_LM)
