"""bcos_loss: definition, Trainer integration, errors; sentence pairs and the two-rate optimiser of the
fine-tuning helpers."""

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
    with pytest.raises(TypeError, match=r"labels: got a float \(torch\.float32\); ids must be integers"):
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


def pair_tokenizer():
    """The word-level tokenizer of test_pretrain with BERT's pair template: [CLS] a [SEP] b [SEP], token types."""
    from test_pretrain import word_tokenizer
    from tokenizers.processors import TemplateProcessing

    tok = word_tokenizer()
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.cls_token_id), ("[SEP]", tok.sep_token_id)])
    tok.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    return tok


def test_sentence_pairs_are_encoded_as_pairs_and_learnt_from_the_second_text():
    """The label is a word of the second text only: a model fine-tuned with ``text_pairs`` learns it, and
    ``predict`` / ``accuracy`` read the same pair encoding the training used."""
    import transformers as T
    from conftest import tiny_config
    from test_pretrain import QUIET, corpus

    from bcos_plugins.train import accuracy, fine_tune_classifier, predict

    tok = pair_tokenizer()
    noise, _ = corpus(48, seed=2)
    labels = [i % 2 for i in range(48)]
    pairs = [f"{'w1' if y else 'w2'} {words}" for y, words in zip(labels, noise, strict=True)]
    firsts, _ = corpus(48, seed=3)  # independent of the labels
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    trainer = fine_tune_classifier(model, tok, firsts, labels, text_pairs=pairs, epochs=8, batch_size=8,
                                   learning_rate=3e-3, max_length=32, loss="ce", **QUIET)
    item = trainer.train_dataset[0]
    expected = tok(firsts[0], pairs[0], truncation=True, max_length=32)
    assert item["input_ids"] == expected["input_ids"] and item["token_type_ids"] == expected["token_type_ids"]
    assert item["input_ids"].count(tok.sep_token_id) == 2 and 1 in item["token_type_ids"]
    enc = tok(firsts[:5], pairs[:5], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(predict(model, tok, firsts[:5], text_pairs=pairs[:5], max_length=32),
                                   model.eval()(**enc).logits)
    # called with gradients on, predictions still carry no autograd graph
    assert not predict(model, tok, firsts[:2], text_pairs=pairs[:2], max_length=32).requires_grad
    assert accuracy(model, tok, firsts, labels, text_pairs=pairs, max_length=32) >= 0.9


def test_predict_batches_by_length_and_returns_rows_in_input_order():
    """Texts of very different lengths, two per batch: each row equals the logits of its text predicted alone,
    with and without sentence pairs, and the accuracy follows its labels."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins.train import accuracy, predict

    tok = pair_tokenizer()
    texts = ["w1 " * 9, "w2", "w1 w2 " * 4, "w2 w2 w1", "w1"]
    pairs = ["w2", "w1 " * 7, "w1", "w2 w1", "w2 " * 5]
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    batched = predict(model, tok, texts, batch_size=2, max_length=32)
    alone = torch.cat([predict(model, tok, [t], max_length=32) for t in texts])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-4)
    batched_pairs = predict(model, tok, texts, text_pairs=pairs, batch_size=2, max_length=32)
    alone_pairs = torch.cat([predict(model, tok, [t], text_pairs=[p], max_length=32) for t, p in zip(texts, pairs, strict=True)])
    torch.testing.assert_close(batched_pairs, alone_pairs, atol=1e-5, rtol=1e-4)
    labels = batched.argmax(-1).tolist()
    assert accuracy(model, tok, texts, labels, batch_size=2, max_length=32) == 1.0
    assert accuracy(model, tok, texts, [1 - y for y in labels], batch_size=2, max_length=32) == 0.0


@pytest.mark.parametrize("dtype, expected", [(torch.float64, torch.float64), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32)])
def test_predict_keeps_a_float64_models_logits_in_float64(dtype, expected):
    """The package's rule (at_least_float32): a float64 model's logits were rounded to float32 (about 1e-7)."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins.train import predict

    tok = pair_tokenizer()
    texts = ["w1 " * 9, "w2", "w1 w2 " * 4]
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval().to(dtype)
    logits = predict(model, tok, texts, batch_size=2, max_length=32)
    assert logits.dtype == expected
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        direct = model(**enc).logits
    # float64: 1e-12 fails a float32 rounding (about 1e-9 at these logits); the others to their model's rounding
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(logits, direct.to(expected), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("class_name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_predict_computes_a_decoder_classifiers_rows_as_alone_under_left_padding(class_name):
    """A left-padding tokenizer shifts a decoder's positions unless they count real tokens (as explain does):
    each row equals its text predicted alone, on either padding side."""
    from bcos_plugins.train import predict

    tok = pair_tokenizer()
    texts = ["w1 " * 9, "w2", "w1 w2 " * 4, "w2 w2 w1", "w1"]
    model = tiny_model(class_name)
    alone = torch.cat([predict(model, tok, [t], max_length=32) for t in texts])
    for side in ("right", "left"):
        tok.padding_side = side
        torch.testing.assert_close(predict(model, tok, texts, batch_size=5, max_length=32), alone, atol=1e-5,
                                   rtol=1e-4, msg=lambda m, side=side: f"padding on the {side}: {m}")


def test_task_then_bcos_passes_text_pairs_to_both_stages():
    import transformers as T
    from conftest import tiny_config
    from test_pretrain import QUIET, corpus

    from bcos_plugins.pretrain import fine_tune_task_then_bcos

    tok = pair_tokenizer()
    texts, labels = corpus(16)
    pairs, _ = corpus(16, seed=1)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    trainer = fine_tune_task_then_bcos(model, tok, texts, labels, text_pairs=pairs, b=1.1, bcos_query_key=False,
                                       task_epochs=1, epochs=1, batch_size=8, max_length=32, **QUIET)
    assert trainer.train_dataset[0]["token_type_ids"] == tok(texts[0], pairs[0])["token_type_ids"]


@pytest.mark.parametrize(("text_pairs", "pattern", "kind"), [
    (["x"], r"^text_pairs: 2 texts but 1 text_pairs\. .*one second text per text", ValueError),
    ("xy", r"^text_pairs: must be a list of strings", TypeError),
    (["x", None], r"^text_pairs: text_pairs\[1\] is NoneType None, not a string", TypeError),
])
def test_text_pairs_are_validated(text_pairs, pattern, kind):
    from bcos_plugins.train import accuracy, fine_tune_classifier, predict

    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    tok = lambda *a, **k: None  # noqa: E731 - never reached: the arguments are checked first
    for call in (lambda: fine_tune_classifier(model, tok, ["a", "b"], [0, 1], text_pairs=text_pairs),
                 lambda: predict(model, tok, ["a", "b"], text_pairs=text_pairs),
                 lambda: accuracy(model, tok, ["a", "b"], [0, 1], text_pairs=text_pairs)):
        with pytest.raises(kind, match=pattern):
            call()


def test_two_rate_adamw_groups_encoder_and_head():
    from bcos_plugins.train import two_rate_adamw

    model = tiny_model("BertForSequenceClassification")
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    opt = two_rate_adamw(model, 2e-4, 1e-3, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    body, head = ([names[id(p)] for p in g["params"]] for g in opt.param_groups)
    assert [g["lr"] for g in opt.param_groups] == [2e-4, 1e-3]
    assert all(g["weight_decay"] == 0.01 for g in opt.param_groups)
    assert set(head) == {n for n in names.values() if n.startswith(("classifier.", "bert.pooler."))}
    assert "bert.embeddings.word_embeddings.weight" not in body  # frozen: left out
    assert len(body) + len(head) == sum(p.requires_grad for p in model.parameters())
    # a frozen encoder leaves only the head's group
    for p in model.bert.parameters():
        p.requires_grad_(False)
    assert [g["lr"] for g in two_rate_adamw(model, 2e-4, 1e-3).param_groups] == [1e-3]


def test_two_rate_adamw_errors():
    from bcos_plugins.train import two_rate_adamw

    model = tiny_model("BertForSequenceClassification")
    with pytest.raises(ValueError, match=r"^head_learning_rate: must be finite and > 0, got 0\.0"):
        two_rate_adamw(model, 1e-4, 0.0)
    with pytest.raises(ValueError, match=r"^weight_decay: must be finite and >= 0"):
        two_rate_adamw(model, 1e-4, 1e-3, weight_decay=-0.1)
    with pytest.raises(ValueError, match=r"^model: has no encoder parameters under base_model_prefix ''"):
        two_rate_adamw(torch.nn.Linear(2, 2), 1e-4, 1e-3)
    with pytest.raises(TypeError, match=r"^model: must be a torch module"):
        two_rate_adamw("bert", 1e-4, 1e-3)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^model: has no trainable parameters"):
        two_rate_adamw(model, 1e-4, 1e-3)


def test_bcos_plugins_train_still_gives_every_name_it_gave_before_the_split():
    import bcos_plugins
    from bcos_plugins import b_warmup, fine_tuning, losses, persistence, prediction, train

    homes = {"bcos_loss": losses, "fine_tune_classifier": fine_tuning, "two_rate_adamw": fine_tuning,
             "predict": prediction, "accuracy": prediction, "BWarmupCallback": b_warmup,
             "load_bcos_model": persistence, "reconvert_stock_load": persistence}
    assert set(train.__all__) == set(homes) - {"reconvert_stock_load"}
    for name, home in homes.items():
        assert getattr(train, name) is getattr(home, name), name
    assert bcos_plugins.load_bcos_model is persistence.load_bcos_model and bcos_plugins.bcos_loss is losses.bcos_loss
    assert train.check_labels([0, 1], 2) == [0, 1]


def test_a_tokenizer_that_pads_on_the_left_is_refused_for_a_first_column_classifier():
    """BERT classifies from the first column's hidden state, a padding token's on a left-padded row: predict gave a
    padded text other logits than alone, and fine_tune_classifier trained padded rows on a padding token's logits
    (silently). Both refuse such a tokenizer with the one check of explain, fine_tune_classifier before any step;
    padded on the right, each text is predicted as alone."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins.train import accuracy, fine_tune_classifier, predict

    tok = pair_tokenizer()
    texts = ["w1 " * 9, "w2", "w1 w2 " * 4, "w2 w2 w1"]
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    alone = torch.cat([predict(model, tok, [t], max_length=32) for t in texts])
    torch.testing.assert_close(predict(model, tok, texts, batch_size=4, max_length=32), alone, atol=1e-5, rtol=1e-4)
    tok.padding_side = "left"
    # predict / accuracy / fine_tune_classifier pad the texts themselves: the refusal names the tokenizer's padding side
    refusal = (r"^tokenizer: pads on the left \(tokenizer\.padding_side='left'\), so rows? \[.*\] starts? with padding, "
               r"and BertForSequenceClassification classifies "
               r"from the first column.*Pad on the right \(tokenizer\.padding_side = 'right'\)")
    before = [p.detach().clone() for p in model.parameters()]
    for call in (lambda: predict(model, tok, texts, batch_size=4, max_length=32),
                 lambda: accuracy(model, tok, texts, [0, 1, 0, 1], batch_size=4, max_length=32),
                 lambda: fine_tune_classifier(model, tok, texts, [0, 1, 0, 1], epochs=1, batch_size=4,
                                              max_length=32, progress=False)):
        with pytest.raises(ValueError, match=refusal):
            call()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step was taken
