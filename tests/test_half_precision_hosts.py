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
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # healthy: no refusal, no warning ...
        healthy = token_component_decomposition(model, tokens(), target=5, foil=7)
    # ... but, in bfloat16, the one saying that rows whose entries cancel 8-11x cannot be verified to half their
    # value (tests/test_trust_pass4.py); none in float16 and float32
    expected = ["token_component_decomposition: the table of row(s) [0, 1] sums to the explained value only as far as "
                "torch.bfloat16 rounding can tell"] if dtype == torch.bfloat16 else []
    assert [str(w.message)[:len(expected[0])] if expected else str(w.message) for w in seen] == expected
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_space_models_shares_missing_a_term_are_refused_and_half_precision_rounding_passes(dtype):
    """context_attribution checked nothing: a term beside the head's classifier (here a forward hook, as an adapter
    on head.classifier adds one) entered the logit but no share, and the shares came back as the logit's. It now
    refuses shares that miss the logit beyond explain's allowance (sqrt(eps) of the dtype). A healthy bfloat16 Space
    model passes quietly although a row's completeness_error is 0.25: that row's logit (0.007) is the difference of
    shares 500 times larger, and the gap is bfloat16 rounding of an exact computation, not a lost term: the shares of
    the model's own concepts in float64 give the float64 logit of those concepts to 1e-12."""
    from conftest import padded_batch
    from test_space import space_model

    from bcos_plugins.space import context_attribution

    model = space_model(n_latent=16).to(dtype)
    ids, mask = padded_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        healthy = context_attribution(model, ids, mask)
    if dtype == torch.bfloat16:
        assert healthy.completeness_error.max() > 0.1  # honest: the bfloat16 logit near 0 is that uncertain
    concepts = model(input_ids=ids, attention_mask=mask).concepts.double()
    weights = mask.double() / mask.double().sum(1, keepdim=True)
    logits = torch.einsum("bpkl,bp->bkl", concepts, weights).flatten(1) @ model.head.classifier.weight.double().T
    rows = torch.arange(len(ids))
    exact_shares = model.head.token_contributions(concepts, mask)[rows, :, healthy.target]
    torch.testing.assert_close(exact_shares.sum((1, 2, 3)), logits[rows, healthy.target], rtol=0, atol=1e-12)

    untracked = float(healthy.explained.abs().max())

    def add_a_term_no_share_carries(module, args, output):
        return output + untracked

    handle = model.head.classifier.register_forward_hook(add_a_term_no_share_carries)
    try:
        with pytest.raises(BcosError, match=r"context_attribution: the token shares of row \d+ sum to .* are not the "
                                            r"head's linear classifier .*merge an adapter"):
            context_attribution(model, ids, mask)
    finally:
        handle.remove()
