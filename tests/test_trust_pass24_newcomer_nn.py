"""Trust pass 24, a newcomer's second hour and the ``bcos_plugins.nn`` layers built by hand: unusual inputs aimed
where earlier passes did not look (a norm given an input of another width, a torch RMS norm over two dims, ...), each
checked against an independent computation (torch's own layer, a float64 reference of the formula). The cases that
were silently wrong or crashed unhelpfully, one test each (the tally is in the CHANGELOG and the session's report).

- ``DetachableRMSNorm(5)`` given an input whose last dimension is 1 (or a 0-d input) broadcast its gain against it:
  the output had the gain's width, each value ``sign(x) * gain``, silently (``torch.nn.RMSNorm`` refuses it); another
  width failed with torch's "The size of tensor a (5) must match ...". Refused naming ``x`` and the size it needs.
- ``DetachableRMSNorm.from_rms_norm(torch.nn.RMSNorm((4, 5)), hold=True)`` held the (4, 5) gain and normalised over
  the last dim only: another function than torch's norm over both (0.61 off), silently; without ``hold`` it failed
  with torch's "The size of tensor a (4) must match ...". Refused naming ``norm``.
- docs/hosts/upstream-issues.md's reproductions, run as written in the page's order: two did not show what the page
  says (a BERT left in training mode; a shared GPT-2 whose config an earlier snippet changed).
- ``BcosLinear(..., constant_outputs=slice(4, 1, -1))`` (any slice with a negative step, which the check accepts)
  failed in the explaining backward pass of a B != 1 layer with torch's "step must be greater than zero"; the layer
  now holds the same units as a slice with a positive step.
- ``mode = explanation_mode(model)`` (or ``reference_path()``, ``reuse_unit_weights()``) entered a second time failed
  with contextlib's "'_GeneratorContextManager' object has no attribute 'args'": they can be entered again, as
  ``torch.no_grad()``'s objects can (``nn.dynamic.reusable_context``).
- torch.func's model ensembling (``stack_module_state``, ``vmap(functional_call)``) of B-cos layers failed reading B
  from the stacked ``bcos_b`` with torch's "vmap: It looks like you're calling .item() on a Tensor"; refused naming
  ``bcos_b`` and the fix (the buffers unbatched), which runs.
- ``BcosLayerNorm(np.int64(4))`` failed with "'numpy.int64' object is not iterable"; ``DetachableRMSNorm`` and
  ``BcosConv2d``'s kernel size, stride and padding refused NumPy integers as no integers (``BcosLinear`` takes them).
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import (
    BcosConv1D,
    BcosConv2d,
    BcosLayerNorm,
    BcosLinear,
    DetachableRMSNorm,
    explanation_mode,
    is_explaining,
    reference_path,
    reuse_unit_weights,
)
from bcos_plugins.nn.dynamic import no_parameter_gradients

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("shape", [(2, 1), (), (2, 3)], ids=["width-1", "0-d", "width-3"])
@pytest.mark.parametrize("explaining", [False, True], ids=["forward", "explaining"])
def test_an_rms_norm_given_an_input_of_another_width_is_refused_naming_x(shape, explaining):
    norm = DetachableRMSNorm(5)
    x = torch.randn(shape)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    with explanation_mode(norm) if explaining else torch.enable_grad():
        with pytest.raises(BcosValueError, match=r"^x: DetachableRMSNorm\(5\) normalises a last dimension of size 5"):
            norm(x)
    # torch's own RMS norm refuses the same inputs
    with pytest.raises((RuntimeError, ValueError)):  # (ValueError for the 0-d input)
        torch.nn.RMSNorm(5)(x)


def test_an_rms_norm_of_the_right_width_is_torchs_rms_norm():
    torch.manual_seed(0)
    stock = torch.nn.RMSNorm(5, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        stock.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    ours = DetachableRMSNorm.from_rms_norm(stock)
    torch.testing.assert_close(ours(x), stock(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(ours(x[0, 0]), stock(x[0, 0]), rtol=0, atol=1e-15)  # unbatched


@pytest.mark.parametrize("hold", [False, True], ids=["copy", "hold"])
def test_a_torch_rms_norm_over_two_dims_is_refused_naming_the_norm(hold):
    stock = torch.nn.RMSNorm((4, 5), eps=1e-6)
    with pytest.raises(BcosValueError, match=r"^norm: normalises over the last 2 dims \(a gain of shape \(4, 5\)\)"):
        DetachableRMSNorm.from_rms_norm(stock, hold=hold)


def _page_snippets(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)


def test_the_upstream_issue_reproductions_show_what_the_page_says_run_in_its_order(tmp_path, monkeypatch):
    """docs/hosts/upstream-issues.md's snippets share one set-up and are marked not run (the host tests run their own
    variants): run as written, in the page's order, the num_items_in_batch reproduction failed its assertion (its BERT
    was left in training mode: dropout made the two losses differ) and the bfloat16 ``show()`` one failed with the
    AttributeError of the ``return_dict`` one before it (which set the shared GPT-2's config), not the TypeError it
    names. Each runs now, or raises the error its last comment names."""
    monkeypatch.chdir(tmp_path)
    setup, *reproductions = _page_snippets("docs/hosts/upstream-issues.md")
    assert len(reproductions) == 9
    namespace: dict = {}
    torch.manual_seed(0)  # (the set-up's models are random)
    exec(compile(setup, "upstream-issues set-up", "exec"), namespace)
    for number, code in enumerate(reproductions, 1):
        named = re.search(r"#\s+(\w+Error)\b", code)
        if named is None:
            exec(compile(code, f"upstream-issues {number}", "exec"), namespace)
            continue
        with pytest.raises(Exception) as raised:
            exec(compile(code, f"upstream-issues {number}", "exec"), namespace)
        assert type(raised.value).__name__ == named.group(1), (number, raised.value)


@pytest.mark.parametrize("held", [slice(4, 1, -1), slice(None, None, -2), slice(1, 4, -1)], ids=["4:1:-1", "::-2", "empty"])
@pytest.mark.parametrize("layer_class", [BcosLinear, BcosConv1D])
@pytest.mark.parametrize("max_out", [1, 2])
def test_constant_outputs_with_a_negative_step_hold_their_units_constant_on_the_fused_path(held, layer_class, max_out):
    """``constant_outputs`` takes any slice with a non-zero step; one with a negative step failed in the explaining
    backward pass of a B != 1 layer with torch's "step must be greater than zero" (the reference path held its units
    constant). The units it names are held constant on both paths, each other unit's explanation complete."""
    torch.manual_seed(0)
    layer = layer_class(5, 6, b=2.0, max_out=max_out, constant_outputs=held).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    constant = set(range(6)[held])

    def gradients():
        xr = x.clone().requires_grad_()
        with explanation_mode(layer), no_parameter_gradients():
            y = layer(xr)
            return y.detach(), [torch.autograd.grad(y[:, unit].sum(), xr, retain_graph=True)[0] for unit in range(6)]

    fused, fused_grads = gradients()
    with reference_path():
        reference, reference_grads = gradients()
    torch.testing.assert_close(fused, reference, rtol=0, atol=1e-14)
    for unit in range(6):
        torch.testing.assert_close(fused_grads[unit], reference_grads[unit], rtol=0, atol=1e-14)
        if unit in constant:
            assert not fused_grads[unit].any(), unit
        else:
            torch.testing.assert_close((fused_grads[unit] * x).sum(-1), fused[:, unit], rtol=0, atol=1e-14)
    assert set(range(6)[layer.constant_outputs]) == constant


@pytest.mark.parametrize(("make", "explains"), [(lambda model: explanation_mode(model), True),
                                              (lambda model: explanation_mode(), True),
                                              (lambda model: reference_path(), False),
                                              (lambda model: reuse_unit_weights(), False)],
                         ids=["explanation_mode(model)", "explanation_mode()", "reference_path", "reuse_unit_weights"])
def test_the_nn_context_managers_can_be_entered_again_as_torchs_can(make, explains):
    """``mode = explanation_mode(model)`` then ``with mode:`` twice (a loop over batches) failed at the second block
    with contextlib's "'_GeneratorContextManager' object has no attribute 'args'" (``reference_path()`` and
    ``reuse_unit_weights()`` too); ``torch.no_grad()``'s objects can be entered again. Each block (also nested in
    itself, and after one that raised) explains as a fresh one does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(BcosLinear(5, 4, b=2.0), DetachableRMSNorm(4), BcosLinear(4, 2, b=1.5)).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    mode = make(model)

    def explained() -> torch.Tensor:
        xr = x.clone().requires_grad_()
        logit = model(xr)[:, 1]
        return xr * torch.autograd.grad(logit.sum(), xr)[0]

    def block():  # a fresh explanation_mode around the switches that do not explain themselves
        return nullcontext() if explains else explanation_mode(model)

    with explanation_mode(model):
        expected = explained()
    for _ in range(2):
        with block(), mode:
            torch.testing.assert_close(explained().sum(-1), model(x)[:, 1], rtol=0, atol=1e-14)
            torch.testing.assert_close(explained(), expected, rtol=0, atol=1e-14)
            with mode:  # nested in itself
                torch.testing.assert_close(explained(), expected, rtol=0, atol=1e-14)
    with pytest.raises(KeyError), mode:
        raise KeyError("raised inside")
    with block(), mode:
        torch.testing.assert_close(explained(), expected, rtol=0, atol=1e-14)
    assert not is_explaining(model)


@pytest.mark.parametrize("make", [lambda: BcosLinear(5, 3, b=2.0), lambda: BcosConv2d(5, 3, 1, b=1.5)],
                         ids=["linear", "conv"])
def test_model_ensembling_with_stacked_buffers_is_refused_naming_bcos_b_and_the_unbatched_form_runs(make):
    """torch.func's model ensembling (``stack_module_state``, then ``vmap(functional_call)``) stacks the B buffers too:
    the layer failed reading its B with torch's "vmap: It looks like you're calling .item() on a Tensor". It is
    refused naming ``bcos_b`` and the fix; the fix (the buffers unbatched) gives each model its own outputs, and the
    layer runs as before after the refusal."""
    torch.manual_seed(0)
    models = [make().double() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    x = torch.randn(2, 5, dtype=torch.float64)
    if isinstance(models[0], BcosConv2d):
        x = x[:, :, None, None]

    def run(p, b, inputs):
        return torch.func.functional_call(models[0], (p, b), (inputs,))

    with pytest.raises(BcosValueError, match=r"^Bcos\w+\.bcos_b: is batched by a torch\.func transform"):
        torch.func.vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    one_models_buffers = dict(models[0].named_buffers())
    ensembled = torch.func.vmap(run, in_dims=(0, None, None))(params, one_models_buffers, x)
    for i, model in enumerate(models):
        torch.testing.assert_close(ensembled[i], model(x), rtol=0, atol=1e-14)
    assert models[0].b == models[0].bcos_b.item() == models[0].initial_b


def test_the_norms_and_the_convolution_take_numpy_integer_sizes_as_bcos_linear_and_torch_do():
    """A size read from a NumPy array (``np.int64(4)``): ``BcosLinear`` and torch's layers take it, but
    ``BcosLayerNorm(np.int64(4))`` failed with "'numpy.int64' object is not iterable", ``DetachableRMSNorm`` and
    ``BcosConv2d``'s ``kernel_size`` / ``stride`` / ``padding`` refused it as no integer, and so did
    ``BcosLayerNorm.from_layer_norm`` of a torch ``LayerNorm(np.int64(4))``. Each builds the layer of the plain int."""
    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    stock = torch.nn.LayerNorm(np.int64(4), dtype=torch.float64)
    for norm in (BcosLayerNorm(np.int64(4)).double(), BcosLayerNorm.from_layer_norm(stock)):
        assert norm.normalized_shape == (4,) and type(norm.normalized_shape[0]) is int
        torch.testing.assert_close(norm(x), torch.nn.functional.layer_norm(x, (4,), eps=1e-5), rtol=0, atol=1e-15)
    rms = DetachableRMSNorm(np.int64(4)).double()
    torch.testing.assert_close(rms(x), torch.nn.RMSNorm(4, eps=1e-6, dtype=torch.float64)(x), rtol=0, atol=1e-15)
    conv = BcosConv2d(np.int64(2), np.int64(3), np.int64(3), stride=np.int64(1), padding=(np.int64(1), 0))
    plain = BcosConv2d(2, 3, 3, stride=1, padding=(1, 0))
    plain.load_state_dict(conv.state_dict())
    image = torch.randn(1, 2, 5, 5)
    torch.testing.assert_close(conv(image), plain(image), rtol=0, atol=0)
    for wrong in (4.0, "4", 0, ()):
        with pytest.raises(BcosTypeError, match=r"^normalized_shape: must be a positive int"):
            BcosLayerNorm(wrong)
