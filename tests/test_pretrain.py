"""B-cos recipes on tiny models: masked-LM pre-training then task ("B-cos then task"), "task then B-cos",
distillation from a conventional teacher, and their argument checks."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T
from conftest import VOCAB, padded_batch, tiny_config, tiny_model

import bcos_plugins.pretrain as pretrain
from bcos_plugins import bcosify, explain, load_bcos_model
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLayerNorm, BcosLinear, DetachableActivation
from bcos_plugins.pretrain import (
    TASK_THEN_BCOS_PRESET_STAGES,
    TASK_THEN_BCOS_PRESETS,
    classifier_from_masked_lm,
    fine_tune_task_then_bcos,
    pretrain_masked_lm,
)
from bcos_plugins.train import fine_tune_classifier, predict

WORDS = [f"w{i}" for i in range(VOCAB - 5)]
QUIET = {"progress": False, "use_cpu": True}


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]")


def corpus(n: int = 24, seed: int = 0) -> tuple[list[str], list[int]]:
    """Texts whose label is whether they hold more words from the first half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for _ in range(n):
        ids = torch.randint(0, len(WORDS), (int(torch.randint(4, 10, (1,), generator=g)),), generator=g)
        texts.append(" ".join(WORDS[i] for i in ids))
        labels.append(int((ids < len(WORDS) // 2).float().mean() > 0.5))
    return texts, labels


def runs_of_words(n: int) -> list[str]:
    """One word repeated (w7 w7 ...): a masked word is the same as the others (learnt in a few steps)."""
    return [" ".join([WORDS[start % len(WORDS)]] * 8) for start in range(n)]


@torch.no_grad()
def masked_loss(model, tok, texts: list[str]) -> float:
    """Cross-entropy at one fixed masked position per text."""
    enc = tok(texts, return_tensors="pt")
    labels = torch.full_like(enc["input_ids"], -100)
    labels[:, 3] = enc["input_ids"][:, 3]
    enc["input_ids"][:, 3] = tok.mask_token_id
    return model.eval()(**enc, labels=labels).loss.item()


def assert_complete(model, atol: float = 1e-4):
    ids, mask = padded_batch(batch=3, seed=1)
    e = explain(model, ids, mask)
    torch.testing.assert_close(e.contributions.sum(-1), e.explained, atol=atol, rtol=1e-4)


def test_bcosify_masked_lm_converts_the_head_transform_and_keeps_the_tied_decoder(tmp_path):
    model = bcosify(tiny_model("BertForMaskedLM"), b=1.25, verbose=False)
    transform = model.cls.predictions.transform
    assert isinstance(transform.dense, BcosLinear) and "bias" not in dict(transform.dense.named_parameters())
    assert isinstance(transform.transform_act_fn, DetachableActivation)
    assert isinstance(transform.LayerNorm, BcosLayerNorm)
    decoder = model.cls.predictions.decoder
    assert type(decoder) is torch.nn.Linear and decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert "cls.predictions.decoder" in model.bcos_report.kept
    # the stock decoder adds a vocabulary bias; set it non-zero: it must not enter the logits
    with torch.no_grad():
        model.cls.predictions.bias.fill_(3.0)
    ids, mask = padded_batch(batch=3)
    e = explain(model, ids, mask, target=torch.tensor([5, 9, 11]), position=1)
    torch.testing.assert_close(e.contributions.sum(-1), e.explained, atol=1e-5, rtol=1e-4)
    hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, model.cls.predictions.transform(hidden) @ decoder.weight.T)
    model.save_pretrained(tmp_path)
    again = load_bcos_model(tmp_path)
    torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits, logits)


def test_bcos_then_task_pretrains_transfers_the_encoder_and_explains_completely(tmp_path):
    tok = word_tokenizer()
    texts, labels = corpus(32)
    stock_folder = tmp_path / "stock"
    config = tiny_config("bert")
    # larger initial weights and no dropout: the tiny model learns the masked words in a few dozen steps
    config.update({"initializer_range": 0.2, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    torch.manual_seed(0)
    T.BertForMaskedLM(config).save_pretrained(stock_folder)
    pooler_source = tmp_path / "base"
    tiny_model("BertModel", seed=3).save_pretrained(pooler_source)

    runs = runs_of_words(48)
    torch.manual_seed(0)
    trainer = pretrain_masked_lm(str(stock_folder), tok, runs, b=1.25, epochs=8, batch_size=8,
                                 learning_rate=1e-2, max_length=16, logging_steps=1, **QUIET)
    mlm = trainer.model
    assert mlm.config.bcos["b"] == 1.25 and mlm.config.bcos["architecture"] == "BertForMaskedLM"
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 48 and all(torch.isfinite(torch.tensor(losses)))
    # the masked-LM objective is learnt: well below a uniform guess over the vocabulary (ln 60 = 4.09)
    assert masked_loss(mlm, tok, runs) < 0.75 * math.log(VOCAB)
    trainer.save_model(str(tmp_path / "mlm"))

    classifier = classifier_from_masked_lm(tmp_path / "mlm", num_labels=2, pooler_from=pooler_source)
    assert type(classifier).__mro__[1] is T.BertForSequenceClassification or isinstance(
        classifier, T.BertForSequenceClassification)
    assert classifier.config.bcos["b"] == 1.25 and classifier.config.num_labels == 2
    encoder, pretrained = classifier.bert.state_dict(), mlm.bert.state_dict()
    assert set(pretrained) < set(encoder)
    for key, value in pretrained.items():
        torch.testing.assert_close(encoder[key], value, msg=key)
    base_pooler = tiny_model("BertModel", seed=3).pooler.dense.weight
    torch.testing.assert_close(classifier.bert.pooler.dense.weight, base_pooler)

    fine_tune_classifier(classifier, tok, texts, labels, epochs=2, batch_size=8, learning_rate=1e-3,
                         max_length=16, **QUIET)
    assert_complete(classifier)
    classifier.save_pretrained(tmp_path / "clf")
    ids, mask = padded_batch(batch=2, seed=4)
    torch.testing.assert_close(load_bcos_model(tmp_path / "clf")(input_ids=ids, attention_mask=mask).logits,
                               classifier(input_ids=ids, attention_mask=mask).logits)


def test_pretraining_continues_a_bcos_masked_lm_at_its_own_b():
    tok = word_tokenizer()
    model = bcosify(tiny_model("BertForMaskedLM"), b=1.5, verbose=False)
    before = model.bert.encoder.layer[0].attention.self.query.weight.detach().clone()
    trainer = pretrain_masked_lm(model, tok, corpus(8)[0], epochs=1, batch_size=8, learning_rate=1e-3,
                                 max_length=16, **QUIET)
    assert trainer.model is model and model.config.bcos["b"] == 1.5
    assert not torch.equal(before, model.bert.encoder.layer[0].attention.self.query.weight)
    with pytest.raises(BcosValueError, match=r"^b: is 1\.25 but the model is already B-cos with B = 1\.5"):
        pretrain_masked_lm(model, tok, ["w1 w2"], b=1.25, **QUIET)


def test_task_then_bcos_fine_tunes_conventionally_then_as_bcos():
    tok = word_tokenizer()
    texts, labels = corpus(24)
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    trainer = fine_tune_task_then_bcos(model, tok, texts, labels, b=1.25, task_epochs=1, task_learning_rate=1e-3,
                                       epochs=2, batch_size=8, learning_rate=1e-3, max_length=16,
                                       logging_steps=1, **QUIET)
    assert trainer.model is model and model.config.bcos["b"] == 1.25
    assert isinstance(model.classifier, BcosLinear)
    assert trainer.compute_loss_func is not None  # the second stage trains with bcos_loss
    # the B-cos stage's own schedule (docs/recipes.md: task-then-bcos-b1.1-stockqk-warm-cos)
    assert trainer.args.lr_scheduler_type == T.SchedulerType.COSINE and trainer.args.warmup_steps == 0.1
    assert_complete(model)
    with pytest.raises(BcosValueError, match=r"^model: is already B-cos"):
        fine_tune_task_then_bcos(model, tok, texts, labels, **QUIET)
    # a schedule passed by the caller wins over the B-cos stage's default
    other = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    trainer = fine_tune_task_then_bcos(other, tok, texts[:8], labels[:8], task_epochs=1, epochs=1, max_length=16,
                                       lr_scheduler_type="linear", **QUIET)
    assert trainer.args.lr_scheduler_type == T.SchedulerType.LINEAR


@pytest.mark.parametrize(("choice", "expected_b"), [
    ({}, 1.1),  # no b, no preset: the "accurate" preset, today's default recipe
    ({"preset": "accurate"}, 1.1),
    ({"preset": "faithful"}, 1.5),
    ({"b": 1.25}, 1.25),  # an explicit b still sets any B
])
def test_task_then_bcos_bcosifies_at_the_presets_b(choice, expected_b):
    tok = word_tokenizer()
    texts, labels = corpus(8)
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    fine_tune_task_then_bcos(model, tok, texts, labels, task_epochs=1, epochs=1, batch_size=8, max_length=16,
                             **choice, **QUIET)
    layers = [m for m in model.modules() if isinstance(m, BcosLinear)]
    assert layers and {m.b for m in layers} == {expected_b}
    assert model.config.bcos["b"] == expected_b
    assert model.config.bcos["query_key"] == "stock"  # every preset keeps the recipe's stock query/key
    assert not isinstance(model.bert.encoder.layer[0].attention.self.query, BcosLinear)


def test_task_then_bcos_presets_are_the_frontiers_two_bs():
    # docs/benchmarks.md#frontier: "accurate" the most accurate B, "faithful" the B that leads on Comp and Suff
    assert TASK_THEN_BCOS_PRESETS == {"accurate": 1.1, "faithful": 1.5}
    # and the B-cos stage that keeps B = 1.5 within 3 points on AG News (the frontier's long-distilled schedule)
    assert TASK_THEN_BCOS_PRESET_STAGES == {"accurate": {"epochs": 2.0, "distill_from_task_stage": False},
                                            "faithful": {"epochs": 4.0, "distill_from_task_stage": True}}


def _spy_on_the_stages(monkeypatch):
    """The keyword arguments of each fine_tune_classifier call of fine_tune_task_then_bcos (no training)."""
    calls = []

    def record(model, tokenizer, texts, labels, **kwargs):
        calls.append({**kwargs, "model": model, "weight": model.classifier.weight.detach().clone()})
        with torch.no_grad():  # the first stage "trains": the teacher must be the model as this stage left it
            model.classifier.weight.add_(1.0)

    monkeypatch.setattr(pretrain, "fine_tune_classifier", record)
    return calls


@pytest.mark.parametrize(("choice", "epochs", "distilled"), [
    ({}, 2.0, False),
    ({"preset": "accurate"}, 2.0, False),
    ({"preset": "faithful"}, 4.0, True),
    ({"b": 1.5}, 2.0, False),  # a B of the caller's own: the recipe's stage, not the faithful preset's
    ({"preset": "faithful", "epochs": 3.0}, 3.0, True),  # an explicit epochs wins
    ({"preset": "faithful", "distill_from_task_stage": False}, 4.0, False),
    ({"preset": "accurate", "distill_from_task_stage": True}, 2.0, True),
])
def test_task_then_bcos_b_cos_stage_follows_the_preset(monkeypatch, choice, epochs, distilled):
    calls = _spy_on_the_stages(monkeypatch)
    tok = word_tokenizer()
    texts, labels = corpus(8)
    model = tiny_model("BertForSequenceClassification")
    fine_tune_task_then_bcos(model, tok, texts, labels, task_epochs=1, **choice, **QUIET)
    task, bcos_stage = calls
    assert task["loss"] == "ce" and "teacher" not in task
    assert bcos_stage["epochs"] == epochs
    teacher = bcos_stage.get("teacher")
    if not distilled:
        assert teacher is None
        return
    # a stock copy of the model after the first stage, not the B-cos model being trained
    assert teacher is not model and not any(isinstance(m, BcosLinear) for m in teacher.modules())
    assert not teacher.training
    assert torch.equal(teacher.classifier.weight, task["weight"] + 1.0)
    assert torch.equal(teacher.classifier.weight, bcos_stage["weight"])  # bcosify keeps the weight's values


def test_task_then_bcos_teacher_of_ones_own_replaces_the_presets_distillation(monkeypatch):
    calls = _spy_on_the_stages(monkeypatch)
    tok = word_tokenizer()
    texts, labels = corpus(8)
    mine = tiny_model("BertForSequenceClassification")
    model = tiny_model("BertForSequenceClassification")
    fine_tune_task_then_bcos(model, tok, texts, labels, preset="faithful", teacher=mine, **QUIET)
    assert calls[1]["teacher"] is mine and calls[1]["epochs"] == 4.0
    with pytest.raises(BcosValueError, match=r"^distill_from_task_stage: is True and teacher= is given, but the "
                                            r"B-cos stage distils from one teacher\. pass distill_from_task_stage="
                                            r"False to distil from your teacher"):
        fine_tune_task_then_bcos(tiny_model("BertForSequenceClassification"), tok, texts, labels,
                                 distill_from_task_stage=True, teacher=mine, **QUIET)
    with pytest.raises(BcosTypeError, match=r"^distill_from_task_stage: must be True, False or None, got str 'yes'"):
        fine_tune_task_then_bcos(tiny_model("BertForSequenceClassification"), tok, texts, labels,
                                 distill_from_task_stage="yes", **QUIET)
    assert len(calls) == 2  # both refusals came before any stage ran


def test_task_then_bcos_refuses_b_with_a_preset_or_an_unknown_preset_before_training():
    tok = word_tokenizer()
    texts, labels = corpus(8)
    stock = tiny_model("BertForSequenceClassification")
    before = {k: v.clone() for k, v in stock.state_dict().items()}
    with pytest.raises(BcosValueError, match=r"^b: is 1\.25 and preset is 'faithful', but a preset sets B itself "
                                            r"\(B = 1\.5\)\. pass either b= \(your own B\) or preset=, not both"):
        fine_tune_task_then_bcos(stock, tok, texts, labels, b=1.25, preset="faithful", **QUIET)
    with pytest.raises(BcosValueError, match=r"^b: is 1\.1 and preset is 'accurate'"):  # even at the preset's own B
        fine_tune_task_then_bcos(stock, tok, texts, labels, b=1.1, preset="accurate", **QUIET)
    with pytest.raises(BcosValueError, match=r"^preset: must be one of \('accurate', 'faithful'\), got 'fast'\. "
                                            r"Pick one of those, or leave preset out \(the default, 'accurate'\)\.$"):
        fine_tune_task_then_bcos(stock, tok, texts, labels, preset="fast", **QUIET)
    with pytest.raises(BcosValueError, match=r"^preset: must be one of \('accurate', 'faithful'\), got 1\.5"):
        fine_tune_task_then_bcos(stock, tok, texts, labels, preset=1.5, **QUIET)
    # refused before the conventional stage trained: the model is untouched and still stock
    assert all(torch.equal(v, before[k]) for k, v in stock.state_dict().items())
    assert not any(isinstance(m, BcosLinear) for m in stock.modules())


def _distance(model, teacher, tok, texts):
    student = predict(model, tok, texts, max_length=16).softmax(-1)
    return (student - predict(teacher, tok, texts, max_length=16).softmax(-1)).abs().mean().item()


@pytest.mark.parametrize("kind", ["kl", "mse"])
def test_distillation_moves_the_student_toward_the_teacher(kind):
    tok = word_tokenizer()
    texts, labels = corpus(24)
    teacher = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    with torch.no_grad():  # a confident teacher whose decisions do not follow the labels
        teacher.classifier.weight.mul_(40.0)
    settings = dict(epochs=4, batch_size=8, learning_rate=3e-3, max_length=16, **QUIET)

    def student():
        return bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.25, verbose=False)

    torch.manual_seed(1)
    plain = student()
    fine_tune_classifier(plain, tok, texts, labels, **settings)
    torch.manual_seed(1)
    distilled = student()
    trainer = fine_tune_classifier(distilled, tok, texts, labels, teacher=teacher, distill_weight=5.0,
                                   distill_loss=kind, distill_temperature=2.0 if kind == "kl" else 1.0,
                                   logging_steps=1, **settings)
    assert type(trainer).__name__ == "BcosDistillationTrainer"
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)
    d_distilled, d_plain = _distance(distilled, teacher, tok, texts), _distance(plain, teacher, tok, texts)
    assert d_distilled < 0.8 * d_plain


def test_distillation_loss_is_task_loss_plus_weighted_term():
    from bcos_plugins.losses import DistillationLoss, bcos_loss

    logits, teacher = torch.tensor([[1.0, -2.0], [0.5, 0.3]]), torch.tensor([[3.0, -1.0], [-1.0, 2.0]])
    labels = torch.tensor([0, 1])
    loss = DistillationLoss(True, 0.5, "kl", 2.0)
    loss.trainer = type("T", (), {"teacher_batch": teacher})()
    p_t, log_s = (teacher / 2).softmax(-1), (logits / 2).log_softmax(-1)
    kl = (p_t * (p_t.log() - log_s)).sum(-1).mean() * 4
    torch.testing.assert_close(loss(logits, labels), bcos_loss(logits, labels) + 0.5 * kl)
    mse = DistillationLoss(False, 2.0, "mse", 1.0)
    mse.trainer = loss.trainer
    expected = torch.nn.functional.cross_entropy(logits, labels) + 2.0 * (logits - teacher).pow(2).mean()
    torch.testing.assert_close(mse(logits, labels), expected)
    # gradient accumulation: summed over rows, divided by the count (like bcos_loss)
    torch.testing.assert_close(mse(logits, labels, num_items_in_batch=4), expected * 2 / 4)


def test_recipe_arguments_are_validated():
    tok = word_tokenizer()
    clf = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    with pytest.raises(BcosTypeError, match=r"^model: must be a masked-LM model \(BertForMaskedLM\), got "
                                            r"BertForSequenceClassification"):
        pretrain_masked_lm(tiny_model("BertForSequenceClassification"), tok, ["w1"])
    with pytest.raises(BcosValueError, match=r"^tokenizer: must be a transformers tokenizer with a mask token"):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), lambda *a: None, ["w1"])
    with pytest.raises(BcosValueError, match=r"^mlm_probability: must be finite and \(0, 1\]"):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), tok, ["w1"], mlm_probability=0.0)
    with pytest.raises(BcosValueError, match=r"^texts: is empty"):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), tok, [])
    with pytest.raises(BcosTypeError, match=r"^masked_lm: must be a B-cos masked LM"):
        classifier_from_masked_lm(tiny_model("BertForMaskedLM"))
    with pytest.raises(BcosTypeError, match=r"^masked_lm: must be a masked-LM model"):
        classifier_from_masked_lm(clf)
    with pytest.raises(BcosValueError, match=r"^num_labels: must be >= 1"):
        classifier_from_masked_lm(bcosify(tiny_model("BertForMaskedLM"), verbose=False), num_labels=0)
    call = {"model": clf, "tokenizer": tok, "texts": ["w1", "w2"], "labels": [0, 1]}
    with pytest.raises(BcosValueError, match=r"^distill_weight: is 0\.5 but no teacher was given"):
        fine_tune_classifier(**call, distill_weight=0.5)
    with pytest.raises(BcosValueError, match=r"^teacher: has 2 labels, the model 3"):
        fine_tune_classifier(**call, teacher=T.BertForSequenceClassification(tiny_config("bert", 2)))
    teacher = tiny_model("BertForSequenceClassification", seed=2)
    with pytest.raises(BcosValueError, match=r"^distill_loss: must be 'kl' or 'mse', got 'l1'"):
        fine_tune_classifier(**call, teacher=teacher, distill_loss="l1")
    with pytest.raises(BcosValueError, match=r"^distill_weight: must be finite and >= 0"):
        fine_tune_classifier(**call, teacher=teacher, distill_weight=-1.0)
    with pytest.raises(BcosValueError, match=r"^teacher: is the model being trained"):
        fine_tune_classifier(**call, teacher=clf)
    with pytest.raises(BcosTypeError, match=r"^teacher: must be a transformers sequence classifier"):
        fine_tune_classifier(**call, teacher="bert")
    with pytest.raises(BcosValueError, match=r"^loss: is 'ce', but the B-cos stage trains with bcos_loss"):
        fine_tune_task_then_bcos(tiny_model("BertForSequenceClassification"), tok, ["w1"], [0], loss="ce")
    stock = tiny_model("BertForSequenceClassification")
    before = {k: v.clone() for k, v in stock.state_dict().items()}
    with pytest.raises(BcosValueError, match=r"^task_epochs: must be finite and > 0"):
        fine_tune_task_then_bcos(stock, tok, ["w1"], [0], task_epochs=0)
    with pytest.raises(BcosValueError, match=r"^learning_rate: must be finite and > 0"):
        fine_tune_task_then_bcos(stock, tok, ["w1"], [0], learning_rate=-1.0)
    # refused before the conventional stage trained: the model is untouched
    assert all(torch.equal(v, before[k]) for k, v in stock.state_dict().items())


@pytest.mark.parametrize("change", ["module", "subclass"])
def test_task_then_bcos_refuses_a_model_bcosify_cannot_convert_before_training_it(change):
    from bcos_plugins import UnsupportedModuleError

    tok = word_tokenizer()
    texts, labels = corpus(8)
    torch.manual_seed(0)
    if change == "module":  # an activation bcosify has no dynamic-weight form for
        model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
        model.bert.encoder.layer[0].intermediate.intermediate_act_fn = torch.nn.Tanh()
        pattern = r"cannot convert module 'bert\.encoder\.layer\.0\.intermediate\.intermediate_act_fn'"
    else:  # a subclass may compute another forward pass
        model = type("MyBert", (T.BertForSequenceClassification,), {})(tiny_config("bert", num_labels=2))
        pattern = r"MyBert is not"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsupportedModuleError, match=pattern):
        fine_tune_task_then_bcos(model, tok, texts, labels, task_epochs=1, epochs=1, batch_size=4, max_length=16,
                                 **QUIET)
    # the conventional stage never ran: the user's model is as it was
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
