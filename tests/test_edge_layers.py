"""B-cos layers in half precision and at their edges: no overflow to 0, finite gradients on zero inputs,
half-precision completeness, and alignment pressures B that are refused with a clear error."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_model
from torch import nn

from bcos_plugins import bcos_loss, bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import (
    BcosConv2d,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    check_b,
    explanation_mode,
)
from bcos_plugins.vision import BcosViT, BcosViTConfig

HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("b", [1.25, 1.5, 2.0, 2.5])
def test_half_precision_layer_is_not_zero_past_norm_256(dtype, b):
    # The case: ||x|| ~ 320, whose square overflows float16 (max 65504); the layer gave exactly 0.
    torch.manual_seed(0)
    layer = BcosLinear(64, 8, b=b)
    x = torch.randn(3, 64) * 40
    expected = layer(x)
    got = layer.to(dtype)(x.to(dtype)).float()
    assert got.dtype == torch.float32 and (got != 0).all()
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol * expected.abs().max().item())


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_conv_and_layer_norm_past_norm_256(dtype):
    torch.manual_seed(0)
    conv = BcosConv2d(4, 6, kernel_size=3, padding=1, b=2.0)
    x = torch.randn(2, 4, 5, 5) * 60  # patch norms ~ 360
    torch.testing.assert_close(conv.to(dtype)(x.to(dtype)).float(), conv.float()(x), rtol=3e-2, atol=0.5)
    norm = BcosLayerNorm(32, eps=1e-12)  # BERT's eps, 0 in float16
    y = torch.randn(3, 32) * 300 + 1000  # variance 9e4 overflows float16
    out = norm.to(dtype)(y.to(dtype)).float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, norm.float()(y), rtol=5e-2, atol=5e-2)


def test_eight_layer_vit_half_logits_match_float32():
    # The case: an 8-layer B-cos ViT whose residual stream grows past norm 256 gave logits
    # [0, 0, 0] in float16 against about [923, -1516, 28] in float32.
    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(num_hidden_layers=8, num_labels=3, b=1.01, max_out=2)).eval()
    images = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(images).logits
        half = model.half()(images.half()).logits.float()
    assert full.abs().max() > 500  # the regime where float16 norms overflowed
    assert (half - full).abs().max() <= 3e-3 * full.abs().max()
    assert torch.equal(half.argmax(-1), full.argmax(-1))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("b", [1.1, 1.25, 1.5, 2.0])
def test_zero_inputs_give_finite_outputs_and_gradients_in_half_training(dtype, b):
    torch.manual_seed(0)
    model = nn.Sequential(BcosLinear(8, 16, b=b), BcosLayerNorm(16, eps=1e-12), DetachableActivation("gelu_tanh"),
                          BcosLinear(16, 4, b=b, max_out=2)).to(dtype).train()
    x = torch.zeros(3, 8, dtype=dtype, requires_grad=True)
    out = model(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and (out == 0).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    conv = BcosConv2d(2, 3, kernel_size=3, b=b).to(dtype)
    z = torch.zeros(1, 2, 4, 4, dtype=dtype, requires_grad=True)
    conv(z).sum().backward()
    assert torch.isfinite(z.grad).all() and torch.isfinite(conv.weight.grad).all()


@pytest.mark.parametrize("dtype", HALF)
def test_large_activations_keep_gelu_gradients_finite_in_half(dtype):
    act = DetachableActivation("gelu_tanh")
    x = torch.tensor([-300.0, -50.0, 0.0, 50.0, 300.0], dtype=dtype, requires_grad=True)
    act(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(x.grad.float(), torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]), atol=1e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_forward_values_identical_in_and_out_of_explanation_mode(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(BcosLinear(8, 16, b=1.5), BcosLayerNorm(16), DetachableActivation("gelu"),
                          BcosLinear(16, 4, b=1.25, max_out=2)).to(dtype)
    x = (torch.randn(5, 8) * 100).to(dtype)
    plain = model(x)
    with explanation_mode(model):
        explaining = model(x)
    assert torch.equal(plain, explaining)


def _tiny_bert(dtype: torch.dtype, seed: int, b: float) -> nn.Module:
    torch.manual_seed(seed)
    config = T.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, num_labels=3)
    return bcosify(T.BertForSequenceClassification(config), b=b, verbose=False).to(dtype).eval()


@pytest.mark.parametrize(("dtype", "median_bound", "delta_bound"),
                         [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)])
def test_half_precision_completeness_is_as_documented(dtype, median_bound, delta_bound):
    # Measured (BcosLinear docstring): median relative error 8e-4 (float16) and 7e-3 (bfloat16), |delta| at
    # most 6e-4 / 7e-3 of the largest logit: the dtypes' unit roundoff. Bounds here leave a 2.5x margin.
    ids = torch.randint(5, 100, (8, 12), generator=torch.Generator().manual_seed(0))
    errors, deltas, scale = [], [], []
    for seed in range(3):
        e = explain(_tiny_bert(dtype, seed, b=1.5), ids, torch.ones_like(ids))
        errors.append(e.completeness_error.float())
        deltas.append(e.delta.abs().float())
        scale.append(e.explained.abs().float())
    assert torch.cat(errors).median() < median_bound
    assert torch.cat(deltas).max() < delta_bound * torch.cat(scale).max()


@pytest.mark.parametrize("bad", ["abc", None, [1.5], 1 + 2j, True, torch.tensor([1.5, 2.0])])
def test_b_of_wrong_type_is_refused_naming_b(bad):
    with pytest.raises(BcosTypeError, match=r"^b: must be a real number, got .*b must be >= 1"):
        check_b(bad)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e6, 10.000001, 0.999, -2.0])
def test_b_out_of_range_is_refused_everywhere_b_enters(bad):
    pattern = r"must be a finite number in \[1, 10\], got"
    with pytest.raises(BcosValueError, match="^b: " + pattern):
        BcosLinear(3, 3, b=bad)
    with pytest.raises(BcosValueError, match="^b: " + pattern):
        BcosConv2d(1, 1, 1, b=bad)
    model = T.BertModel(T.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16))
    with pytest.raises(BcosValueError, match="^b: " + pattern):
        bcosify(model, b=bad, verbose=False)
    assert not any(isinstance(m, BcosLinear) for m in model.modules())  # refused before touching the model
    layer = BcosLinear(3, 3, b=1.5)
    with pytest.raises(BcosValueError, match="^b: " + pattern):
        layer.b = bad
    assert layer.b == 1.5 and layer.bcos_b.item() == 1.5


@pytest.mark.parametrize("good", [1, 1.0, 10, np.float32(1.25), np.int64(2), torch.tensor(1.5)])
def test_b_accepts_real_numbers_in_range(good):
    assert check_b(good) == float(good)
    assert BcosLinear(2, 2, b=good).b == float(good)


@pytest.mark.parametrize(("name", "dtype"), [
    ("GPT2ForSequenceClassification", torch.float16), ("LlamaForSequenceClassification", torch.float16),
    ("BertForSequenceClassification", torch.bfloat16), ("DistilBertForSequenceClassification", torch.bfloat16),
    ("RobertaForSequenceClassification", torch.bfloat16), ("GPT2ForSequenceClassification", torch.bfloat16),
])
def test_half_precision_training_on_all_zero_embeddings_keeps_gradients_finite(name, dtype):
    # BERT-family models are left out in float16: their LayerNorm eps = 1e-12 makes the true gradient on a
    # constant row 1e6 times the upstream one, beyond float16's range, in the stock model too (README).
    model = bcosify(tiny_model(name), b=1.25, verbose=False).to(dtype).train()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if any(k in param_name for k in ("word_embeddings", "position_embeddings", "token_type", "wte", "wpe",
                                             "embed_tokens")):
                param.zero_()
    ids, mask = padded_batch(pad_id=1 if name.startswith("Roberta") else 0)
    out = model(input_ids=ids, attention_mask=mask)
    bcos_loss(out, torch.tensor([0, 1, 2])).backward()
    assert torch.isfinite(out.logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


AUTOCAST_MODELS = ["BertForSequenceClassification", "GPT2ForSequenceClassification", "LlamaForSequenceClassification"]


@pytest.mark.parametrize("name", AUTOCAST_MODELS)
@pytest.mark.parametrize("dtype", HALF)
def test_autocast_runs_matrix_products_low_and_stays_finite_and_complete(name, dtype):
    # Under torch.autocast the B-cos projections run their matrix products in the low precision (their
    # outputs are half, as nn.Linear's are), the norms stay float32, training gradients are finite and reach
    # every parameter, and explain stays complete to the dtype's rounding (bf16: unit roundoff 4e-3 per step).
    model = bcosify(tiny_model(name), b=1.25, verbose=False)
    ids, mask = padded_batch()
    seen = set()
    for module in model.modules():
        if isinstance(module, BcosLinear):
            module.register_forward_hook(lambda m, args, out: seen.add(out.dtype))
    model.train()
    with torch.autocast("cpu", dtype=dtype):
        out = model(input_ids=ids, attention_mask=mask)
        loss = bcos_loss(out, torch.tensor([0, 1, 2]))
    loss.backward()
    assert seen == {dtype}
    assert torch.isfinite(out.logits).all() and torch.isfinite(loss)
    bcos_weights = [m.weight for m in model.modules() if isinstance(m, BcosLinear)]
    assert bcos_weights and all(w.grad is not None and torch.isfinite(w.grad).all() for w in bcos_weights)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.autocast("cpu", dtype=dtype):
        e = explain(model.eval(), ids, mask)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(e.input_contributions).all()
    bound = 2e-2 if dtype == torch.bfloat16 else 2e-3
    assert e.completeness_error.float().median() < bound
    assert (e.delta.abs().float().max() < 2 * bound * e.explained.abs().float().max())
    picked = full.gather(1, e.target.view(-1, 1)).squeeze(1)
    torch.testing.assert_close(e.explained.float(), picked, rtol=0, atol=3 * bound * full.abs().max().item())
