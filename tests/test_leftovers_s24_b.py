"""What trust pass 23's training helper (helper-159) found and left, each pinned where it was silently wrong or
refused with wording that did not say what was true: transformers keys behaviour on a model's class name
(``_get_name``), the Trainer's label smoother replacing a model's own loss, and the B warm-up of a Space Model over
a B-cos encoder."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from conftest import TINY_VIT_SHAPE, tiny_config
from test_pretrain import QUIET, corpus, word_tokenizer

from bcos_plugins import BWarmupCallback, bcosify, load_bcos_model
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.space import SpaceModelForSequenceClassification
from bcos_plugins.train import fine_tune_classifier
from bcos_plugins.train_decoder import CausalLMCollator


def _raw_trainer(model, rows, tmp_path, collator, callbacks=None, **settings):
    args = T.TrainingArguments(str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=len(rows),
                               learning_rate=1e-9, logging_steps=1, disable_tqdm=True, report_to=[],
                               save_strategy="no", use_cpu=True, **settings)
    return T.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator, callbacks=callbacks)


def _gemma2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.Gemma2Config(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8, intermediate_size=32, max_position_embeddings=40,
                            pad_token_id=0, attention_dropout=0.0)
    return bcosify(T.Gemma2ForCausalLM(config), b=1.1, verbose=False)


def test_a_raw_trainer_smooths_the_shifted_labels_of_a_bcos_gemma2(tmp_path):
    """transformers' Trainer, with label_smoothing_factor and no compute_loss_func, shifts the labels only for a model
    whose _get_name() is in its causal-LM mapping: bcosify made a Gemma 2 a BcosGemma2ForCausalLM, whose name is
    not, so a user's own Trainer trained it on its unshifted labels (each token predicted from itself: the logged
    4.07347 is that loss, the smoothed next-token loss 4.07572), without a word. The B-cos class now gives the stock
    name to name-keyed checks; its own class name (repr, save_pretrained's architectures, pickling) is kept."""
    model = _gemma2()
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(4)]
    collator = CausalLMCollator(0)
    batch = collator(rows)
    with torch.no_grad():
        logits = copy.deepcopy(model).eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                             position_ids=batch["position_ids"]).logits.float()
    shifted = F.cross_entropy(logits[:, :-1].reshape(-1, 60), batch["labels"][:, 1:].reshape(-1), ignore_index=-100,
                              label_smoothing=0.1)
    unshifted = F.cross_entropy(logits.reshape(-1, 60), batch["labels"].reshape(-1), ignore_index=-100,
                                label_smoothing=0.1)
    assert abs(float(shifted) - float(unshifted)) > 1e-3  # the two readings differ here
    trainer = _raw_trainer(model, rows, tmp_path, collator, label_smoothing_factor=0.1)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [pytest.approx(float(shifted), rel=1e-6, abs=0)]


def test_every_registry_model_gives_its_stock_name_to_name_keyed_checks_and_keeps_its_own_class(tmp_path):
    """Of the registry, bcosify renames the top-level class of Gemma2ForCausalLM (BcosGemma2ForCausalLM) and
    DistilBertForSequenceClassification (BcosDistilBertForSequenceClassification): each now answers _get_name() with
    its stock name (what transformers' Trainer and PEFT's unwrapping look up in the auto mappings), while its class,
    repr, pickling and save / load are those of the B-cos class as before."""
    from test_conformance import _stock

    renamed = []
    for name in SPECS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = bcosify(_stock(name), b=1.5, verbose=False)
        assert model._get_name() == name, name
        if type(model).__name__ != name:
            renamed.append(name)
            assert type(model).__name__ == f"Bcos{name}"
            assert repr(model).startswith(f"Bcos{name}(")
            again = pickle.loads(pickle.dumps(model))
            assert type(again) is type(model) and again._get_name() == name
    assert sorted(renamed) == ["DistilBertForSequenceClassification", "Gemma2ForCausalLM"]
    model = _gemma2()
    model.save_pretrained(tmp_path)
    reloaded = load_bcos_model(tmp_path)
    assert type(reloaded) is type(model) and reloaded._get_name() == "Gemma2ForCausalLM"
    ids = torch.tensor([[5, 7, 9, 11]])
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(ids).logits, model.eval()(ids).logits)


def _space_over_bcos_encoder(**config_kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    encoder = bcosify(T.BertModel(config), b=1.5, bcos_query_key=False, verbose=False)
    return SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=3, **config_kwargs)


def _text_rows(n: int = 4):
    tok = word_tokenizer()
    texts, labels = corpus(n)
    rows = [{**{k: v for k, v in tok(t).items() if k != "token_type_ids"}, "labels": y}
            for t, y in zip(texts, labels, strict=True)]
    return tok, texts, labels, rows


def _vit_rows(n: int = 4):
    g = torch.Generator().manual_seed(0)
    return [{"pixel_values": torch.rand(1, 16, 16, generator=g), "labels": i % 5} for i in range(n)]


@pytest.mark.parametrize("kind", ["bcos_vit", "space_over_bcos_encoder"])
def test_b_warmup_refuses_label_smoothing_that_would_replace_the_models_own_loss(kind, tmp_path):
    """transformers' Trainer with label_smoothing_factor (and no compute_loss_func) pops the labels and trains its
    smoothed cross-entropy of the logits in place of the model's own loss; the model never sees the setting: a tiny
    BcosViT's B-cos BCE of 0.667 trained as 1.558, a Space Model's inter- and intra-space terms dropped, silently.
    The B warm-up callback, which such a run adds, now refuses it before the first step, naming the setting."""
    from transformers import DataCollatorWithPadding

    if kind == "bcos_vit":
        from bcos_plugins.vision import BcosViT, BcosViTConfig

        torch.manual_seed(0)
        model = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0))
        rows, collator, own = _vit_rows(), None, "B-cos BCE"
    else:
        model = _space_over_bcos_encoder(inter_space_weight=1.0)
        tok, _, _, rows = _text_rows()
        collator, own = DataCollatorWithPadding(tok), "inter- and intra-space terms"
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _raw_trainer(model, rows, tmp_path, collator, callbacks=[BWarmupCallback(model)],
                           label_smoothing_factor=0.1)
    with pytest.raises(BcosValueError, match=rf"^label_smoothing_factor: is 0.1, but .*{own}.*leave "
                                             "label_smoothing_factor out"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_b_warmup_takes_label_smoothing_where_the_models_own_loss_is_the_cross_entropy(tmp_path):
    """A B-cos classifier of the registry computes transformers' cross-entropy: the smoothed one is what the setting
    asks for, so the callback lets it train; and fine_tune_classifier's own warm-up with loss='ce' on a Space Model
    over a B-cos encoder (the smoothed cross-entropy asked for, through the helper's compute_loss_func) trains, its
    logged loss the smoothed cross-entropy of the model's logits."""
    from transformers import DataCollatorWithPadding

    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)
    tok, texts, labels, rows = _text_rows()
    trainer = _raw_trainer(model, rows, tmp_path, DataCollatorWithPadding(tok), callbacks=[BWarmupCallback(model)],
                           label_smoothing_factor=0.1)
    trainer.train()
    assert trainer.state.global_step == 1

    space = _space_over_bcos_encoder(inter_space_weight=1.0)
    batch = dict(tok(texts, padding=True, return_tensors="pt"))
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        logits = space.train()(**batch).logits
    expected = F.cross_entropy(logits, torch.tensor(labels), label_smoothing=0.1)
    trainer = fine_tune_classifier(space, tok, texts, labels, batch_size=4, max_steps=1, logging_steps=1,
                                   learning_rate=1e-9, loss="ce", label_smoothing_factor=0.1, b_warmup=0.5, **QUIET)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [pytest.approx(float(expected), rel=1e-5)]


def test_b_warmup_anneals_a_space_model_over_a_bcos_encoder_and_it_reloads_as_trained(tmp_path):
    """A Space Model over a B-cos encoder keeps config.bcos on its encoder: BWarmupCallback refused it saying it had
    no config.bcos and needed a model "converted with bcosify". It now anneals every B-cos layer of the encoder from
    start to the encoder's B (read at encoder.config.bcos['b']), step by step, ends at that B, and the trained model
    saves and reloads bit for bit."""
    from transformers import DataCollatorWithPadding, TrainerCallback

    model = _space_over_bcos_encoder()
    layers = [m for m in model.modules() if isinstance(m, AlignmentPressure)]
    seen = []

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            seen.append(sorted({layer.b for layer in layers}))

    tok, texts, _, rows = _text_rows()
    trainer = _raw_trainer(model, rows, tmp_path, DataCollatorWithPadding(tok),
                           callbacks=[BWarmupCallback(model, fraction=0.5), Record()])
    trainer.args.max_steps = 4
    trainer.train()
    assert layers and seen == [[1.0], [1.25], [1.5], [1.5]]
    assert {layer.b for layer in layers} == {1.5}
    model.save_pretrained(tmp_path / "saved")
    batch = dict(tok(texts, padding=True, return_tensors="pt"))
    batch.pop("token_type_ids", None)
    loaded = SpaceModelForSequenceClassification.from_pretrained(tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(loaded.eval()(**batch).logits, model.eval()(**batch).logits)


def test_b_warmup_of_a_model_holding_no_bcos_part_says_so_and_what_to_convert():
    """A Space Model over a stock encoder was refused as a model "never converted with bcosify": the message now says
    that neither it nor any module it holds has config.bcos, and to bcosify the encoder before wrapping it."""
    torch.manual_seed(0)
    model = SpaceModelForSequenceClassification.from_encoder(T.BertModel(tiny_config("bert")), num_labels=2,
                                                             n_latent=3)
    with pytest.raises(BcosValueError, match=r"^model: SpaceModelForSequenceClassification has no config.bcos, nor "
                                             r"does any module it holds.*bcosify\(model, b=...\) on the model \(or on the "
                                             r"encoder before SpaceModelForSequenceClassification.from_encoder"):
        BWarmupCallback(model)
