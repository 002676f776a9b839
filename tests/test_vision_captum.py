"""The Captum adapter's BcosAttribution on the B-cos ViT: same exact map as explain_image, complete."""

from __future__ import annotations

import pytest
import torch
from bcos_plugins.adapters.captum import BcosAttribution
from captum.attr import NoiseTunnel
from test_vision import PRIORS, images, tiny_vit

from bcos_plugins.vision import explain_image


@pytest.mark.parametrize("prior", PRIORS)
def test_bcos_attribution_on_the_encoded_input_matches_explain_image(prior):
    model = tiny_vit("conv", prior)
    x = images(batch=3)
    target = torch.tensor([0, 2, 1])
    encoded = model.encode(x)
    method = BcosAttribution(lambda e: model(encoded_pixel_values=e).logits, model=model)
    attributions, delta = method.attribute(encoded, target=target, return_convergence_delta=True)
    ours = explain_image(model, x, target=target)
    torch.testing.assert_close(attributions, ours.input_contributions, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(attributions.sum((1, 2, 3)), ours.logits, rtol=1e-10, atol=1e-12)
    assert delta.abs().max() < 1e-10
    torch.testing.assert_close(delta, ours.delta, rtol=0, atol=1e-12)
    # Captum style: a plain function, no model= (the thread-wide explanation mode finds the B-cos modules)
    plain = BcosAttribution(lambda e: model(encoded_pixel_values=e).logits).attribute(encoded, target=target)
    torch.testing.assert_close(plain, attributions, rtol=0, atol=0)


def test_noise_tunnel_over_the_vit_stays_complete():
    model = tiny_vit("conv", PRIORS[0])
    encoded = model.encode(images(batch=2))
    method = NoiseTunnel(BcosAttribution(lambda e: model(encoded_pixel_values=e).logits))
    torch.manual_seed(0)
    smooth, deltas = method.attribute(encoded, nt_samples=3, stdevs=0.01, target=1, return_convergence_delta=True)
    assert smooth.shape == encoded.shape and deltas.shape == (6,)
    assert deltas.abs().max() < 1e-10
