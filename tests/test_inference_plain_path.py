"""The plain branch of ``nn.functional.inference_linear``: a float32 or float64 B-cos linear layer without autocast,
the weight cache or the reference path runs the general inference branch's kernels written out inline (a speed
change: the helpers' Python calls cost about 3 % of a ModernBERT forward). These tests hold it to the general branch:
the same values bit for bit and the same ops in the same order, for every B, both weight layouts, shared and
unshared input norms, ``no_grad`` and ``inference_mode``, and whole B-cos models; and they check which calls take it."""

from __future__ import annotations

import pytest
import torch
from conftest import RecordedOps, zero_unit_projection
from torch import nn

from bcos_plugins import bcosify
from bcos_plugins.nn import explanation_mode
from bcos_plugins.nn import functional as bcos_functional
from bcos_plugins.nn.dynamic import dynamic_weights_used
from bcos_plugins.nn.functional import reference_path, reuse_unit_weights

B_VALUES = [1.0, 1.1, 1.25, 1.5, 2.0, 2.5]
PLAIN = [torch.float32, torch.float64]
VIEWS = {"t", "permute", "transpose", "view", "_unsafe_view", "expand", "as_strided", "detach", "alias"}


def _general_branch(monkeypatch) -> None:
    """Every inference call takes the general branch (the code before the plain one, unchanged)."""
    monkeypatch.setattr(bcos_functional, "_PLAIN_FLOATS", ())


def _layer(kind: str, b: float, dtype: torch.dtype) -> nn.Module:
    return zero_unit_projection(kind, b, dtype).eval()


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(4, 3, 6, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 3
    x[0] = 0.0  # padding rows: the norm is the epsilon's, the output 0
    x[1, 0] = 1e-4
    return x


def _forward(layer: nn.Module, x: torch.Tensor, mode: str) -> tuple[torch.Tensor, list[str]]:
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context, RecordedOps(VIEWS) as ops:
        out = layer(x.clone())  # (a new tensor: its norm is computed, not found from an earlier call)
    return out, ops.ops


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("dtype", PLAIN)
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_plain_branch_equals_the_general_branch_bit_for_bit_with_the_same_ops(kind, b, dtype, mode, monkeypatch):
    layer = _layer(kind, b, dtype)
    x = _inputs(dtype)
    plain, plain_ops = _forward(layer, x, mode)
    _general_branch(monkeypatch)
    general, general_ops = _forward(layer, x, mode)
    assert torch.equal(plain, general)
    assert plain_ops == general_ops
    assert plain[0].abs().max() == 0.0  # (a zero input gives 0, not NaN)


@pytest.mark.parametrize("dtype", PLAIN)
def test_plain_branch_shares_one_input_norm_and_reciprocal_between_layers_as_the_general_branch(dtype, monkeypatch):
    # an attention block's query, key and value projections read one input: one norm and one reciprocal for the
    # three; an in-place write to the input between calls (its version changes) makes the next layer compute afresh
    layers = [_layer("linear", b, dtype) for b in (1.25, 1.5, 2.0)]
    x = _inputs(dtype)

    def run() -> tuple[list[torch.Tensor], list[str]]:
        y = x.clone()
        with torch.no_grad(), RecordedOps(VIEWS) as ops:
            outs = [layer(y) for layer in layers]
            y.mul_(0.5)
            outs += [layer(y) for layer in layers]
        return outs, ops.ops

    plain, plain_ops = run()
    assert plain_ops.count("linalg_vector_norm") == 6 + 2  # a weight per call, the input's norm once per version
    assert plain_ops.count("reciprocal") == 2
    _general_branch(monkeypatch)
    general, general_ops = run()
    assert all(torch.equal(p, g) for p, g in zip(plain, general, strict=True))
    assert plain_ops == general_ops


def test_which_inference_calls_take_the_plain_branch(monkeypatch):
    # the general branch normalises the weight through _unrecorded_unit_norm or cached_unit_norm, the plain one inline
    general = []
    for name in ("_unrecorded_unit_norm", "cached_unit_norm"):
        original = getattr(bcos_functional, name)
        monkeypatch.setattr(bcos_functional, name,
                            lambda *args, _original=original, **kwargs: general.append(1) or _original(*args, **kwargs))

    def takes(layer: nn.Module, x: torch.Tensor) -> bool:
        general.clear()
        layer(x)
        return not general

    with torch.no_grad():
        for dtype in PLAIN:
            assert takes(_layer("linear", 1.5, dtype), _inputs(dtype))
            assert takes(_layer("conv1d", 1.5, dtype), _inputs(dtype))
        for dtype in (torch.bfloat16, torch.float16):  # casts to float32 for the norms: the general branch
            assert not takes(_layer("linear", 1.5, dtype), _inputs(dtype))
        layer, x = _layer("linear", 1.5, torch.float32), _inputs(torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts the unit weight: the general branch
            assert not takes(layer, x)
        with reuse_unit_weights():  # the cached unit weight: the general branch
            assert not takes(layer, x)
        general.clear()
        with reference_path():  # (the layer runs the reference steps; a direct call takes the general branch)
            bcos_functional.inference_linear(x, layer.weight, 1.5)
        assert general
    with torch.no_grad(), explanation_mode(layer):  # explaining without recording: inference, counted as held constant
        used = dynamic_weights_used()
        assert takes(layer, x)
        assert dynamic_weights_used() == used + 1


@pytest.mark.parametrize("dtype", PLAIN)
def test_a_direct_call_under_the_reference_path_or_recording_gives_the_general_branchs_values(dtype, monkeypatch):
    # inference_linear is public: called with autograd on (no norm shared, nothing recorded differently) or inside
    # reference_path (the reference input norm), it gives what the general branch gives
    layer = _layer("linear", 1.25, dtype)
    x = torch.randn(64, 6, dtype=dtype, generator=torch.Generator().manual_seed(3)) * 3  # (some rows' norms differ)

    def calls() -> list[torch.Tensor]:
        with torch.no_grad(), reference_path():
            reference = bcos_functional.inference_linear(x, layer.weight, 1.25)
        recorded = bcos_functional.inference_linear(x, layer.weight.detach(), 1.25)
        again = bcos_functional.inference_linear(x, layer.weight.detach(), 1.25)
        return [reference, recorded, again]

    plain = calls()
    _general_branch(monkeypatch)
    general = calls()
    assert all(torch.equal(p, g) for p, g in zip(plain, general, strict=True))
    assert not torch.equal(plain[0], plain[1])  # (the reference norm differs in the last bits: a real check)


def _tiny(family: str) -> tuple[nn.Module, dict]:
    import transformers as T

    common = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, pad_token_id=0)
    if family == "ModernBERT":
        cls, config = T.ModernBertForSequenceClassification, T.ModernBertConfig(
            **common, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=2)
    elif family == "Qwen2":
        cls, config = T.Qwen2ForCausalLM, T.Qwen2Config(**common, num_key_value_heads=2, bos_token_id=1,
                                                           eos_token_id=2)
    else:
        cls, config = T.BertForSequenceClassification, T.BertConfig(**common, num_labels=2)
    torch.manual_seed(0)
    model = bcosify(cls(config), b=1.25, verbose=False).eval()
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return model, {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("family", ["ModernBERT", "Qwen2", "BERT"])
def test_whole_models_give_the_same_logits_on_both_branches(family, dtype, mode, monkeypatch):
    model, inputs = _tiny(family)
    model.to(dtype)
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        plain = model(**inputs).logits
    _general_branch(monkeypatch)
    with context():
        general = model(**inputs).logits
    assert torch.isfinite(plain).all()
    assert torch.equal(plain, general)
