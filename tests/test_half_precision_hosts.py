"""Half-precision models under the host-facing entry points that check their own completeness (TransformerLens'
token x component decomposition, the Space head): the tolerance is the package's one rule (sqrt(eps) of the dtype
the forward ran in, :func:`bcos_plugins.explain.completeness_tolerance`), so a term the numbers miss is refused in
bfloat16 as in float32, and a healthy half-precision model passes quietly."""

from __future__ import annotations

import warnings

import pytest
import torch

from bcos_plugins import BcosError

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_half_precision_token_component_table_missing_half_the_logit_is_refused(dtype):
    """token_component_decomposition allowed 100 eps of the model's dtype before refusing terms no token carries:
    0.78 of |explained| + sum |table| in bfloat16, so a bfloat16 table holding half of the logit (a term added
    beside every token, as a bias is) came back without a word, where float32 and float16 refused it. It now
    allows the dtype's rounding as explain does (sqrt(eps)); the healthy model's table still passes."""
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition
    from test_transformer_lens_adapter import LLAMA_LIKE, tiny_bcos, tokens

    model = tiny_bcos(LLAMA_LIKE).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # healthy: no refusal, no warning
        healthy = token_component_decomposition(model, tokens(), target=5, foil=7)
    row = int(healthy.explained.abs().argmax())
    untracked = float(healthy.explained[row])  # the table then holds half of this row's logit difference

    def add_a_term_no_token_carries(module, args, logits):
        return logits + untracked * torch.nn.functional.one_hot(torch.tensor(5), logits.shape[-1]).to(logits)

    handle = model.unembed.register_forward_hook(add_a_term_no_token_carries)
    try:
        with pytest.raises(BcosError, match=r"model: the token x component table sums to .* the model adds terms "
                                            r"that no input token carries"):
            token_component_decomposition(model, tokens(), target=5, foil=7)
    finally:
        handle.remove()
