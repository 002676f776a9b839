"""Every registry architecture's main paths on one device agree with a float64 CPU reference of the same model.

The device is ``BCOS_TEST_DEVICE`` (default ``cpu``, what CI runs); ``BCOS_TEST_DEVICE=cuda pytest
tests/test_device_paths.py`` runs the same checks on a GPU, where a tensor the package creates on the CPU inside a
path, or a kernel that computes differently there, shows up. For each class of the registry (the tiny configs of
tests/test_conformance.py, B = 1.25), the model on the device (float32) against a float64 copy of it on the CPU:

- ``explain`` (the target at the model's own largest output, and a target/foil contrast), on the padding side the
  class accepts: complete to 1e-4 relative, token contributions equal to the reference's within float32 rounding;
- the same under ``torch.autocast(device, bfloat16)``: ``explain``'s own completeness check passes and the token
  contributions stay within bfloat16's reach of the reference (half a per cent of the largest contribution, 10 %
  of the explained value: a misplaced or missing term moves them by the term's size);
- Captum's ``LayerBcos`` (classifiers and causal LMs) equal to ``explain`` on the device;
- ``metrics.perturbation_curves`` (attention masking; Gemma 2: mask tokens) equal to the reference's curves.

On the CPU the checks compare float32 with float64 arithmetic, and found that Gemma 2's B-cos RMSNorm narrowed
float64 inputs to float32 (``explain`` refused every float64 Gemma 2 explanation as incomplete).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from test_conformance import NAMES, RTOL, _batch, _last_real, _padding_side, _stock

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution.text import rows_as_alone_call
from bcos_plugins.convert.architectures import SPECS

B = 1.25
DEVICE = torch.device(os.environ.get("BCOS_TEST_DEVICE", "cpu"))


def test_the_requested_device_is_there():
    """A run asked for a device that is missing fails here instead of testing the CPU under the device's name."""
    torch.empty(1, device=DEVICE)


_PAIRS: dict[str, tuple[torch.nn.Module, torch.nn.Module]] = {}


def _pair(name: str):
    """(the B-cos model on DEVICE in float32, a float64 copy on the CPU), built once per session."""
    if name not in _PAIRS:
        model = bcosify(_stock(name), b=B, verbose=False)
        _PAIRS[name] = (copy.deepcopy(model).to(DEVICE), model.double())
    return _PAIRS[name]


def _side(name: str) -> str:
    """The padded side a check runs on: :func:`test_conformance._padding_side`'s (left for decoders), except Gemma 2,
    whose stock eager attention (transformers 5) gives NaN in float64 where a query sees only padding keys (on either
    side, past its sliding window), and the NaN reaches the real tokens: unpadded rows there (``explain`` refuses the
    NaN; float32 is unaffected and tests/test_conformance.py pads Gemma 2 on both sides)."""
    return "none" if name.startswith("Gemma2") else _padding_side(name)


def _targets(name: str, reference, ids, mask) -> dict:
    """explain's keyword arguments for one explanation far from 0: the largest output at the default position
    (a masked LM, which has none, is given the first real token)."""
    spec = SPECS[name]
    with torch.no_grad():
        out = reference(**rows_as_alone_call(reference, ids, mask))
    values = out.logits if hasattr(out, "logits") else out.last_hidden_state
    rows = torch.arange(ids.shape[0])
    if not spec.is_classifier:
        values = values[rows, _last_real(mask) if spec.kind == "decoder" else mask.argmax(1)]
    return {"target": values.abs().argmax(-1), **_position(name, mask)}


def _position(name: str, mask) -> dict:
    return {"position": mask.argmax(1)} if SPECS[name].head == "masked_lm" else {}


def _reference_explanation(name: str, seed: int):
    """(the device model, ids, mask, explain's keyword arguments, the float64 reference's explanation) on a batch of
    ``seed``."""
    model, reference = _pair(name)
    ids, mask = _batch(_side(name), seed=seed)
    given = _targets(name, reference, ids, mask)
    return model, ids, mask, given, explain(reference, ids, mask, **given)


def _on(device, kwargs: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _close_to(actual: torch.Tensor, expected: torch.Tensor, share: float, what: str) -> None:
    """``actual`` (any device and dtype) within ``share`` of ``expected``'s largest magnitude, element-wise."""
    actual = actual.detach().to("cpu", torch.float64)
    scale = expected.abs().max().item()
    worst = (actual - expected).abs().max().item()
    assert worst <= share * scale, f"{what}: off by {worst:.3g}, {worst / scale:.3g} of the largest ({scale:.3g})"


@pytest.mark.parametrize("name", NAMES)
def test_explain_on_the_device_equals_the_float64_reference(name):
    model, ids, mask, given, expected = _reference_explanation(name, seed=11)
    actual = explain(model, ids.to(DEVICE), mask.to(DEVICE), **_on(DEVICE, given))
    assert actual.contributions.device.type == DEVICE.type
    assert (actual.completeness_error.cpu() <= RTOL).all()
    _close_to(actual.explained, expected.explained, 1e-5, "explained value")
    _close_to(actual.contributions, expected.contributions, 1e-4, "token contributions")

    foil = {"foil": (given["target"] + 1) % 3}
    contrast_expected = explain(_pair(name)[1], ids, mask, **given, **foil)
    contrast = explain(model, ids.to(DEVICE), mask.to(DEVICE), **_on(DEVICE, {**given, **foil}))
    assert (contrast.completeness_error.cpu() <= RTOL).all()
    _close_to(contrast.contributions, contrast_expected.contributions, 1e-4, "contrastive token contributions")


@pytest.mark.parametrize("name", NAMES)
def test_explain_under_bfloat16_autocast_on_the_device_stays_near_the_reference(name):
    model, ids, mask, given, expected = _reference_explanation(name, seed=12)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        actual = explain(model, ids.to(DEVICE), mask.to(DEVICE), **_on(DEVICE, given))  # its own check passes
    assert torch.isfinite(actual.contributions).all()
    _close_to(actual.contributions, expected.contributions, 0.1, "bfloat16 token contributions")
    err = (actual.contributions.detach().cpu().double().sum(-1) - expected.explained).abs()
    assert (err <= 0.1 * expected.explained.abs()).all(), f"bfloat16 totals off by {err.tolist()}"


# the classes Captum's wrappers take without a position (tests/test_conformance.py has the others' refusals)
CAPTUM_NAMES = [n for n in NAMES if SPECS[n].is_classifier or SPECS[n].head == "causal_lm"]


@pytest.mark.parametrize("name", CAPTUM_NAMES)
def test_captum_layer_bcos_on_the_device_equals_explain(name):
    from bcos_plugins.adapters.captum import LayerBcos

    model, reference = _pair(name)
    ids, mask = _batch(_side(name), seed=13)
    given = _targets(name, reference, ids, mask)
    ids, mask, target = ids.to(DEVICE), mask.to(DEVICE), given["target"].to(DEVICE)
    expected = explain(model, ids, mask, target=target)
    attr, delta = LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask,),
                                             return_convergence_delta=True)
    assert attr.device.type == DEVICE.type
    torch.testing.assert_close(attr, expected.input_contributions, rtol=1e-5, atol=1e-6)
    assert (delta.abs() <= RTOL * expected.explained.abs()).all()


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].is_classifier])
def test_perturbation_curves_on_the_device_equal_the_reference(name):
    from bcos_plugins.metrics import perturbation_curves

    model, ids, mask, given, scores = _reference_explanation(name, seed=14)
    reference = _pair(name)[1]
    special = torch.zeros_like(mask, dtype=torch.bool)  # the tiny vocabulary has no special token in the batch
    # Gemma 2's stock float64 attention gives NaN to a query whose keys are all masked (see _side): tokens replaced
    masking = {"masking": "mask_token", "mask_token_id": 3} if name.startswith("Gemma2") else {}
    expected = perturbation_curves(reference, ids, mask, scores.contributions, special_tokens=special,
                                   target=given["target"], **masking)
    actual = perturbation_curves(model, ids.to(DEVICE), mask.to(DEVICE), scores.contributions.float().to(DEVICE),
                                 special_tokens=special.to(DEVICE), target=given["target"].to(DEVICE), **masking)
    for key in ("comprehensiveness", "sufficiency"):
        _close_to(torch.as_tensor(getattr(actual, key)), torch.as_tensor(getattr(expected, key)).double(), 1e-5, key)


@pytest.mark.parametrize("prior", ["none", "additive", "multiplicative"])
def test_a_bcos_vit_explained_on_the_device_equals_the_float64_reference(prior):
    """``explain_image`` and ``metrics.pixel_perturbation`` of a B-cos ViT (conv tokeniser, position embedding) on
    the device against the same model in float64 on the CPU."""
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image

    torch.manual_seed(0)
    reference = BcosViT(BcosViTConfig(image_size=8, num_channels=3, patch_size=4, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=32, num_labels=4, tokenizer="conv",
                                      conv_channels=[4], attention_prior=prior, position_embedding=True, b=2.0,
                                      max_out=2, logit_scale=5.0)).double().eval()
    with torch.no_grad():  # priors and the position table start at 0: random values make them matter
        for block in reference.blocks:
            if block.attention.prior is not None:
                block.attention.prior.normal_(0, 2.0)
        reference.position_embedding.normal_(0, 1.0)
    model = copy.deepcopy(reference).float().to(DEVICE)
    pixels = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected = explain_image(reference, pixels)
    actual = explain_image(model, pixels.float().to(DEVICE))
    assert actual.contributions.device.type == DEVICE.type
    assert torch.equal(actual.target.cpu(), expected.target.cpu())
    # the position embedding's share is outside the pixels (ImageExplanation): pixels and share make the logit
    total = actual.contributions.sum((1, 2)) + actual.position_contributions
    assert ((total - actual.explained).abs() <= RTOL * actual.explained.abs()).all()
    _close_to(actual.contributions, expected.contributions, 1e-4, "pixel contributions")
    _close_to(actual.position_contributions, expected.position_contributions, 1e-4, "position share")
    curves = {}
    for name, net, x, scores in (("reference", reference, pixels, expected.contributions),
                                 ("device", model, pixels.float().to(DEVICE), actual.contributions)):
        curves[name] = pixel_perturbation(lambda images, net=net: net(images).logits, x, scores,
                                          expected.target.to(x.device))
    for key in ("most_first", "least_first"):
        _close_to(torch.as_tensor(getattr(curves["device"], key)),
                  torch.as_tensor(getattr(curves["reference"], key)).double(), 1e-4, key)


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].is_classifier])
def test_a_training_step_on_the_device_has_the_float64_references_gradients(name):
    """``bcos_loss`` and its backward pass through the fused training layers (dropout off, so the two runs compute
    the same function): every parameter's gradient on the device within float32 rounding of the reference's, and
    finite and near it under bfloat16 autocast."""
    from bcos_plugins import bcos_loss

    model, reference = _pair(name)
    ids, mask = _batch(_side(name), seed=15)
    labels = torch.tensor([0, 2, 1])

    def gradients(net, device, autocast=False):
        net.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            out = net(**rows_as_alone_call(net, ids.to(device), mask.to(device)))
            loss = bcos_loss(out, labels.to(device))
        loss.backward()
        return {n: p.grad.detach().cpu().double() for n, p in net.named_parameters() if p.grad is not None}

    expected = gradients(reference, "cpu")
    # bfloat16: dyn = |cos| ** (B - 1) is steep near cos = 0, so the forward's bfloat16 rounding moves the gradient of
    # units with |cos| near 0 (docs/benchmarks.md#bf16-gradients), up to 16 % of a weight's largest gradient (Qwen3 on
    # the CPU; the step-by-step reference path 14 %; the stock model at initialisation, nearly linear in its
    # activations, 1.6 %): 0.3 still fails a lost or misplaced term, which is the size of the gradient itself
    for autocast, share in ((False, 1e-4), (True, 0.3)):
        actual = gradients(model, DEVICE, autocast)
        assert actual.keys() == expected.keys()
        for param, grad in expected.items():
            assert torch.isfinite(actual[param]).all(), param
            if grad.abs().max() > 0:
                _close_to(actual[param], grad, share, f"gradient of {param} (autocast {autocast})")
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
