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

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins.convert.architectures import SPECS
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
