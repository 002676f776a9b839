"""``explain``'s own work outside the model (issue 30's speed goal) without a changed answer or refusal.

The token-batch check decides a passing batch from the ids' and the mask's extremes in one sync
(``_checks._token_batch_passes``); any failure falls through to the step-by-step checks. These tests hold the two
routes to the same result: the same tensors returned, the same exception and message, for every kind of bad batch.
"""

from __future__ import annotations

import pytest
import torch

from bcos_plugins import _checks
from bcos_plugins._checks import require_token_batch

VOCAB, MAX_LENGTH = 50, 8


def _outcome(ids, mask, **limits):
    """What require_token_batch returns (the tensors and their dtypes) or raises (the class and message)."""
    try:
        out_ids, out_mask = require_token_batch(ids, mask, **limits)
    except Exception as error:  # noqa: BLE001 - the refusal itself is the outcome compared
        return type(error), str(error)
    return out_ids.tolist(), out_ids.dtype, None if out_mask is None else (out_mask.tolist(), out_mask.dtype)


def _batches():
    ids = torch.arange(12).reshape(3, 4) % VOCAB
    ones = torch.ones_like(ids)
    padded = ones.clone()
    padded[1, 2:] = 0
    empty_row = ones.clone()
    empty_row[2] = 0
    yield "valid", ids, ones
    yield "valid, no mask", ids, None
    yield "right padding", ids, padded
    yield "boolean mask", ids, padded.bool()
    yield "uint8 mask", ids, padded.to(torch.uint8)
    yield "int32 ids and mask", ids.int(), padded.int()
    yield "uint8 ids", ids.to(torch.uint8), padded
    yield "float mask of 0/1", ids, padded.float()
    yield "float mask of 0.5", ids, ones.float() / 2
    yield "mask of 2", ids, ones * 2
    yield "mask of -1 and 1", ids, torch.where(padded.bool(), 1, -1)
    yield "row of padding", ids, empty_row
    yield "boolean row of padding", ids, empty_row.bool()
    yield "id = vocabulary size", torch.where(ids == 5, VOCAB, ids), padded
    yield "negative id", torch.where(ids == 5, -1, ids), None
    yield "bad id and bad mask", torch.where(ids == 5, VOCAB, ids), ones * 2
    yield "too long", torch.zeros(2, MAX_LENGTH + 1, dtype=torch.long), torch.ones(2, MAX_LENGTH + 1, dtype=torch.long)
    yield "too long and a bad id", torch.full((2, MAX_LENGTH + 1), VOCAB), None
    yield "mask of another shape", ids, ones[:, :3]
    yield "mask of another shape and a bad id", torch.where(ids == 5, VOCAB, ids), ones[:, :3]
    yield "mask not a tensor", ids, ones.tolist()
    yield "complex mask", ids, ones.to(torch.complex64)


@pytest.mark.parametrize("limits", [dict(vocab_size=VOCAB, max_length=MAX_LENGTH), dict(vocab_size=VOCAB), {}])
@pytest.mark.parametrize("case", [c[0] for c in _batches()])
def test_the_one_sync_token_check_returns_and_refuses_as_the_step_by_step_checks(monkeypatch, case, limits):
    _, ids, mask = next(b for b in _batches() if b[0] == case)
    fast = _outcome(ids, mask, **limits)
    monkeypatch.setattr(_checks, "_token_batch_passes", lambda *args: None)
    step_by_step = _outcome(ids, mask, **limits)
    assert fast == step_by_step


def test_the_one_sync_token_check_decides_the_common_batches_itself():
    # it must not fall through on a valid batch (then it would only add work)
    ids = torch.arange(12).reshape(3, 4)
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    for given_mask in (mask, mask.bool(), mask.int(), None):
        passed = _checks._token_batch_passes(ids, given_mask, VOCAB, MAX_LENGTH)
        assert passed is not None
        assert passed[0] is ids
        assert (passed[1] is None) == (given_mask is None)


def test_kept_unit_block_is_the_one_block_of_units_outside_the_constant_ones():
    from bcos_plugins.nn.functional import kept_unit_block

    assert kept_unit_block(slice(0, 256), 384) == slice(256, 384)  # ModernBERT's Wqkv: the value units
    assert kept_unit_block(slice(128, None), 384) == slice(0, 128)
    assert kept_unit_block(slice(1, 3), 5) is None  # two blocks: the general path
    assert kept_unit_block(slice(None), 5) is None  # nothing kept: the projection records nothing
    assert kept_unit_block(slice(0, 4, 2), 5) is None


def _explaining_step(layer, x, upstream, kept_block_path: bool, monkeypatch):
    """(output, input gradient, second-order gradient of the input gradient's weighted sum w.r.t. ``upstream``)
    of an explaining ``layer`` without parameter gradients (as explain runs), through the one-block backward or the
    general one."""
    from bcos_plugins.nn import functional
    from bcos_plugins.nn.dynamic import explanation_mode, no_parameter_gradients

    with monkeypatch.context() as patch:
        if not kept_block_path:
            patch.setattr(functional, "kept_unit_block", lambda *args: None)
        xr = x.clone().requires_grad_()
        grad_out = upstream.clone().requires_grad_()
        with explanation_mode(layer), no_parameter_gradients():
            out = layer(xr)
            (grad,) = torch.autograd.grad(out, xr, grad_out, create_graph=True)
        (again,) = torch.autograd.grad(grad, grad_out, torch.ones_like(grad))
    return out.detach(), grad.detach(), again


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("constant", [slice(0, 256), slice(128, None)])
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_the_kept_unit_block_backward_gives_the_general_paths_values_bit_for_bit(monkeypatch, kind, constant, dtype):
    # ModernBERT's fused q|k|v projection at explain's shape (4 x 32 tokens, 128 -> 384): the constant units' rows
    # of the backward's matrix product are left out, which must change no output, gradient or second-order bit
    from bcos_plugins.nn import BcosConv1D, BcosLinear

    torch.manual_seed(0)
    layer = BcosLinear(128, 384, b=1.25, constant_outputs=constant)
    if kind == "conv1d":
        layer = BcosConv1D(128, 384, b=1.25, constant_outputs=constant)
    layer = layer.to(dtype)
    x = (torch.randn(4, 32, 128) * 3).to(dtype)
    x[0, :4] = 0.0  # padding rows: the norm's epsilon
    upstream = torch.randn(4, 32, 384).to(dtype)
    fast = _explaining_step(layer, x, upstream, True, monkeypatch)
    general = _explaining_step(layer, x, upstream, False, monkeypatch)
    assert torch.equal(fast[0], general[0]) and torch.equal(fast[1], general[1])
    # differentiated again, the two backward graphs multiply in another order: the same to float rounding
    rounding = 16 * torch.finfo(dtype).eps * float(general[2].abs().max())
    torch.testing.assert_close(fast[2], general[2], rtol=0.0, atol=rounding)


def test_explain_on_modernbert_gives_the_same_bits_through_the_kept_unit_block(monkeypatch):
    import transformers as T

    from bcos_plugins import bcosify, explain
    from bcos_plugins.nn import functional

    config = T.ModernBertConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=2)
    torch.manual_seed(0)
    model = bcosify(T.ModernBertForSequenceClassification(config), b=1.25, verbose=False).eval()
    ids = torch.randint(3, 100, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0
    applied = []
    original = functional._KeptUnitsProduct.apply
    monkeypatch.setattr(functional._KeptUnitsProduct, "apply", lambda *args: applied.append(1) or original(*args))
    fast = explain(model, ids, mask)
    # every layer's Wqkv (query and key constant) and Wi (its activated half constant) took the one-block backward
    assert len(applied) == 2 * config.num_hidden_layers
    monkeypatch.setattr(functional, "kept_unit_block", lambda *args: None)
    general = explain(model, ids, mask)
    assert len(applied) == 2 * config.num_hidden_layers
    assert torch.equal(fast.input_contributions, general.input_contributions)
    assert torch.equal(fast.explained, general.explained) and torch.equal(fast.delta, general.delta)
