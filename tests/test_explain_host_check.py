"""``explain``'s own work outside the model, made cheaper without a changed answer or refusal: the completeness check's
healthy path on the host, the diagonal pick of ``logits_to_keep``'s columns, the walk of ``has_dynamic_weights`` and
one hook at the attribution point that both captures it and notes the autocast dtype."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from bcos_plugins.attribution.gradient import capture_point
from bcos_plugins.attribution.text import logits_at_positions
from bcos_plugins.explain import _complete_on_host, autocast_note, completeness_tolerance
from bcos_plugins.nn import BcosLinear
from bcos_plugins.nn.dynamic import has_dynamic_weights


def _tensor_rule(explained, scale, token_scores, delta, tolerance) -> bool:
    """The completeness rule as explain's tensor form evaluates it (the form a failing call still runs)."""
    size = torch.stack([explained.abs(), scale.to(explained.dtype), token_scores]).amax(0)
    error = delta.abs().double() / size.double().clamp_min(torch.finfo(torch.float64).tiny)
    return bool((error <= tolerance).all())


def _rows(dtype):
    """(explained, scale, token_scores, delta) rows: ordinary, at and next to the tolerance, tiny, zero, non-finite."""
    tol = completeness_tolerance(torch.zeros(1, dtype=dtype))[0]
    ordinary = [(3.0, 3.0, 7.5, 1e-6), (-2.0, 2.0, 1.0, -3e-5), (0.0, 0.0, 0.0, 0.0), (1e-30, 1e-30, 1e-30, 1e-31)]
    for size in (1.0, 7.25, 1e4, 3e-3):
        # delta at the tolerance, and one float step either side of it (in the delta's dtype)
        at = torch.tensor(tol * size, dtype=torch.float32)
        for d in (at, torch.nextafter(at, torch.tensor(0.0)), torch.nextafter(at, torch.tensor(1e9))):
            # each of the three sizes the largest once: the explained value, the outputs' scale, the token scores
            ordinary += [(size, size / 3, size / 2, float(d)), (size / 9, size, size / 8, float(d)),
                         (-size / 4, size / 4, size, -float(d))]
    special = [float("nan"), float("inf"), -float("inf")]
    non_finite = [tuple(v if i == j else 1.0 for i in range(4)) for v in special for j in range(4)]
    return ordinary + non_finite


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_completeness_check_on_the_host_decides_every_row_as_the_tensor_form(dtype):
    tol, _ = completeness_tolerance(torch.zeros(1, dtype=dtype))
    delta_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # explain's total is at least float32
    rows = _rows(dtype)
    decisions = []
    for e, s, t, d in rows:
        tensors = (torch.tensor([e], dtype=dtype), torch.tensor([s], dtype=dtype),
                   torch.tensor([t], dtype=delta_dtype), torch.tensor([d], dtype=delta_dtype))
        expected = _tensor_rule(*tensors, tol)
        on_host = _complete_on_host(torch.stack([tensors[0], tensors[1].to(dtype), tensors[2], tensors[3]]).tolist(),
                                    tol)
        # the host may send a row on to the tensor form (non-finite values), never pass one the tensor form refuses
        assert on_host <= expected, (e, s, t, d)
        if all(map(torch.isfinite, (torch.tensor(v) for v in (e, s, t, d)))):
            assert on_host == expected, (e, s, t, d)
        decisions.append(expected)
    assert any(decisions) and not all(decisions)  # the rows test both outcomes
    # a batch passes on the host only where every row does
    for pair in itertools.combinations(range(len(rows)), 2):
        batch = [torch.tensor([rows[i][k] for i in pair], dtype=dtype if k < 2 else delta_dtype) for k in range(4)]
        assert _complete_on_host(torch.stack(batch).tolist(), tol) <= _tensor_rule(*batch, tol)


def test_logits_to_keep_columns_are_read_as_the_indexed_pick_with_the_same_gradient():
    torch.manual_seed(0)
    kept = torch.randn(3, 3, 11, dtype=torch.float64, requires_grad=True)  # 3 rows, their 3 explained columns
    picked = logits_at_positions(kept, torch.tensor([5, 9, 2]), length=12)
    rows = torch.arange(3)
    expected = kept[rows, rows]
    assert torch.equal(picked, expected) and picked.stride() == expected.stride()
    weights = torch.randn(3, 11, dtype=torch.float64)
    assert torch.equal(torch.autograd.grad((picked * weights).sum(), kept)[0],
                       torch.autograd.grad((expected * weights).sum(), kept)[0])
    every = torch.randn(3, 12, 11)  # every column: indexed at the positions
    assert torch.equal(logits_at_positions(every, torch.tensor([5, 9, 2]), 12), every[rows, torch.tensor([5, 9, 2])])


def test_has_dynamic_weights_answers_as_a_walk_of_modules_does():
    shared = nn.Linear(4, 4)
    models = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
              nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Identity(), BcosLinear(4, 4))),
              nn.Sequential(shared, shared, nn.Sequential(shared)),
              BcosLinear(4, 4),
              nn.ModuleDict({"a": nn.ModuleList([nn.Linear(2, 2), None]), "b": nn.Sequential(BcosLinear(2, 2))})]
    answers = [has_dynamic_weights(m) for m in models]
    assert answers == [any(isinstance(s, BcosLinear) for s in m.modules()) for m in models]
    assert answers == [False, True, False, True, True]


def test_the_capturing_hook_notes_the_autocast_dtype_at_every_call():
    embedding = nn.Embedding(10, 4)
    seen: list[torch.dtype] = []
    probe = torch.ones(2, 3, 4, requires_grad=True)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with capture_point(embedding, "output", probe=probe, each_call=autocast_note(embedding, seen)) as leaves:
        plain = embedding(ids)
        with torch.autocast("cpu", torch.bfloat16):
            embedding(ids)
    assert seen == [torch.bfloat16] and leaves == [probe]  # noted under autocast only; the first call captured
    assert torch.equal(plain, embedding(ids))


def test_whether_a_forward_takes_position_ids_follows_the_forward_function():
    from bcos_plugins.attribution.text import _forward_takes_position_ids

    class WithIds(nn.Module):
        def forward(self, input_ids, position_ids=None):
            return input_ids

    class Without(nn.Module):
        def forward(self, input_ids):
            return input_ids

    model = WithIds()
    assert _forward_takes_position_ids(model) and _forward_takes_position_ids(WithIds())  # asked again: remembered
    assert not _forward_takes_position_ids(Without())
    model.forward = Without().forward  # a forward replaced on the model: its own answer
    assert not _forward_takes_position_ids(model)
    model.forward = lambda input_ids, position_ids=None: input_ids
    assert _forward_takes_position_ids(model)

    def plain(input_ids):
        return input_ids

    swapped = WithIds()
    swapped.forward = plain
    assert not _forward_takes_position_ids(swapped)
    plain.__code__ = (lambda input_ids, position_ids=None: input_ids).__code__  # the same function, another code
    assert _forward_takes_position_ids(swapped)

    class Callable:  # a callable forward without weak references is read every time
        __slots__ = ()

        def __call__(self, input_ids, position_ids=None):
            return input_ids

    odd = Without()
    odd.forward = Callable()
    assert _forward_takes_position_ids(odd) and _forward_takes_position_ids(odd)


def test_every_reading_of_a_forward_signature_is_the_one_remembered_per_forward_function(monkeypatch):
    # forward_keywords, the position-ids predicate and the Captum adapter's test for a text model read one cached
    # signature: inspect.signature runs once per forward function, and again where the function's code was swapped
    # or it is read unbound (its signature then names self)
    import inspect

    import transformers as T
    from bcos_plugins.adapters import captum

    from bcos_plugins.attribution import text

    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=1, intermediate_size=32))
    read = []
    signature = inspect.signature
    monkeypatch.setattr(text.inspect, "signature", lambda f, *a, **k: read.append(f) or signature(f, *a, **k))
    text._FORWARD_PARAMETERS.clear()
    assert captum._reads_token_ids_first(model) and captum._reads_token_ids_first(model)
    assert "position_ids" in text.forward_keywords(model) and text._forward_takes_position_ids(model)
    assert len(read) == 1
    assert next(iter(text.forward_parameters(model))) == "input_ids"

    def forward(self, input_ids, position_ids=None):
        return input_ids

    class Plain(nn.Module):
        pass

    Plain.forward = forward
    bound, unbound = Plain(), Plain()
    unbound.forward = forward  # the same function as a plain attribute: self is its first parameter
    assert list(text.forward_parameters(bound)) == ["input_ids", "position_ids"]
    assert list(text.forward_parameters(unbound)) == ["self", "input_ids", "position_ids"]
    assert list(text.forward_parameters(bound)) == ["input_ids", "position_ids"]
    assert len(read) == 4
    class Unreadable:
        __signature__ = "not a signature"  # inspect.signature raises TypeError

        def __call__(self, input_ids):
            return input_ids

    unbound.forward = Unreadable()
    assert text.forward_parameters(unbound) is None and text.forward_keywords(unbound) is None
