"""Trust pass 23, training and the papers' methods: resumed warm-ups, mixed precision on the CPU, gradient
accumulation, the Space Model under the training helpers, the ranking objective of the attention supervision, the
bilinear tools and saved-then-reloaded recipes; each pinned where it was silently wrong or crashed unhelpfully."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import tiny_config
from test_pretrain import QUIET, corpus, word_tokenizer

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins.errors import BcosValueError
from bcos_plugins.guided import attention_supervision_loss
from bcos_plugins.pretrain import pretrain_masked_lm
from bcos_plugins.space import SpaceModelForSequenceClassification
from bcos_plugins.train import fine_tune_classifier
from bcos_plugins.train_decoder import train_causal_lm


def _bert_classifier(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


@pytest.mark.parametrize("helper", ["fine_tune_classifier", "pretrain_masked_lm", "train_causal_lm"])
def test_a_model_trained_with_bf16_computes_as_it_saves_and_reloads(helper, tmp_path):
    """With bf16=True (mixed precision; the CPU does it too) accelerate wraps the model's forward in bfloat16 autocast
    and leaves it there when training ends: the model the helpers returned kept computing in bfloat16 (logits 0.004
    off its own float32 weights' on a tiny BERT), so predict / accuracy / explain of it ran in bfloat16 and the same
    model saved and reloaded gave other logits, without a word. The helpers now hand back the model's own forward."""
    tok = word_tokenizer()
    texts, labels = corpus(8)
    batch = dict(tok(texts[:3], padding=True, return_tensors="pt"))
    if helper == "fine_tune_classifier":
        model = _bert_classifier()
        fine_tune_classifier(model, tok, texts, labels, batch_size=4, max_steps=2, bf16=True, **QUIET)
    elif helper == "pretrain_masked_lm":
        torch.manual_seed(0)
        model = pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), tok, texts, b=1.25, batch_size=4,
                                   max_steps=2, bf16=True, **QUIET).model
    else:
        torch.manual_seed(0)
        model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.5, verbose=False)
        train_causal_lm(model, [{"input_ids": ids} for ids in tok(texts)["input_ids"]], str(tmp_path / "run"),
                        pad_token_id=0, max_steps=2, per_device_train_batch_size=4, bf16=True, disable_tqdm=True)
        batch.pop("token_type_ids", None)
    model.save_pretrained(tmp_path / "saved")
    assert torch.equal(_logits(model, batch), _logits(load_bcos_model(tmp_path / "saved"), batch))
    assert "forward" not in vars(model)  # the class's own forward, no autocast wrapper left on the instance


def test_fine_tune_classifier_trains_a_space_model_with_its_own_loss():
    """fine_tune_classifier's loss="auto" trained a Space Model with the cross-entropy alone: the inter- and
    intra-space terms its config weighs (inter_space_weight=5, intra_space_weight=1 here: a loss of 11.55 of which
    the cross-entropy is 0.63) were dropped from training without a word. "auto" is now the model's own loss."""
    tok = word_tokenizer()
    texts, labels = corpus(8)
    torch.manual_seed(0)
    config = tiny_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = SpaceModelForSequenceClassification.from_encoder(T.BertModel(config), num_labels=2, n_latent=3,
                                                             inter_space_weight=5.0, intra_space_weight=1.0)
    batch = dict(tok(texts, padding=True, return_tensors="pt"))
    with torch.no_grad():
        own = model.train()(**batch, labels=torch.tensor(labels))
    trainer = fine_tune_classifier(model, tok, texts, labels, batch_size=8, max_steps=1, logging_steps=1,
                                   learning_rate=1e-9, **QUIET)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert own.loss_terms["cross_entropy"] < 1 < own.loss
    assert logged == [pytest.approx(float(own.loss), rel=1e-5)]


@pytest.mark.parametrize(("settings", "name"), [({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
                                                ({"teacher": "copy"}, "teacher")])
def test_fine_tune_classifier_refuses_what_would_drop_a_space_models_own_loss(settings, name):
    """The Trainer's label smoother, and the distillation loss, replace a model's own loss by the cross-entropy: a
    Space Model's inter- and intra-space terms would be dropped again. Refused by name before training, pointing at
    loss='ce' (the cross-entropy alone, asked for)."""
    import copy

    tok = word_tokenizer()
    texts, labels = corpus(8)
    torch.manual_seed(0)
    model = SpaceModelForSequenceClassification.from_encoder(T.BertModel(tiny_config("bert")), num_labels=2,
                                                             n_latent=3)
    if settings.get("teacher") == "copy":
        settings = {"teacher": copy.deepcopy(model)}
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BcosValueError, match=rf"^{name}: .*SpaceModelForSequenceClassification with its own "
                                             r"loss, the cross-entropy plus the inter- and intra-space terms.*loss='ce'"):
        fine_tune_classifier(model, tok, texts, labels, batch_size=8, max_steps=1, **QUIET, **settings)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_the_rank_objective_does_not_rank_a_soft_rationale_token_against_itself():
    """With a soft gold mask (annotator averages) the pairs weighted gold_g * (1 - gold_o) took in o = g, a token
    against itself, whose log attention difference is 0: the hinge was the margin there for ever, so a rationale
    token leading every other by far scored 0.1667 instead of 0 (and 0.3333 instead of 0.25 with a second soft
    token), and the pairs that can move weighed less in the mean, without a word."""
    attention = torch.tensor([0.98, 0.01, 0.01])
    attentions = (attention.expand(1, 1, 3, 3).contiguous(),)
    loss = attention_supervision_loss(attentions, torch.tensor([[0.6, 0.0, 0.0]]), objective="rank", margin=1.0)
    assert float(loss) == 0.0
    # [1, 0.5, 0]: pairs (0, 1) weight 0.5 and (0, 2) weight 1 hold by log 98; (1, 2) weight 0.5 has the hinge 1
    loss = attention_supervision_loss(attentions, torch.tensor([[1.0, 0.5, 0.0]]), objective="rank", margin=1.0)
    assert float(loss) == pytest.approx(0.5 / 2.0, rel=1e-6)


def _bcos_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return bcosify(T.LlamaForCausalLM(tiny_config("llama")), b=1.5, verbose=False).eval()


def test_finalize_bilinear_refuses_a_bcos_model_whose_down_proj_cannot_take_the_gates_half():
    """finalize_bilinear folds the beta = 0 gate's factor 1/2 into down_proj by halving its weight: a B-cos down_proj
    normalises its weight rows, so the output did not halve and the finalised B-cos Llama's logits moved by 0.13 (of
    0.35), without a word. Refused naming the model, which is left as it was."""
    from bcos_plugins.bilinear.swish_beta import finalize_bilinear, set_swish_beta

    model = _bcos_llama()
    set_swish_beta(model, 0.0)  # annealing a B-cos model's gates stays possible
    ids = torch.randint(5, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(BcosValueError, match=r"^model: its gated MLP 0 \(BcosLlamaMLP\) has B-cos projections "
                                             r"\(gate_proj, up_proj, down_proj\).*before bcosify"):
        finalize_bilinear(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert model.config.hidden_act == "silu"


def test_swish_beta_to_bilinear_refuses_a_bcos_model_before_the_first_step(tmp_path):
    """SwishBetaToBilinear finalises the model when training ends: on a B-cos model that fold changed the model (the
    test above); refused when training begins, before any step trains it."""
    from bcos_plugins.bilinear import SwishBetaToBilinear

    model = _bcos_llama()
    weights = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(0, 60, (8, 12), generator=torch.Generator().manual_seed(0))
    args = T.TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, report_to=[],
                               save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids],
                        callbacks=[SwishBetaToBilinear(0.5)])
    with pytest.raises(BcosValueError, match=r"^model: its gated MLP 0 \(BcosLlamaMLP\) has B-cos projections"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))


def test_a_space_model_over_a_bcos_encoder_reloads_as_saved(tmp_path):
    """A Space head over a B-cos encoder, saved with save_pretrained, came back from from_pretrained with a stock
    encoder, whose forward refused it naming load_bcos_model, which refused the Space folder ("not saved from a model
    converted with bcosify"): the model could not be reloaded at all. It now reloads as saved, each layer at its
    stored B (a save made during a B warm-up too), bit for bit, also through AutoModelForSequenceClassification."""
    from bcos_plugins.nn.linear import AlignmentPressure
    from bcos_plugins.space import register_auto_classes

    tok = word_tokenizer()
    batch = dict(tok(corpus(4)[0], padding=True, return_tensors="pt"))
    torch.manual_seed(0)
    encoder = bcosify(T.BertModel(tiny_config("bert")), b=1.5, bcos_query_key=False, verbose=False)
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=3, n_latent=2).eval()
    for layer in [m for m in model.modules() if isinstance(m, AlignmentPressure)][:3]:
        layer.b = 1.2  # mid-way through a warm-up
    model.save_pretrained(tmp_path)
    register_auto_classes()
    for loaded in (SpaceModelForSequenceClassification.from_pretrained(tmp_path),
                   T.AutoModelForSequenceClassification.from_pretrained(tmp_path)):
        assert torch.equal(_logits(loaded, batch), _logits(model, batch))
        assert [m.b for m in loaded.modules() if isinstance(m, AlignmentPressure)] == \
            [m.b for m in model.modules() if isinstance(m, AlignmentPressure)]
        assert not any(p.requires_grad for p in loaded.encoder.parameters())  # train_encoder=False, as saved


def test_train_causal_lm_smooths_the_shifted_labels_of_a_bcos_gemma2(tmp_path):
    """With label_smoothing_factor the Trainer's label smoother replaced the model's loss and shifted the labels only
    for a class named in transformers' causal-LM mapping: bcosify makes a Gemma 2 a BcosGemma2ForCausalLM, which was
    trained on its unshifted labels (each token predicted from itself: the logged 4.07347 is that loss, where the
    smoothed next-token loss is 4.07572), without a word. The loss is now the shifted one for every class."""
    import copy

    import torch.nn.functional as F

    from bcos_plugins.train_decoder import CausalLMCollator

    torch.manual_seed(0)
    config = T.Gemma2Config(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8, intermediate_size=32, max_position_embeddings=40,
                            pad_token_id=0, attention_dropout=0.0)
    model = bcosify(T.Gemma2ForCausalLM(config), b=1.1, verbose=False)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(4)]
    batch = CausalLMCollator(0)(rows)
    with torch.no_grad():
        logits = copy.deepcopy(model).eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                             position_ids=batch["position_ids"]).logits.float()
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 60), batch["labels"][:, 1:].reshape(-1), ignore_index=-100,
                               label_smoothing=0.1)
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=1, per_device_train_batch_size=4,
                              learning_rate=1e-9, label_smoothing_factor=0.1, logging_steps=1, disable_tqdm=True)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [pytest.approx(float(expected), rel=1e-6, abs=0)]
