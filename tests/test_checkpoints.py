"""Checkpoints hold what was running: per-layer B (also mid warm-up), refused tampering, load errors that name
the file and the fix; bcosify refusing what it cannot make exact; training helpers refusing bad labels."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_config, tiny_model
from datasets import Dataset
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback, TrainingArguments

from bcos_plugins import UnsupportedModuleError, bcosify, explain, load_bcos_model
from bcos_plugins.errors import BcosFileError, BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLinear
from bcos_plugins.train import BWarmupCallback, accuracy, bcos_loss, fine_tune_classifier


def _layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, BcosLinear)}


def _logits(model, ids, mask):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).logits.clone()
    model.train(was_training)
    return out


def test_every_bcos_layer_stores_the_b_it_runs_with():
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    state = model.state_dict()
    layers = _layers(model)
    assert {f"{n}.bcos_b" for n in layers} <= set(state)
    model.classifier.b = 1.2
    assert model.state_dict()["classifier.bcos_b"].item() == 1.2
    model.half()  # dtype conversions must not round B (1.2 is not a float16 number)
    assert model.classifier.bcos_b.dtype == torch.float64 and model.classifier.b == 1.2
    other = bcosify(tiny_model("BertForSequenceClassification", seed=1), b=1.5, verbose=False)
    ids, mask = padded_batch()
    other.load_state_dict(model.float().state_dict())
    assert other.classifier.b == 1.2  # what load_state_dict wrote is what runs
    assert torch.equal(_logits(other, ids, mask), _logits(model, ids, mask))


class _RecordAtSave(TrainerCallback):
    def __init__(self, model, ids, mask):
        self.model, self.ids, self.mask, self.logits, self.b = model, ids, mask, {}, {}

    def on_save(self, args, state, control, **kwargs):
        self.logits[state.global_step] = _logits(self.model, self.ids, self.mask)
        self.b[state.global_step] = self.model.classifier.b


def _train_data():
    ids, mask = padded_batch(batch=4, seed=5)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": [0, 1, 2, 0]})


def test_trainer_checkpoint_during_b_warmup_reloads_at_the_b_it_was_running_with(tmp_path):
    # The case: the checkpoint reloaded at the final B (logits -0.345 -> -0.042).
    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=2.0, verbose=False)
    ids, mask = padded_batch()
    recorder = _RecordAtSave(model, ids, mask)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, report_to=[],
                             save_strategy="steps", save_steps=1, save_only_model=True, use_cpu=True,
                             disable_tqdm=True, learning_rate=1e-2)
    trainer = Trainer(model=model, args=args, train_dataset=_train_data(), compute_loss_func=bcos_loss,
                      callbacks=[BWarmupCallback(model, start=1.0, fraction=1.0), recorder])
    trainer.train()
    assert recorder.b[1] < recorder.b[2] < 2.0  # checkpoints 1 and 2 were written mid warm-up
    for step in (1, 2):
        loaded = load_bcos_model(tmp_path / f"checkpoint-{step}")
        assert loaded.classifier.b == recorder.b[step]
        assert {m.b for m in _layers(loaded).values()} == {recorder.b[step]}
        assert torch.equal(_logits(loaded, ids, mask), recorder.logits[step])
        assert loaded.config.bcos["b"] == 2.0  # the target stays recorded


class _Interrupt(Exception):
    pass


class _StopAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise _Interrupt


def test_model_saved_after_an_interrupted_warmup_reloads_at_the_running_b(tmp_path):
    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=6,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_train_data(), compute_loss_func=bcos_loss,
                      callbacks=[BWarmupCallback(model, fraction=1.0), _StopAt()])
    with pytest.raises(_Interrupt):
        trainer.train()
    running = model.classifier.b
    assert 1.0 < running < 1.5
    ids, mask = padded_batch()
    expected = _logits(model, ids, mask)
    model.save_pretrained(tmp_path / "saved")
    loaded = load_bcos_model(tmp_path / "saved")
    assert loaded.classifier.b == running
    assert torch.equal(_logits(loaded, ids, mask), expected)


def _saved(tmp_path, name="BertForSequenceClassification", b=1.25):
    model = bcosify(tiny_model(name), b=b, verbose=False)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    return model, folder


def _edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("version", [99, 0, "2", True, None, 2.5])
def test_tampered_format_version_is_refused_not_rewritten(tmp_path, version):
    _, folder = _saved(tmp_path)
    _edit_config(folder, lambda c: c["bcos"].__setitem__("format_version", version))
    before = (folder / "config.json").read_text()
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['format_version'\]: .* reads formats 1, 2, 3\. "
                                             r"Upgrade bcos-plugins"):
        load_bcos_model(folder)
    assert (folder / "config.json").read_text() == before


def test_format_1_folder_loads_at_the_configured_b(tmp_path):
    model, folder = _saved(tmp_path, b=1.5)
    state = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.endswith(".bcos_b")}, folder / "model.safetensors",
              metadata={"format": "pt"})
    _edit_config(folder, lambda c: c["bcos"].__setitem__("format_version", 1))
    loaded = load_bcos_model(folder)
    assert {m.b for m in _layers(loaded).values()} == {1.5}
    ids, mask = padded_batch()
    assert torch.equal(_logits(loaded, ids, mask), _logits(model, ids, mask))


def test_format_2_folder_without_stored_b_is_refused(tmp_path):
    _, folder = _saved(tmp_path)
    state = load_file(folder / "model.safetensors")
    del state["classifier.bcos_b"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"B-cos layers without a stored B \['classifier'\]"):
        load_bcos_model(folder)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e6, 0.5])
def test_tampered_b_is_refused(tmp_path, bad):
    _, folder = _saved(tmp_path)
    state = load_file(folder / "model.safetensors")
    state["classifier.bcos_b"] = torch.tensor(bad, dtype=torch.float64)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"^classifier\.bcos_b in .*must be a finite number in \[1, 10\]"):
        load_bcos_model(folder)
    _edit_config(folder, lambda c: c["bcos"].__setitem__("b", "abc"))
    with pytest.raises(BcosTypeError, match=r"^config\.bcos\['b'\]: must be a real number, got str 'abc'"):
        load_bcos_model(folder)


def test_load_errors_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(BcosFileError, match=r"^path: the folder .*does-not-exist does not exist\. Pass the folder "
                                            r"written by model\.save_pretrained"):
        load_bcos_model(tmp_path / "does-not-exist")
    with pytest.raises(BcosFileError, match="path: the folder /no/such/folder does not exist"):
        load_bcos_model("/no/such/folder")
    with pytest.raises(BcosTypeError, match="^path: must be a folder path"):
        load_bcos_model(3)
    _, folder = _saved(tmp_path)
    with pytest.raises(BcosFileError, match=r"is a file, not a folder"):
        load_bcos_model(folder / "config.json")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(BcosFileError, match=r"has no config\.json"):
        load_bcos_model(empty_dir)

    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(BcosFileError, match=rf"^path: the weight file {weights} is damaged or truncated"):
        load_bcos_model(folder)
    weights.write_bytes(b"")
    with pytest.raises(BcosFileError, match=rf"^path: the weight file {weights} is empty \(0 bytes\)"):
        load_bcos_model(folder)
    weights.unlink()
    with pytest.raises(BcosFileError, match=r"has no model\.safetensors \(load_bcos_model reads safetensors only"):
        load_bcos_model(folder)


def test_wrong_shapes_and_tampered_num_labels_quote_transformers_report(tmp_path):
    _, folder = _saved(tmp_path)
    shaped = tmp_path / "shaped"
    shutil.copytree(folder, shaped)
    state = load_file(shaped / "model.safetensors")
    state["classifier.weight"] = torch.zeros(4, state["classifier.weight"].shape[1])
    save_file(state, shaped / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"^path: the weights in .* do not fit its config\.json; transformers "
                                             r"reports: classifier\.weight MISMATCH .*\[4, 32\].*\[3, 32\]"):
        load_bcos_model(shaped)
    _edit_config(folder, lambda c: (c.__setitem__("id2label", {str(i): str(i) for i in range(5)}),
                                    c.pop("label2id", None)))
    with pytest.raises(BcosValueError, match=r"classifier\.weight MISMATCH .*\[3, 32\].*\[5, 32\].*num_labels"):
        load_bcos_model(folder)


def test_cross_attention_is_refused():
    config = tiny_config("bert")
    config.is_decoder, config.add_cross_attention = True, True
    with pytest.raises(UnsupportedModuleError, match=r"^model: BertModel has cross-attention .*add_cross_attention"
                                                     r"=False"):
        bcosify(T.BertModel(config), verbose=False)


def test_decoder_bert_without_cross_attention_stays_complete():
    config = tiny_config("bert")
    config.is_decoder = True
    model = bcosify(T.BertModel(config), b=1.5, verbose=False)
    ids, mask = padded_batch()
    e = explain(model, ids, mask, target=3, position=-1)
    assert e.completeness_error.max() < 1e-4


def test_classes_are_checked_by_identity_not_by_name():
    class BertForSequenceClassification(T.BertForSequenceClassification):  # a namesake subclass
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * out.logits.sigmoid()
            return out

    with pytest.raises(UnsupportedModuleError, match=r"is not transformers' BertForSequenceClassification \(a "
                                                     r"subclass or a class of the same name\)"):
        bcosify(BertForSequenceClassification(tiny_config("bert")), verbose=False)

    class MyBert(T.BertModel):
        pass

    with pytest.raises(UnsupportedModuleError, match=r"MyBert is not supported by bcosify\. Pass one of"):
        bcosify(MyBert(tiny_config("bert")), verbose=False)


def test_the_bare_transformer_of_a_converted_lm_is_refused_naming_the_whole_lm():
    lm = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    ids, mask = padded_batch()
    with pytest.raises(UnsupportedModuleError, match=r"model: a bare GPT2Model \(the \.transformer of a "
                                                     r"GPT2LMHeadModel.*Pass the GPT2LMHeadModel itself: "
                                                     r"explain\(lm, \.\.\.\), not explain\(lm\.transformer"):
        explain(lm.transformer, ids, mask, target=0)


def test_stale_config_bcos_does_not_decide_the_class():
    config = tiny_config("bert")
    # e.g. a B-cos checkpoint's config loaded with plain transformers
    config.bcos = {"b": 1.5, "architecture": "BertModel", "format_version": 2}
    with pytest.raises(UnsupportedModuleError, match="is not transformers' BertModel"):
        bcosify(type("BertModel", (T.BertModel,), {})(config), verbose=False)


def test_bcosify_leaves_a_config_shared_with_another_model_unchanged():
    config = tiny_config("bert")
    stock = T.BertForSequenceClassification(config)
    converted = bcosify(T.BertForSequenceClassification(config), b=1.25, verbose=False)
    assert not hasattr(stock.config, "bcos") and not hasattr(config, "bcos")
    assert converted.config.bcos["b"] == 1.25 and converted.bert.config is converted.config
    ids, mask = padded_batch()
    assert explain(stock, ids, mask).completeness_error.max() > 1e-2  # explained as the stock model it is
    assert explain(converted, ids, mask).completeness_error.max() < 1e-4


def test_bcos_loss_refuses_empty_batches_and_bad_labels():
    with pytest.raises(BcosValueError, match=r"^outputs: the batch is empty \(0 rows\)"):
        bcos_loss(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(BcosValueError, match=r"^labels: ids must lie in \[0, 3\), got \[5, -1\] at rows \[0, 2\]\. "
                                             r"Pass ids in \[0, 3\) \(there are 3 classes\)"):
        bcos_loss(torch.zeros(3, 3), torch.tensor([5, 0, -1]))
    # a float is a type error, as everywhere ids are read (it was a ValueError here only)
    with pytest.raises(BcosTypeError, match=r"^labels: got a float \(torch\.float32\); ids must be integers \(floats "
                                            r"are refused, not truncated\)"):
        bcos_loss(torch.zeros(2, 3), torch.tensor([0.7, 1.9]))
    with pytest.raises(BcosValueError, match=r"^num_items_in_batch: must be a count >= 1, got 0"):
        bcos_loss(torch.zeros(2, 3), torch.tensor([0, 1]), num_items_in_batch=0)
    with pytest.raises(BcosTypeError, match=r"^labels: must be a tensor"):
        bcos_loss(torch.zeros(2, 3), [0, 1])


@pytest.mark.parametrize("labels", [[0.7, 1.9], [0, 1.0], [True, False]])
def test_fine_tuning_refuses_float_labels_instead_of_truncating(labels):
    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    # one per-row id parser reads labels everywhere: a float or a boolean is a type error naming the dtype
    refused = (r"^labels: got a boolean; ids must be integers\." if labels == [True, False] else
               r"^labels: got a float \(torch\.float32\); ids must be integers \(floats are refused, not truncated\)\.")
    with pytest.raises(BcosTypeError, match=refused + r" Pass one integer id per row"):
        fine_tune_classifier(model, None, ["a", "b"], labels)
    with pytest.raises(BcosTypeError, match=refused):
        accuracy(model, None, ["a", "b"], labels)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"labels": [0, 3]}, r"^labels: ids must lie in \[0, 3\), got \[3\] at row \[1\]\. .*classes of the model "
                         r"\(num_labels\)"),
    ({"labels": [0]}, r"^labels: 2 texts but 1 labels"),
    ({"texts": []}, r"^texts: is empty"),
    ({"texts": "ab"}, r"^texts: must be a list of strings"),
    ({"texts": ["a", 3]}, r"^texts: texts\[1\] is int 3, not a string"),
    ({"epochs": 0}, r"^epochs: must be finite and > 0, got 0\.0"),
    ({"epochs": float("nan")}, r"^epochs: must be finite"),
    ({"batch_size": 0}, r"^batch_size: must be >= 1"),
    ({"batch_size": 2.5}, r"^batch_size: must be an integer"),
    ({"learning_rate": -1e-3}, r"^learning_rate: must be finite and > 0"),
    ({"head_learning_rate": float("inf")}, r"^head_learning_rate: must be finite"),
    ({"b_warmup": 1.5}, r"^b_warmup: must be finite and \(0, 1\]"),
    ({"loss": "mse"}, r"^loss: must be 'auto', 'bce' or 'ce'"),
    ({"max_length": 1}, r"^max_length: must be >= 2"),
    ({"tokenizer": None}, r"^tokenizer: must be a transformers tokenizer"),
])
def test_fine_tuning_arguments_are_validated(kwargs, pattern):
    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    call = {"model": model, "tokenizer": lambda *a, **k: None, "texts": ["a", "b"], "labels": [0, 1]}
    call.update(kwargs)
    with pytest.raises((BcosValueError, BcosTypeError), match=pattern):
        fine_tune_classifier(**call)


def test_b_warmup_validates_its_arguments():
    model = bcosify(tiny_model("BertModel"), b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match=r"^start: must be a finite number in \[1, 10\], got 0\.5"):
        BWarmupCallback(model, start=0.5)
    with pytest.raises(BcosTypeError, match=r"^start: must be a real number, got str"):
        BWarmupCallback(model, start="abc")
    with pytest.raises(BcosValueError, match=r"^fraction: must be finite and \(0, 1\], got nan"):
        BWarmupCallback(model, fraction=float("nan"))
    model.config.bcos["b"] = float("inf")
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['b'\]: must be a finite number"):
        BWarmupCallback(model)


def test_a_tampered_b_in_a_state_dict_is_refused_at_the_next_forward():
    layer = BcosLinear(4, 2, b=1.5)
    state = layer.state_dict()
    state["bcos_b"] = torch.tensor(float("inf"), dtype=torch.float64)
    layer.load_state_dict(state)
    with pytest.raises(BcosValueError, match=r"^BcosLinear\.bcos_b: the stored alignment pressure is inf, outside "
                                             r"\[1, 10\]\. .*initial_b"):
        layer(torch.randn(1, 4))
    assert layer.initial_b == 1.5


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_classifier_without_labels_is_refused_by_bcosify(family):
    name = {"bert": "BertForSequenceClassification", "gpt2": "GPT2ForSequenceClassification"}[family]
    model = getattr(T, name)(tiny_config(family, num_labels=0))
    with pytest.raises(BcosValueError, match=r"^model: config\.num_labels is 0, so the classifier has no output"):
        bcosify(model, verbose=False)


def test_sharded_checkpoints_load_with_per_layer_b_and_a_missing_shard_is_named(tmp_path):
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    model.classifier.b = 1.3
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    loaded = load_bcos_model(tmp_path)
    ids, mask = padded_batch()
    assert loaded.classifier.b == 1.3
    assert torch.equal(_logits(loaded, ids, mask), _logits(model, ids, mask))
    shards[1].unlink()
    with pytest.raises(BcosFileError, match=rf"^path: the weight file {shards[1]} listed in the index is missing"):
        load_bcos_model(tmp_path)


def test_vit_checkpoint_without_stored_b_loads_at_the_config_b(tmp_path):
    """A BcosViT saved before B was stored per layer reloads at config.b (not at uninitialised memory)."""
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    config = BcosViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=16, num_labels=3, b=1.5)
    torch.manual_seed(0)
    model = BcosViT(config).eval()
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.endswith("bcos_b")}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    reloaded = BcosViT.from_pretrained(tmp_path).eval()
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(images).logits, model(images).logits)
