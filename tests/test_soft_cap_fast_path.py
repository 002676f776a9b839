"""Gemma 2's soft-capped LM head without autograd recording (inference, and the constant gate while explaining) writes
the ratio ``tanh(z / c) / (z / c)`` into the fresh quotient ``z / c`` and, when nothing is recorded, the product into the
fresh ratio (allocations of the logits' size fewer): the values must be the recorded forms' bits, and the logits the
head reads must stay unchanged."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify
from bcos_plugins.convert.gemma import BcosSoftCappedLMHead
from bcos_plugins.nn import explanation_mode
from bcos_plugins.nn.activation import soft_cap_scale, tanh_ratio
from bcos_plugins.nn.dynamic import DynamicWeightModule, no_parameter_gradients


def _bcos_gemma2(dtype: torch.dtype):
    config = T.Gemma2Config(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64,
                            sliding_window=4, query_pre_attn_scalar=8, pad_token_id=0, bos_token_id=2, eos_token_id=2,
                            final_logit_softcapping=0.5)
    torch.manual_seed(0)
    return bcosify(T.Gemma2ForCausalLM(config), b=1.25, verbose=False).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inference_logits_are_the_explaining_forwards_bits_and_the_steps_of_the_soft_cap(dtype):
    model = _bcos_gemma2(dtype)
    ids = torch.randint(3, 97, (3, 7), generator=torch.Generator().manual_seed(1))
    head = model.lm_head
    assert isinstance(head, BcosSoftCappedLMHead)
    seen = {}
    head.register_forward_hook(lambda module, args, out: seen.update(x=args[0].detach().clone()))
    with torch.no_grad():
        inference = model(input_ids=ids).logits
    hidden = seen["x"]
    # explaining, the forward values are the same (the ratio is a constant computed without autograd there too)
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    with explanation_mode(model), no_parameter_gradients():
        explaining = model(inputs_embeds=embeddings).logits
    with torch.no_grad():
        inference_from_embeddings = model(inputs_embeds=embeddings).logits
    assert explaining.requires_grad
    assert torch.equal(explaining.detach(), inference_from_embeddings)
    assert inference.shape == (3, 7, 97) and inference.dtype == dtype
    # |logits| < c, as the stock soft-cap gives
    assert inference.abs().max() < 0.5
    # the head alone, step by step: z * (tanh(z / c) / (z / c)) out of place, the ratio by the public function
    with torch.no_grad():
        fast = head(hidden)
        logits = super(BcosSoftCappedLMHead, head).forward(hidden)
        steps = logits * tanh_ratio(logits / 0.5)
    assert torch.equal(fast, steps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_the_unrecorded_soft_cap_scale_is_tanh_ratios_bits_and_leaves_the_logits_alone(dtype):
    generator = torch.Generator().manual_seed(2)
    logits = (torch.randn(5, 11, 40, generator=generator, dtype=torch.float64) * 3).to(dtype)
    logits[0, 0, :4] = torch.tensor([0.0, -0.0, float("nan"), float("inf")], dtype=torch.float64).to(dtype)
    kept = logits.clone()
    module = DynamicWeightModule()
    with torch.no_grad():
        fast = soft_cap_scale(module, logits, 0.5)
        want = tanh_ratio(logits / 0.5)
    assert torch.equal(logits.isnan(), kept.isnan()) and torch.equal(logits[~kept.isnan()], kept[~kept.isnan()])
    assert torch.equal(fast.isnan(), want.isnan())
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[fast.element_size()]
    assert torch.equal(fast[~want.isnan()].view(bits), want[~want.isnan()].view(bits))
    assert fast[0, 0, 0] == 1.0 and fast[0, 0, 1] == 1.0 and fast[0, 0, 2].isnan() and fast[0, 0, 3] == 0.0
    # recording (training), the series form autograd differentiates: a graph, and values within rounding
    recorded = soft_cap_scale(module, logits[1:].double().requires_grad_(), 0.5)
    assert recorded.requires_grad
    torch.testing.assert_close(recorded.detach(), tanh_ratio(logits[1:].double() / 0.5), rtol=1e-12, atol=0.0)
