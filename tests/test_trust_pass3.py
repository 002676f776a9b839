"""Third trust pass: the cases the second pass left alone (half-precision token scores, NaN gradients at padding,
batch-dependent tie breaking in pixel rankings, Captum on a compiled model, the row-id message), and a hunt for
silently wrong numbers with unusual inputs on public entry points. Tiny random models; each check is against a number
computed another way.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import padded_rows
from test_trust_pass2 import _bcos_llama

from bcos_plugins import explain

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ half-precision token scores


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_models_token_scores_are_reduced_in_float32(dtype, reduce):
    """explain summed a float16 / bfloat16 model's contributions over d_model in the model's dtype: each token's score
    kept 3 significant digits (off by up to 3e-3 of itself in bfloat16, 4e-4 in float16, tiny B-cos Llama) while
    Explanation.total, summed in float32, looked right. The token scores are now reduced in float32 and equal the
    float64 reduction of the same half-precision contributions."""
    model = copy.deepcopy(_bcos_llama()).to(dtype)
    ids, mask = padded_rows([30, 17, 5], 30, "left", seed=2)
    expl = explain(model, ids, mask, target=5, position=-1, reduce=reduce)
    assert expl.input_contributions.dtype == dtype
    assert expl.contributions.dtype == torch.float32
    exact = getattr(expl.input_contributions.double(), reduce)(-1)
    torch.testing.assert_close(expl.contributions.double(), exact, rtol=1e-6, atol=1e-9)
    if reduce == "sum":  # the token scores add up to the total, which is summed in float32 too
        torch.testing.assert_close(expl.contributions.double().sum(-1), expl.total.double(), rtol=1e-6, atol=1e-7)


def test_float64_token_scores_stay_float64():
    model = copy.deepcopy(_bcos_llama()).double()
    ids, mask = padded_rows([9, 4], 9, "left", seed=1)
    expl = explain(model, ids, mask, target=5, position=-1)
    assert expl.contributions.dtype == torch.float64
    torch.testing.assert_close(expl.contributions, expl.input_contributions.sum(-1), rtol=0, atol=0)


# ------------------------------------------------------------------ a NaN gradient at padding


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_nan_gradient_at_padding_only_is_refused(side):
    """explain's completeness check tests the gradients' finiteness only where delta is not finite. The
    contributions are taken at every position, padding included, and delta sums all of them, so a NaN gradient at a
    padding position alone (here put there by a hook on the first layer's input gradient) makes that row's delta NaN
    and is refused, naming the cause: no returned number carries it silently."""
    from bcos_plugins.errors import BcosValueError

    model = _bcos_llama()
    ids, mask = padded_rows([9, 5], 9, side, seed=2)
    padding = (mask == 0)[..., None]

    def nan_at_padding(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: grad.masked_fill(padding, float("nan")))

    handle = model.model.layers[0].register_forward_pre_hook(nan_at_padding, with_kwargs=True)
    try:
        with pytest.raises(BcosValueError, match="gradient at the attribution point is NaN or infinite"):
            explain(model, ids, mask, target=5, position=-1)
    finally:
        handle.remove()
    explain(model, ids, mask, target=5, position=-1)  # the same call without the hook is fine
