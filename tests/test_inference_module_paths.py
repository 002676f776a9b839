"""Outside explanation mode the gated MLPs and RMS norms skip the explaining path's scope and detach calls, the B-cos
linear layer's inference path reads its weight from ``_parameters``, and the importing thread holds the explanation
state that every dynamic-weight module reads per call (a speed change: a small model's forward is Python-bound,
docs/benchmarks.md, 2026-11-28 16:16 UTC). These tests hold each shortened path to the full one: the same ops in the
same order and the same bits, in and out of explanation mode, with and without autograd recording; a weight that is
no registered parameter (a parametrization) read as before; and the state set in a fresh process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers as T
from conftest import RecordedOps
from torch import nn
from torch.nn.utils import parametrize

from bcos_plugins import bcosify
from bcos_plugins.convert.decoder_modules import BcosFusedGatedMLP, BcosGatedMLP
from bcos_plugins.convert.gemma import BcosGemmaRMSNorm
from bcos_plugins.nn import BcosLinear, DetachableRMSNorm, explanation_mode
from bcos_plugins.nn.dynamic import dynamic_weights_used

VIEWS = {"t", "permute", "transpose", "view", "_unsafe_view", "expand", "as_strided", "detach", "alias", "split",
         "slice", "unsqueeze", "squeeze"}


def _family_module(kind: str, dtype: torch.dtype) -> nn.Module:
    common = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                  max_position_embeddings=32, pad_token_id=0)
    torch.manual_seed(0)
    if kind == "gated_mlp":
        model = bcosify(T.Qwen2ForCausalLM(T.Qwen2Config(**common, num_key_value_heads=1)), b=1.25, verbose=False)
        module = model.model.layers[0].mlp
    elif kind == "fused_gated_mlp":
        model = bcosify(T.ModernBertForSequenceClassification(T.ModernBertConfig(
            **common, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=2)), b=1.25,
            verbose=False)
        module = model.model.layers[0].mlp
    elif kind == "gemma_rms_norm":
        model = bcosify(T.Gemma2ForCausalLM(T.Gemma2Config(**common, num_key_value_heads=1, head_dim=8)), b=1.25,
                        verbose=False)
        module = model.model.layers[0].input_layernorm
        with torch.no_grad():
            module.weight.normal_()  # (Gemma's gain starts at 0: 1 + weight is then 1 everywhere)
    else:
        module = DetachableRMSNorm(16, eps=1e-6)
        with torch.no_grad():
            module.weight.normal_()
    expected = {"gated_mlp": BcosGatedMLP, "fused_gated_mlp": BcosFusedGatedMLP, "gemma_rms_norm": BcosGemmaRMSNorm,
                "rms_norm": DetachableRMSNorm}[kind]
    assert isinstance(module, expected)
    return module.to(dtype).eval()


def _run(module: nn.Module, x: torch.Tensor, explaining: bool, recording: bool):
    x = x.clone().requires_grad_(recording)
    with torch.set_grad_enabled(recording), RecordedOps(VIEWS) as ops:
        if explaining:
            with explanation_mode(module):
                out = module(x)
        else:
            out = module(x)
    grad = torch.autograd.grad(out.sum(), x)[0] if recording else None
    return out, ops.ops, grad


@pytest.mark.parametrize("recording", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["gated_mlp", "fused_gated_mlp", "gemma_rms_norm", "rms_norm"])
def test_the_shortened_forward_runs_the_explaining_forwards_ops_with_the_same_values(kind, dtype, recording):
    module = _family_module(kind, dtype)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3)).to(dtype) * 2
    x[0, 0] = 0.0  # a padding row
    plain, plain_ops, plain_grad = _run(module, x, explaining=False, recording=recording)
    used = dynamic_weights_used()
    explained, explained_ops, explained_grad = _run(module, x, explaining=True, recording=recording)
    assert dynamic_weights_used() > used  # the explaining path still ran (and counted its dynamic weight)
    assert torch.isfinite(plain).all()
    assert torch.equal(plain, explained)
    if not recording:  # (recording, the explaining path leaves the dynamic weight's own graph out)
        assert plain_ops == explained_ops
    else:  # the shortened path is the full product rule: the gate / 1/rms branch carries gradient too
        assert not torch.equal(plain_grad, explained_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inference_reads_a_parametrized_weight_as_the_attribute(dtype):
    torch.manual_seed(0)
    layer = BcosLinear(6, 4, b=1.25).to(dtype).eval()

    class _Doubled(nn.Module):
        def forward(self, weight):
            return weight * 2.0

    reference = BcosLinear(6, 4, b=1.25).to(dtype).eval()
    with torch.no_grad():
        reference.weight.copy_(layer.weight * 2.0)
    parametrize.register_parametrization(layer, "weight", _Doubled())
    assert "weight" not in layer._parameters  # (the parametrization moved it: the attribute is a property now)
    x = torch.randn(3, 6, dtype=dtype, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(layer(x), reference(x))


def test_the_importing_thread_holds_the_explanation_state():
    # read by every dynamic-weight module in every forward: unset, getattr's default raises and catches an
    # AttributeError inside (0.45-0.5 us a read)
    code = ("import bcos_plugins.nn.dynamic as d; "
            "assert 'explained' in vars(d._THREAD_STATE) and d._THREAD_STATE.explained == frozenset()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
