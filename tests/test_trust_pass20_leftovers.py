"""Trust pass 20, leftovers of the adapters pass (helper-109's notes), each pinned here:

1. bcos_plugins.bilinear on a TransformerLens bilinear MLP fed ``blocks.L.ln2.hook_normalized`` (recorded before ln2
   multiplies by its weight and adds a LayerNorm's bias): ``bilinear_weights(mlp, input_norm=ln2)`` folds the norm
   in, the same mechanism ``BilinearSAEInteractions(input_norm=)`` uses.
2. ``SAEErrorShare.error_fraction`` of a row whose explained value is exactly 0: NaN, not a share over a 1e-12 floor.
3. inseq's ``attribute(..., step_scores=["deltas"])`` on a model loaded with "bcos": the completeness deltas the
   method always stores, not inseq's "register a step function" error.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from bcos_plugins.adapters.sae_lens import SAEErrorShare, sae_error_share
from test_sae_lens_adapter import _bcos_sae_model

# ------------------------------------------------------------------------------- 2. error_fraction of a zero logit


def test_error_fraction_is_nan_where_the_explained_value_is_exactly_zero_and_exact_elsewhere():
    """A 1e-12 floor divided a rounding-sized error share of a zero logit into a fraction of 1e5 (and a zero share
    into 0, "the SAEs reconstruct everything", for a logit that is 0 whatever they do)."""
    explained = torch.tensor([2.0, 0.0, -4.0])
    share = SAEErrorShare(explanation=SimpleNamespace(explained=explained),
                          error_shares={"a": torch.tensor([0.5, 1e-7, 1.0]), "b": torch.tensor([0.5, 0.0, 1.0])})
    fraction = share.error_fraction
    assert torch.isnan(fraction[1])
    torch.testing.assert_close(fraction[[0, 2]], torch.tensor([0.5, -0.5]), rtol=0, atol=0)


def test_error_fraction_through_sae_error_share_with_one_row_explaining_a_zero_logit():
    model = _bcos_sae_model(True)
    with torch.no_grad():  # token 5's unembedding column is zero: its logit is exactly 0 on every input
        model.unembed.W_U[:, 5] = 0
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    result = sae_error_share(model, tokens, target=torch.tensor([4, 5, 4]))
    explained = result.explanation.explained
    assert explained[1] == 0 and bool((explained[[0, 2]] != 0).all())
    fraction = result.error_fraction
    assert torch.isnan(fraction[1])  # it read 0.0, as if the SAEs reconstructed what the model needs
    torch.testing.assert_close(fraction[[0, 2]], result.error_share[[0, 2]] / explained[[0, 2]], rtol=0, atol=0)
    assert bool(torch.isfinite(fraction[[0, 2]]).all())


# ------------------------------------------------------------------------------- 3. inseq step_scores=["deltas"]


def test_inseq_step_scores_deltas_on_a_bcos_model_returns_the_stored_completeness_deltas():
    """inseq looked "deltas" up in its step-function registry and failed ("Step score deltas not found ... register a
    custom step score"), although "bcos" stores them at every step."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    import pytest
    import transformers as T
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    kwargs = {"generation_args": {"max_new_tokens": 2, "do_sample": False}, "show_progress": False}
    plain = attribution_model.attribute("The cat sat", **kwargs).sequence_attributions[0]
    asked = attribution_model.attribute("The cat sat", step_scores=["logit", "deltas"], **kwargs)
    seq = asked.sequence_attributions[0]
    assert set(seq.step_scores) == {"logit", "deltas"}
    torch.testing.assert_close(seq.step_scores["deltas"], plain.step_scores["deltas"], rtol=0, atol=0)
    # they are the completeness gap: the column sums minus the attributed logits
    total = seq.target_attributions.nan_to_num().sum((0, 2))
    torch.testing.assert_close(total - seq.step_scores["logit"], seq.step_scores["deltas"].to(total.dtype),
                               rtol=0, atol=1e-5)
    alone = attribution_model.attribute("The cat sat", step_scores=["deltas"], **kwargs).sequence_attributions[0]
    torch.testing.assert_close(alone.step_scores["deltas"], plain.step_scores["deltas"], rtol=0, atol=0)
    # another method on the same model keeps inseq's own answer: it stores no deltas to return
    with pytest.raises(AttributeError, match="Step score deltas not found"):
        attribution_model.attribute("The cat sat", method="saliency", step_scores=["deltas"], **kwargs)
