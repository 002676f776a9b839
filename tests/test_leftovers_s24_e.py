"""Leftovers of trust pass 23 over conversion and persistence (helper-156's notes), session 24.

Silently wrong before:

- ``inseq.load_model(folder, "bcos", model_kwargs={"subfolder": "checkpoint-500"})`` took the weights from the
  subfolder and converted the B-cos layers again from ``folder`` (``config._name_or_path``): each layer ran at the
  final save's B (a tiny GPT-2's logits 0.033 off). The subfolder is read as ``load_bcos_model`` reads it.
- A ``config.bcos`` key misspelt by hand (``norm_epss``) was accepted, so its record was not applied; unknown keys are
  refused, naming them and the known ones.

Unhelpful before: a ``norm_eps`` record edited into strings was refused as "saved as 1e-12, rebuilt as 1e-12";
``require_bool`` said "got bool np.True_" of a NumPy bool.
"""

from __future__ import annotations

import json
import warnings

import inseq
import numpy as np
import pytest
import torch
import transformers as T
from test_conformance import _stock
from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins._checks import require_bool
from bcos_plugins.convert.checkpoint_format import RECORD_KEYS
from bcos_plugins.errors import BcosKeywordError, BcosTypeError, BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bs(model) -> set[float]:
    return {m.b for m in model.modules() if isinstance(m, AlignmentPressure)}


def _edit_config(folder, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config["bcos"])
    (folder / "config.json").write_text(json.dumps(config))


# ------------------------------------------------------------------ inseq.load_model(folder, "bcos", subfolder)


def test_inseq_loads_a_subfolder_with_its_own_stored_b_and_the_tokenizer_from_the_folder(tmp_path):
    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    checkpoint = _tiny_lm("gpt2", len(tokenizer), seed=1)
    for module in checkpoint.modules():
        if isinstance(module, AlignmentPressure):
            module.b = 1.05  # mid-way through a B warm-up
    checkpoint.save_pretrained(tmp_path / "checkpoint-500")
    _tiny_lm("gpt2", len(tokenizer), seed=2).save_pretrained(tmp_path)  # the final save, at B = 1.1
    tokenizer.save_pretrained(tmp_path)  # only the top folder holds a tokenizer, as inseq reads it from there
    kwargs = {"subfolder": "checkpoint-500"}
    with pytest.warns(UserWarning, match=r"8 of the 8 B-cos layers in .*checkpoint-500 run at the B stored with them "
                                         r"\(1\.05\), not at config\.bcos\['b'\] = 1\.1"):
        loaded = inseq.load_model(str(tmp_path), "bcos", model_kwargs=kwargs)
    assert kwargs == {"subfolder": "checkpoint-500"}  # the caller's dict is left as given
    # the weights came from the subfolder, each layer's B from the folder: B 1.1, logits 0.033 off, silently
    assert _bs(loaded.model) == {1.05}
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, checkpoint(ids).logits, rtol=1e-5, atol=1e-6)
    assert loaded.tokenizer.vocab_size == tokenizer.vocab_size
    with pytest.raises(BcosTypeError, match=r"^subfolder: must be a folder name \(str\), got int"):
        inseq.load_model(str(tmp_path), "bcos", model_kwargs={"subfolder": 500})
    with pytest.raises(BcosKeywordError, match=r"^subfolder: is given with 'user/model', which is no local folder: "
                                               r"inseq.load_model\(\.\.\., \"bcos\"\) reads"):
        inseq.load_model("user/model", "bcos", model_kwargs={"subfolder": "checkpoint-500"})


# ------------------------------------------------------------------ config.bcos: unknown keys, mistyped entries


def test_a_misspelt_record_key_is_refused_naming_it_the_closest_and_the_known_keys(tmp_path):
    bcosify(_stock("BertForSequenceClassification"), b=1.5, verbose=False).save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda record: record.update(norm_epss=record.pop("norm_eps")))
    with pytest.raises(BcosValueError, match=r"^config\.bcos: .*config\.json holds the key\(s\) 'norm_epss', which no "
                                             r"version of bcos-plugins writes \(it writes 'b', 'architecture', "
                                             r"'format_version', 'query_key', 'gate_branch_activations', 'activations', "
                                             r"'norm_eps'\).*\(did you mean 'norm_eps'\?\)"):
        load_bcos_model(tmp_path)


@pytest.mark.parametrize(("name", "query_key"), [("GPT2LMHeadModel", False), ("LlamaForCausalLM", True),
                                                 ("BertForSequenceClassification", True)])
def test_every_key_bcosify_writes_is_a_known_one_and_loads(tmp_path, name, query_key):
    model = bcosify(_stock(name), b=1.5, bcos_query_key=query_key, verbose=False)
    assert set(model.config.bcos) <= set(RECORD_KEYS)
    model.save_pretrained(tmp_path)
    ids = torch.randint(3, 50, (2, 6))
    with torch.no_grad():
        assert torch.equal(load_bcos_model(tmp_path)(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_a_format_1_record_still_loads(tmp_path):
    """The record 0.1 wrote (b, architecture, format_version 1; weights without bcos_b) is no unknown key."""
    model = bcosify(_stock("BertModel"), b=1.5, verbose=False)
    model.save_pretrained(tmp_path)

    def as_format_1(record):
        for key in set(record) - {"b", "architecture"}:
            del record[key]
        record["format_version"] = 1

    _edit_config(tmp_path, as_format_1)
    from safetensors.torch import load_file, save_file
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.endswith(".bcos_b")}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    assert _bs(load_bcos_model(tmp_path)) == {1.5}


def test_a_norm_eps_record_of_text_is_refused_naming_the_key_the_type_and_the_fix(tmp_path):
    bcosify(_stock("BertForSequenceClassification"), b=1.5, verbose=False).save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda record: record["norm_eps"].update(
        {path: str(eps) for path, eps in record["norm_eps"].items()}))
    # was: "'bert.embeddings.LayerNorm' saved as 1e-12, rebuilt as 1e-12"
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['norm_eps'\]\['bert\.[\w.]+LayerNorm'\]: .* holds str "
                                             r"'1e-12', where bcosify writes a int or float\. config\.json was edited: "
                                             r"write it as a JSON number, 1e-12, not the text \"1e-12\""):
        load_bcos_model(tmp_path)
    _edit_config(tmp_path, lambda record: record.update(norm_eps=1e-12))
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['norm_eps'\]: .* holds a float \(1e-12\), where bcosify "
                                             r"writes \{module path: int or float\}"):
        load_bcos_model(tmp_path)


def test_an_activation_record_of_another_type_is_refused_naming_it(tmp_path):
    bcosify(_stock("BertForSequenceClassification"), b=1.5, verbose=False).save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda record: record["activations"].update(dict.fromkeys(record["activations"], None)))
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['activations'\]\['[\w.]+'\]: .* holds NoneType None, "
                                             r"where bcosify writes a str\. config\.json was edited: write it as a "
                                             r"JSON string"):
        load_bcos_model(tmp_path)


# ------------------------------------------------------------------ require_bool of a NumPy bool


def test_require_bool_names_a_numpy_bool_as_such():
    # was: "got bool np.True_", a bool refused for not being a bool
    with pytest.raises(BcosTypeError, match=r"^flag: must be True or False, got numpy\.bool np\.True_ \(pass "
                                            r"bool\(flag\)\)\. Pass flag=True or flag=False"):
        require_bool("flag", np.True_)
    with pytest.raises(BcosTypeError, match=r"^flag: must be True or False, got str 'no'\. Pass"):
        require_bool("flag", "no")
    assert require_bool("flag", False) is False


# ------------------------------------------------------------------ bcosify builds each layer holding its parameter


def test_bcosify_copies_no_weight_each_layer_is_built_holding_its_parameter():
    """bcosify copied every converted weight into a new tensor and then put the original parameter back in its
    place (33f29df): the copies were allocated, filled and freed for nothing (0.29-0.37 of the conversion's time
    without them; docs/benchmarks.md, 2026-11-29 05:30 UTC)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.copy_.default:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    for name in ("BertForSequenceClassification", "LlamaForCausalLM", "GPT2LMHeadModel"):
        model = _stock(name)
        sources = {n: p for n, p in model.named_parameters()}
        weight_shapes = {tuple(p.shape) for p in sources.values() if p.ndim == 2}
        with Copies() as copies:
            bcosify(model, b=1.5, verbose=False)
        assert not [s for s in copies.shapes if s in weight_shapes], (name, copies.shapes)
        for param_name, param in model.named_parameters():
            assert param is sources[param_name], (name, param_name)  # the very parameters, as 33f29df made them


def test_from_linear_and_the_norms_hold_the_parameter_when_asked_and_copy_otherwise():
    from bcos_plugins.nn import BcosLayerNorm, BcosLinear
    from bcos_plugins.nn.norm import DetachableRMSNorm

    linear = torch.nn.Linear(6, 4, dtype=torch.float64)
    held, copied = BcosLinear.from_linear(linear, b=1.25, hold=True), BcosLinear.from_linear(linear, b=1.25)
    assert held.weight is linear.weight and copied.weight is not linear.weight
    assert torch.equal(held.weight, copied.weight) and held.bcos_b.item() == 1.25 == held.b
    assert held.bcos_b.device == linear.weight.device and held.bcos_b.dtype == torch.float64
    x = torch.randn(3, 6, dtype=torch.float64)
    assert torch.equal(held(x), copied(x))
    with pytest.raises(BcosValueError, match=r"^hold: needs a weight parameter of the layer's shape \(8, 6\) "
                                             r"\(max_out 1\), got a Parameter of shape \(4, 6\)\. Pass hold=False"):
        BcosLinear.from_linear(linear, b=1.25, max_out=2, hold=True)
    norm = torch.nn.LayerNorm(6)
    assert BcosLayerNorm.from_layer_norm(norm, hold=True).weight is norm.weight
    assert BcosLayerNorm.from_layer_norm(norm).weight is not norm.weight
    rms = T.models.llama.modeling_llama.LlamaRMSNorm(6)
    assert DetachableRMSNorm.from_rms_norm(rms, hold=True).weight is rms.weight
    assert DetachableRMSNorm.from_rms_norm(rms).weight is not rms.weight
