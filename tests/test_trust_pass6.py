"""Sixth trust pass: training, persistence, metrics, the Space model and self-guided attention under unusual inputs,
each case checked against a number computed another way (the loss's formula in float64, each row alone) or refused
naming the argument and the fix. The cases that were silently wrong or crashed unhelpfully, one test each."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from conftest import tiny_config, tiny_model
from test_pretrain import QUIET, word_tokenizer

from bcos_plugins import bcos_loss, bcosify, fine_tune_classifier
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.guided import attention_supervision_loss
from bcos_plugins.metrics import perplexity, seqpg_evidence_split, seqpg_score
from bcos_plugins.space import SpaceHead
from bcos_plugins.train import accuracy

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ training: bcos_loss and the classifier helpers


def test_bcos_loss_is_its_formula_in_float64():
    """The guard for the refusals below: BCE on one-hot targets, mean over rows and classes, against the formula."""
    logits = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 2, 1, 1, 0], dtype=torch.int32)
    y = F.one_hot(labels.long(), 3).double()
    p = torch.sigmoid(logits)
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert bcos_loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-14)
    assert bcos_loss(logits, labels, num_items_in_batch=10).item() == pytest.approx(expected.item() / 2, rel=1e-14)


def test_bcos_loss_refuses_one_logit_per_row():
    """One-hot over one class makes every target 1: a single-logit binary classifier's label 0 was trained towards
    1 (0.5174 from logits that should have given a loss for target 0), silently."""
    logits = torch.randn(4, 1)
    with pytest.raises(BcosValueError, match=r"^outputs: has one logit per row.*num_labels=2"):
        bcos_loss(logits, torch.zeros(4, dtype=torch.long))


def test_bcos_loss_refuses_an_infinite_item_count():
    """num_items_in_batch=inf passed the ">= 1" check and returned a loss of exactly 0 (no gradient)."""
    with pytest.raises(BcosValueError, match=r"^num_items_in_batch: must be a count >= 1, got inf"):
        bcos_loss(torch.randn(2, 3), torch.tensor([0, 1]), num_items_in_batch=float("inf"))


def test_a_one_logit_regression_head_is_refused_by_the_classifier_helpers():
    """num_labels=1 is transformers' regression head: its only class id is 0, so accuracy read every prediction as
    class 0 and returned 1.0 for any model, and fine_tune_classifier trained the head towards the constant 0."""
    tok = word_tokenizer()
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=1)).eval()
    texts = ["the cat sat", "a dog ran"]
    with pytest.raises(BcosValueError, match=r"^model: has config\.num_labels == 1, a regression head.*num_labels=2"):
        accuracy(model, tok, texts, [0, 0], max_length=16)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BcosValueError, match=r"^model: has config\.num_labels == 1"):
        fine_tune_classifier(model, tok, texts, [0, 0], epochs=1, batch_size=2, **QUIET)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


# ------------------------------------------------------------------ bcosify: training flags


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification",
                                  "LlamaForSequenceClassification"])
def test_bcosify_keeps_every_modules_training_flag(name):
    """Every module bcosify puts in started in training mode: a model converted in eval mode had model.training
    False and its B-cos layers, norms and activations True."""
    for training in (False, True):
        model = tiny_model(name).train(training)
        bcosify(model, b=1.5, verbose=False)
        assert {m.training for m in model.modules()} == {training}
    # mixed flags: each replacement takes the flag of the module it replaces
    model = tiny_model(name).eval()
    head = "classifier" if name.startswith("Bert") else "score"
    getattr(model, head).train()
    bcosify(model, b=1.5, verbose=False)
    assert getattr(model, head).training
    assert {m.training for n, m in model.named_modules() if not n.startswith(head)} == {False}


# ------------------------------------------------------------------ metrics


def test_seqpg_refuses_overlapping_segments():
    """A token in both segments counted as right and as wrong evidence: the score was 1.0 whatever the
    attributions, and the special tokens' share went negative."""
    segments = torch.zeros(2, 2, 6, dtype=torch.bool)
    segments[:, 0, :4] = True
    segments[:, 1, 3:] = True  # column 3 in both
    attributions = torch.rand(4, 6, generator=torch.Generator().manual_seed(0))
    for metric in (seqpg_score, seqpg_evidence_split):
        with pytest.raises(BcosValueError, match=r"^segment_masks: mark tokens as in both segments in rows \[0, 1\]"):
            metric(attributions, segments)
    segments[:, 1, 3] = False
    assert seqpg_evidence_split(attributions, segments).sum(-1).tolist() == pytest.approx([1.0, 1.0])


def test_perplexity_names_an_empty_text():
    """An empty list of ids was refused as "dtype torch.float32 shape (0,)" (torch's reading of []), a dtype the
    caller never passed."""
    model = tiny_model("GPT2LMHeadModel")
    with pytest.raises(BcosValueError, match=r"^texts: texts\[1\] is empty \(no token ids\): nothing to predict"):
        perplexity(model, [[5, 6, 7], []])


# ------------------------------------------------------------------ self-guided attention and the Space model


def _attentions():
    torch.manual_seed(0)
    config = tiny_config("bert", num_labels=2)
    config._attn_implementation = "eager"
    model = T.BertForSequenceClassification(config).eval()
    ids = torch.randint(3, 60, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions, mask


def test_attention_supervision_loss_refuses_masks_that_are_not_0_1():
    """A NaN in attention_mask made every row's rationale total NaN, so no row counted and the loss was exactly 0; a
    valid_mask of 2s weighted those tokens' attention twice in the renormalisation. Both are refused by name."""
    attentions, mask = _attentions()
    gold = torch.zeros(2, 6)
    gold[0, 1] = gold[1, 2] = 1
    with pytest.raises(BcosValueError, match=r"^attention_mask: contains NaN"):
        attention_supervision_loss(attentions, gold, mask.float().masked_fill(mask == 0, float("nan")))
    with pytest.raises(BcosValueError, match=r"^valid_mask: must be a 0/1 mask, got values \[0, 1, 2\]"):
        attention_supervision_loss(attentions, gold, mask, valid_mask=mask * torch.tensor([[1, 2, 1, 1, 1, 1]]))
    assert attention_supervision_loss(attentions, gold, mask, valid_mask=mask) > 0


def test_space_head_names_a_dtype_mismatch():
    """float64 hidden states into a float32 head failed in torch's einsum with "expected scalar type Float but found
    Double", naming neither argument nor fix."""
    head = SpaceHead(8, 2, 3)
    hidden = torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(BcosTypeError, match=r"^hidden_states: are torch\.float64 but the head's weights are "
                                            r"torch\.float32.*model\.double\(\)"):
        head(hidden)
    logits, _ = head.double()(hidden)
    assert logits.dtype == torch.float64 and math.isfinite(float(logits.detach().sum()))


# ------------------------------------------------------------------ persistence


def test_a_hand_edited_b_in_config_json_is_named_when_the_stored_b_wins(tmp_path):
    """config.bcos['b'] edited from 1.5 to 2.0 loaded silently: the layers ran at the stored 1.5 (the saved model, as
    they should), while config.bcos['b'], what BWarmupCallback anneals towards and a reader takes for the model's
    B, said 2.0. The load now warns naming both; a folder whose layers match config.bcos['b'] loads without it."""
    import json

    from conftest import padded_batch

    from bcos_plugins import load_bcos_model
    from bcos_plugins.nn.linear import AlignmentPressure

    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        load_bcos_model(folder)
    config = json.loads((folder / "config.json").read_text())
    config["bcos"]["b"] = 2.0
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"load: (\d+) of the \1 B-cos layers .* run at the B stored with them "
                                         r"\(1\.5\), not at config\.bcos\['b'\] = 2: .*edited by hand"):
        loaded = load_bcos_model(folder)
    assert {m.b for m in loaded.modules() if isinstance(m, AlignmentPressure)} == {1.5}
    ids, mask = padded_batch()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits,
                           model.eval()(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_classifier_from_masked_lm_keeps_the_masked_lms_dtype_and_weights(dtype):
    """The classifier was built in float32 and the encoder's weights copied into it: a float64 masked LM's weights
    were rounded to float32 (and a bfloat16 one became a float32 model), silently."""
    from bcos_plugins.pretrain import classifier_from_masked_lm

    masked_lm = bcosify(tiny_model("BertForMaskedLM"), b=1.5, verbose=False).to(dtype)
    with torch.no_grad():
        for p in masked_lm.parameters():
            p.add_(torch.full_like(p, 1e-9 if dtype == torch.float64 else 2**-6))  # off float32's grid in float64
    classifier = classifier_from_masked_lm(masked_lm)
    assert {p.dtype for p in classifier.parameters()} == {dtype}
    encoder = dict(masked_lm.bert.named_parameters())
    for name, p in classifier.bert.named_parameters():
        if name in encoder:
            assert torch.equal(p, encoder[name]), name


def test_paired_intervals_refuse_a_single_example():
    """One seed on one example (and a bootstrap over one unit) returned a zero-width interval [d, d]: one example
    both variants got right read as "b non-inferior" at any margin."""
    from bcos_plugins.metrics import paired_accuracy_difference
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    with pytest.raises(BcosValueError, match=r"^predictions_a: hold one seed on one example, which has no spread"):
        paired_accuracy_difference([1], [1], [1])
    with pytest.raises(BcosValueError, match=r"^values_a: hold one unit"):
        paired_bootstrap_difference([0.3], [0.5])
    two = paired_accuracy_difference([1, 0], [1, 1], [1, 1])
    assert two.ci_low < two.difference == 0.5 < two.ci_high


def test_explain_dataset_names_a_text_that_tokenises_to_nothing():
    """An empty text was refused by explain as "attention_mask: row(s) [1] have no real token", an argument the
    caller of explain_dataset never passed."""
    from bcos_plugins import explain_dataset

    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), verbose=False).eval()
    with pytest.raises(BcosValueError, match=r"^data: text 1 \(''\) tokenises to no token.*Drop empty texts"):
        explain_dataset(model, word_tokenizer(), ["the cat", "", "a dog"], batch_size=2, progress=False)


def test_b_warmup_lowers_b_only_when_training_begins(tmp_path):
    """Constructing BWarmupCallback set every layer to B = start at once: an evaluation or a save_pretrained before
    trainer.train() ran at B = 1 instead of the model's B, silently. The warm-up itself is unchanged."""
    from conftest import padded_batch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from bcos_plugins import BWarmupCallback
    from bcos_plugins.nn.linear import AlignmentPressure

    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=2.0, verbose=False)
    ids, mask = padded_batch(batch=4, seed=5)
    with torch.no_grad():
        before = model.eval()(input_ids=ids, attention_mask=mask).logits
    callback = BWarmupCallback(model, start=1.0, fraction=0.5)
    assert {m.b for m in model.modules() if isinstance(m, AlignmentPressure)} == {2.0}
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
    seen = []

    class Record(T.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            seen.append(model.classifier.b)

    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": [0, 1, 2, 0]})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data, compute_loss_func=bcos_loss,
            callbacks=[callback, Record()]).train()
    assert seen == [1.0, 1.5, 2.0, 2.0]


def test_fine_tune_classifier_resumes_from_a_checkpoint(tmp_path):
    """resume_from_checkpoint went to TrainingArguments, which keeps it without acting on it: the run started afresh
    from the model as given, without a word. It now resumes: the resumed run ends on the uninterrupted run's
    weights."""
    tok = word_tokenizer()
    texts, labels = ["the cat sat", "a dog ran far", "the cat", "dog"] * 2, [0, 1, 0, 1] * 2

    def run(output_dir, init_seed, **kwargs):
        torch.manual_seed(init_seed)  # a resumed run starts from the checkpoint's weights, not from its own
        model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), verbose=False)
        fine_tune_classifier(model, tok, texts, labels, batch_size=4, max_steps=2, output_dir=output_dir,
                             learning_rate=1e-2, logging_steps=1, **QUIET, **kwargs)
        return model

    full = run(tmp_path / "full", 0, save_strategy="steps", save_steps=1)
    resumed = run(tmp_path / "resumed", 1, resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("key", "value", "own"), [("num_train_epochs", 3, "epochs=3"),
                                                   ("per_device_train_batch_size", 8, "batch_size=8"),
                                                   ("disable_tqdm", True, "progress=False")])
def test_a_training_argument_the_helper_sets_itself_names_its_own_argument(key, value, own):
    """fine_tune_classifier(..., num_train_epochs=3) failed with Python's bare "TrainingArguments() got multiple
    values for keyword argument 'num_train_epochs'", naming neither the helper's argument nor the fix."""
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), verbose=False)
    with pytest.raises(BcosTypeError, match=rf"^{key}: is set from the training helper's own argument .*"
                                            rf"Pass {own} instead"):
        fine_tune_classifier(model, word_tokenizer(), ["a cat", "the dog"], [0, 1], **{key: value})
