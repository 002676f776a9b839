"""load_bcos_model gives back the saved model exactly, or a clear error naming what is wrong and the fix: edited
config.json records, missing weights, keywords that would change the head, BcosViT folders, and folders where
an earlier save left files behind (a sharded save's index, or a single file under a later sharded save)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_model
from safetensors.torch import load_file, save_file

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins.errors import BcosFileError, BcosKeywordError, BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLinear


def _logits(model, ids, mask):
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask).logits


def _saved(tmp_path, b=1.5, **save_kwargs):
    model = bcosify(tiny_model("BertForSequenceClassification"), b=b, verbose=False)
    folder = tmp_path / "model"
    model.save_pretrained(folder, **save_kwargs)
    return model, folder


def _edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_format_version_edited_to_1_is_refused_instead_of_ignoring_the_stored_per_layer_b(tmp_path):
    # a save made mid-way through a B warm-up: the layers run at 1.2, config.bcos["b"] (the target) is 1.5;
    # read as format 1 every layer would run at 1.5 and the logits would move without a word
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    for layer in model.modules():
        if isinstance(layer, BcosLinear):
            layer.b = 1.2
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    _edit_config(folder, lambda c: c["bcos"].__setitem__("format_version", 1))
    before = (folder / "config.json").read_text()
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['format_version'\]: .* says 1 .* its weights store a B "
                                             r"per layer \(\d+ bcos_b entries.*config\.json was edited: restore it"):
        load_bcos_model(folder)
    assert (folder / "config.json").read_text() == before
    _edit_config(folder, lambda c: c["bcos"].__setitem__("format_version", 2))  # restored: exact again
    ids, mask = padded_batch()
    torch.testing.assert_close(_logits(load_bcos_model(folder), ids, mask), _logits(model, ids, mask),
                               rtol=0, atol=0)


@pytest.mark.parametrize("name", ["num_labels", "id2label", "label2id"])
def test_a_keyword_that_would_change_the_saved_head_is_refused_by_name(tmp_path, name):
    _, folder = _saved(tmp_path)
    value = {"num_labels": 5, "id2label": {i: str(i) for i in range(5)}, "label2id": {str(i): i for i in range(5)}}
    with pytest.raises(BcosValueError, match=rf"^{name}: .* was saved with 3 labels .*leave it out"):
        load_bcos_model(folder, **{name: value[name]})


@pytest.mark.parametrize("name", ["config", "bcos"])
def test_a_keyword_that_would_replace_the_saved_configuration_is_refused_by_name(tmp_path, name):
    _, folder = _saved(tmp_path)
    value = {"config": T.BertConfig(), "bcos": {"b": 2.0, "architecture": "BertModel", "format_version": 2}}
    with pytest.raises(BcosValueError, match=rf"^{name}: load_bcos_model reads the configuration saved in the "
                                             rf"folder .*leave {name} out"):
        load_bcos_model(folder, **{name: value[name]})


@pytest.mark.parametrize(("name", "value", "what_it_does", "fix"), [
    ("use_safetensors", False, r"passes use_safetensors=True itself: it reads safetensors only, after checking "
                               r"that each weight file is there and complete",
     r"Leave use_safetensors out; a checkpoint saved as pytorch_model\.bin loads with"),
    ("output_loading_info", True, r"reads the loading info itself, refuses a load with a missing, unexpected or "
                                  r"mismatched weight .* and returns the model alone",
     r"Leave output_loading_info out: a model it returns has every saved weight loaded"),
    ("pretrained_model_name_or_path", "elsewhere", r"passes its path argument to from_pretrained as "
                                                   r"pretrained_model_name_or_path",
     r"Pass the folder \(or hub id\) as path, the first argument"),
])
def test_a_from_pretrained_argument_that_load_bcos_model_sets_itself_is_refused_saying_what_it_does(
        tmp_path, name, value, what_it_does, fix):
    # before: Python's bare TypeError "got multiple values for keyword argument 'use_safetensors'" (and for a
    # BcosViT folder, output_loading_info=True made from_pretrained return a tuple: AttributeError on .eval())
    _, folder = _saved(tmp_path)
    _, vit_folder = _vit(tmp_path)
    for saved in (folder, vit_folder):
        with pytest.raises(BcosTypeError, match=rf"^{name}: load_bcos_model {what_it_does}\. {fix}"):
            load_bcos_model(saved, **{name: value})


def test_a_misspelt_keyword_is_not_pointed_to_one_that_load_bcos_model_refuses(tmp_path):
    _, folder = _saved(tmp_path)
    for typo, refused in (("use_safetensor", "use_safetensors"), ("output_loading_inf", "output_loading_info"),
                          ("confi", "config")):
        with pytest.raises(BcosTypeError, match=rf"^{typo}: is neither an attribute") as refusal:
            load_bcos_model(folder, **{typo: True})
        assert f"Pass {refused}=" not in str(refusal.value)


def test_every_keyword_refusal_of_load_bcos_model_is_one_class_both_a_type_and_a_value_error(tmp_path):
    # before: config= / bcos= / num_labels= raised BcosValueError and the keywords it sets itself or a typo
    # BcosTypeError, so one except clause could not catch "a keyword load_bcos_model does not take"
    _, folder = _saved(tmp_path)
    _, vit_folder = _vit(tmp_path)
    refused = {"config": T.BertConfig(), "bcos": {"b": 2.0}, "num_labels": 5, "id2label": {0: "a"},
               "label2id": {"a": 0}, "use_safetensors": False, "output_loading_info": True,
               "pretrained_model_name_or_path": "elsewhere", "output_attention": True}
    for saved in (folder, vit_folder):
        for name, value in refused.items():
            with pytest.raises(BcosKeywordError, match=rf"^{name}: ") as refusal:
                load_bcos_model(saved, **{name: value})
            # Python's class for a keyword a call does not take, and the class 0.2.0 raised for the head and
            # configuration keywords: except TypeError and except ValueError both keep working
            assert isinstance(refusal.value, BcosTypeError) and isinstance(refusal.value, BcosValueError)


def test_configuration_keywords_apply_like_from_pretrained_and_loading_options_pass_through(tmp_path):
    model, folder = _saved(tmp_path)
    loaded = load_bcos_model(folder, output_attentions=True, dtype=torch.float64)
    assert loaded.config.output_attentions and next(loaded.parameters()).dtype == torch.float64
    ids, mask = padded_batch()
    out = loaded(input_ids=ids, attention_mask=mask)
    assert out.attentions is not None and len(out.attentions) == model.config.num_hidden_layers
    torch.testing.assert_close(out.logits.float(), _logits(model, ids, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("edit", "pattern"), [
    # another family's class: transformers would be handed a BertConfig for GPT-2
    (lambda c: c["bcos"].__setitem__("architecture", "GPT2LMHeadModel"),
     r"names 'GPT2LMHeadModel', but the file describes architectures \['BertForSequenceClassification'\] and "
     r"model_type 'bert' \(GPT2LMHeadModel reads GPT2Config\)"),
    # the same family, another head: would load the encoder and drop the trained classifier
    (lambda c: c["bcos"].__setitem__("architecture", "BertModel"),
     r"names 'BertModel', but the file describes architectures \['BertForSequenceClassification'\]"),
    (lambda c: c.__setitem__("architectures", ["BertForMaskedLM"]),
     r"names 'BertForSequenceClassification', but the file describes architectures \['BertForMaskedLM'\]"),
])
def test_a_tampered_architecture_is_refused_naming_the_field(tmp_path, edit, pattern):
    _, folder = _saved(tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['architecture'\]: .*" + pattern
                       + r".*config\.json was edited: restore it from the original save"):
        load_bcos_model(folder)


def test_a_save_over_an_earlier_sharded_save_loads_what_transformers_loads(tmp_path):
    old, folder = _saved(tmp_path, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists()
    new = bcosify(tiny_model("BertForSequenceClassification", seed=1), b=1.5, verbose=False)
    new.save_pretrained(folder)  # one file now; transformers leaves the old index (its shards are gone)
    assert (folder / "model.safetensors").exists() and (folder / "model.safetensors.index.json").exists()
    stock = T.BertForSequenceClassification.from_pretrained(folder)
    torch.testing.assert_close(stock.bert.embeddings.word_embeddings.weight,
                               new.bert.embeddings.word_embeddings.weight, rtol=0, atol=0)
    ids, mask = padded_batch()
    loaded = load_bcos_model(folder)
    torch.testing.assert_close(_logits(loaded, ids, mask), _logits(new, ids, mask), rtol=0, atol=0)
    assert not torch.equal(_logits(old, ids, mask), _logits(new, ids, mask))


def test_a_sharded_save_over_an_earlier_single_file_save_is_refused_not_loaded_stale(tmp_path):
    old, folder = _saved(tmp_path)
    new = bcosify(tiny_model("BertForSequenceClassification", seed=1), b=1.5, verbose=False)
    new.save_pretrained(folder, max_shard_size="20KB")  # transformers leaves the old model.safetensors
    assert (folder / "model.safetensors").exists() and (folder / "model.safetensors.index.json").exists()
    stock = T.BertForSequenceClassification.from_pretrained(folder)  # transformers loads the stale file
    torch.testing.assert_close(stock.bert.embeddings.word_embeddings.weight,
                               old.bert.embeddings.word_embeddings.weight, rtol=0, atol=0)
    with pytest.raises(BcosFileError, match=r"^path: .* holds two checkpoints, model\.safetensors and a sharded one "
                                            r"\(model\.safetensors\.index\.json with \d+ shards\).*Delete the files"):
        load_bcos_model(folder)
    (folder / "model.safetensors").unlink()  # the stale file removed: the sharded save loads exactly
    ids, mask = padded_batch()
    torch.testing.assert_close(_logits(load_bcos_model(folder), ids, mask), _logits(new, ids, mask), rtol=0, atol=0)


@pytest.mark.parametrize(("typo", "meant"), [("output_attention", "output_attentions"), ("dtyp", "dtype"),
                                             ("device_mapp", "device_map")])
def test_a_misspelt_keyword_is_refused_naming_the_closest_valid_one(tmp_path, typo, meant):
    # before: transformers handed it to the model's constructor: TypeError "__init__() got an unexpected keyword"
    _, folder = _saved(tmp_path)
    with pytest.raises(BcosTypeError, match=rf"^{typo}: is neither an attribute of the saved BertConfig nor an option "
                                            rf"of BertForSequenceClassification.from_pretrained.* Pass {meant}= if "
                                            "that is what you meant"):
        load_bcos_model(folder, **{typo: True})
    with pytest.raises(BcosTypeError, match=r"^zzz: .*Pass attributes of the saved configuration \(e.g. "
                                            r"output_attentions=True\) or from_pretrained options"):
        load_bcos_model(folder, zzz=1)


def _vit(tmp_path):
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    config = BcosViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=16, num_labels=3, b=1.5)
    torch.manual_seed(0)
    model = BcosViT(config).eval()
    folder = tmp_path / "vit"
    model.save_pretrained(folder)
    return model, folder


def test_a_bcos_vit_folder_loads_as_a_bcos_vit(tmp_path):
    model, folder = _vit(tmp_path)
    loaded = load_bcos_model(folder)
    assert type(loaded) is type(model) and not loaded.training
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images).logits, model(images).logits, rtol=0, atol=0)
    with pytest.raises(BcosValueError, match=r"^num_labels: .* was saved with 3 labels"):
        load_bcos_model(folder, num_labels=5)
    with pytest.raises(BcosTypeError, match=r"^output_attention: .*saved BcosViTConfig nor an option of "
                                            r"BcosViT.from_pretrained.* Pass output_attentions= if"):
        load_bcos_model(folder, output_attention=True)


def test_a_bcos_vit_folder_missing_its_classifier_is_refused_naming_the_weight(tmp_path):
    _, folder = _vit(tmp_path)
    weights = load_file(folder / "model.safetensors")
    assert "classifier.weight" in weights
    save_file({k: v for k, v in weights.items() if k != "classifier.weight"}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"^path: .* does not hold a whole BcosViT: missing "
                                             r"\['classifier\.weight'\].*would be random.*Restore the folder"):
        load_bcos_model(folder)


def test_bcos_vit_from_pretrained_refuses_a_folder_missing_its_classifier(tmp_path):
    """Called directly (not through load_bcos_model), from_pretrained used to fill the missing classifier with
    random weights and only list it in transformers' load report."""
    from bcos_plugins.vision import BcosViT

    model, folder = _vit(tmp_path)
    loaded, info = BcosViT.from_pretrained(folder, output_loading_info=True)  # a whole folder: as transformers
    assert not info["missing_keys"] and torch.equal(loaded.classifier.weight, model.classifier.weight)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "classifier.weight"}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"^path: .* does not hold a whole BcosViT: missing "
                                             r"\['classifier\.weight'\].*would be random.*Restore the folder"):
        BcosViT.from_pretrained(folder)


def test_conventional_vit_from_pretrained_refuses_a_folder_missing_its_head(tmp_path):
    """The baseline ViT of the vision example reloads with from_pretrained: a missing head is refused too."""
    from bcos_plugins.vision import BcosViTConfig, ConventionalViT

    config = BcosViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=16, num_labels=3)
    torch.manual_seed(0)
    model = ConventionalViT(config).eval()
    model.save_pretrained(tmp_path)
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ConventionalViT.from_pretrained(tmp_path).eval()(images).logits,
                                   model(images).logits, rtol=0, atol=0)
    weights = load_file(tmp_path / "model.safetensors")
    head = [k for k in weights if k.startswith("classifier.") or k.startswith("head.")]
    assert head, sorted(weights)
    save_file({k: v for k, v in weights.items() if k not in head}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(BcosValueError, match=r"^path: .* does not hold a whole ConventionalViT: missing \["):
        ConventionalViT.from_pretrained(tmp_path)
