"""Leftovers of trust pass 23's Captum / inseq and newcomer-path areas (helpers 161 and 158), decided and fixed in the
modules that own them (session 24, helper-167). One test per decision; each failed before its fix (the signature test
of 4 pins a decision not to change code)."""

from __future__ import annotations

import copy
import inspect
import warnings

import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
import inseq
import pytest
import torch
import transformers as T
from conftest import padded_rows, tiny_config
from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def gpt2_lm(gpt2_tokenizer):
    return _tiny_lm("gpt2", len(gpt2_tokenizer))


@pytest.fixture(scope="module")
def attributed(gpt2_lm, gpt2_tokenizer):
    """One "bcos" attribution of a prompt of 5 tokens and 3 generated ones, with its logit step score."""
    attribution_model = inseq.load_model(gpt2_lm, "bcos", tokenizer=gpt2_tokenizer)
    return attribution_model.attribute("The cat sat on the", generation_args={"max_new_tokens": 3, "do_sample": False},
                                       step_scores=["logit", "probability"], show_progress=False)


def _column_totals(scores: torch.Tensor) -> torch.Tensor:
    """Each generated token's column summed over the prefix tokens (and d_model where not aggregated yet)."""
    return torch.nansum(scores.double(), dim=tuple(d for d in range(scores.ndim) if d != 1))


# ------------------------------------------------------------------ 1. inseq: step score deltas after a transform


@pytest.mark.parametrize("aggregated_first", [False, True])
def test_inseq_slices_restate_deltas_for_the_tokens_they_keep(attributed, aggregated_first):
    """``aggregate("slices", target_spans=(1, 3))`` keeps two of the prompt's five tokens (and the generated ones):
    the columns then summed to 0.14 of a 0.45 logit while ``deltas`` still said -1e-7, a completeness claim the sliced
    columns did not meet, silently. Now ``deltas`` is restated for what the slice keeps: sum(contributions) - logit,
    the left-out tokens' share included; the output sliced from is unchanged."""
    source = attributed.aggregate() if aggregated_first else attributed
    before = copy.deepcopy(source.sequence_attributions[0].step_scores["deltas"])
    seq = source.aggregate("slices", target_spans=(1, 3)).sequence_attributions[0]
    full = source.sequence_attributions[0]
    logits = full.step_scores["logit"].double()
    assert seq.target_attributions.shape[0] == 5  # tokens 1, 2 and the three generated ones' rows
    totals = _column_totals(seq.target_attributions)
    assert (logits - totals).abs().min() > 0.1  # the slice leaves a share of every column out
    torch.testing.assert_close(totals - seq.step_scores["deltas"].double(), logits, rtol=1e-5, atol=1e-5)
    # the restated gap is the left-out tokens' share (plus the tiny completeness error the full columns had)
    left_out = _column_totals(full.target_attributions) - totals
    torch.testing.assert_close(seq.step_scores["deltas"].double(), before.double() - left_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full.step_scores["deltas"], before, rtol=0, atol=0)  # the source keeps its own


def test_inseq_weight_attributions_drops_the_deltas_it_would_leave_stale(attributed):
    """``weight_attributions("probability")`` multiplies each column by its probability (columns then summing to
    1e-5) and left ``deltas`` at 1e-7 of the logit: dropped now, with a warning saying why."""
    weighted = copy.deepcopy(attributed)
    with pytest.warns(UserWarning, match=r"weight_attributions\('probability'\) multiplied each column by its step "
                                         r"score 'probability'.*'deltas' .* was dropped rather than left stale"):
        weighted.weight_attributions("probability")
    seq, before = weighted.sequence_attributions[0], attributed.sequence_attributions[0]
    assert "deltas" not in seq.step_scores and "deltas" in before.step_scores
    torch.testing.assert_close(seq.step_scores["logit"], before.step_scores["logit"], rtol=0, atol=0)
    # inseq's weighting itself is unchanged: each column is its probability times the aggregated column
    expected = _column_totals(before.aggregate().target_attributions) * before.step_scores["probability"].double()
    torch.testing.assert_close(_column_totals(seq.target_attributions), expected, rtol=1e-5, atol=1e-9)


# ------------------------------------------------------------------ 2. inseq: "sum" of an aggregated output


def test_inseq_sum_of_an_already_aggregated_output_is_a_no_op_and_other_reductions_are_named(attributed):
    """``out.aggregate().aggregate("sum")`` failed with inseq's bare ``IndexError: tuple index out of range``. The sum
    over d_model is already taken, so asking for it again gives the token scores as they are (as ``aggregate()``
    does); another reduction of token scores (normalised, or a pipeline around it) is refused by name."""
    aggregated = attributed.aggregate()
    scores = aggregated.sequence_attributions[0].target_attributions
    assert scores.ndim == 2
    for aggregator in ("sum", "scores", ["sum"]):
        again = aggregated.aggregate(aggregator).sequence_attributions[0].target_attributions
        torch.testing.assert_close(again, scores, rtol=0, atol=0, equal_nan=True)
    assert isinstance(aggregated.show(aggregator="sum", display=False, return_html=True), str)
    for aggregator, kwargs in (("sum", {"normalize": True}), ("absmax", {}), (["spans", "scores"], {})):
        with pytest.raises(BcosValueError, match=r"^aggregator: asks to reduce the embedding dimension of an output "
                                                 r"already aggregated to token level \(scores of shape \(8, 3\)"):
            aggregated.aggregate(aggregator, **kwargs)


# ------------------------------------------------------------------ 3. a tokenizer where the model goes, and back


def test_a_tokenizer_where_the_model_goes_is_named_as_the_swap_by_every_host_entry_point(gpt2_lm, gpt2_tokenizer):
    from bcos_plugins.adapters.captum import EmbeddingForward
    from bcos_plugins.adapters.inseq import load_classifier
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf, transformer_bridge_from_hf

    torch.manual_seed(0)
    classifier = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), b=1.1,
                         verbose=False)
    swap = r"is a tokenizer \(GPT2Tokenizer\), not a model: the arguments may be swapped"
    for name, call in (("model", lambda: EmbeddingForward(gpt2_tokenizer)),
                       ("model", lambda: load_classifier(gpt2_tokenizer, classifier)),
                       ("hf_model", lambda: transformer_bridge_from_hf(gpt2_tokenizer, tokenizer=gpt2_lm)),
                       ("hf_model", lambda: hooked_transformer_from_hf(gpt2_tokenizer, tokenizer=gpt2_lm))):
        with pytest.raises(BcosTypeError, match=rf"^{name}: {swap}"):
            call()
    # the reverse (the model where the tokenizer goes) names each call's own order, not explain_dataset's
    for call, order in ((lambda: load_classifier(classifier, classifier), r"load_classifier\(model, tokenizer\)"),
                        (lambda: transformer_bridge_from_hf(gpt2_lm, tokenizer=gpt2_lm),
                         r"transformer_bridge_from_hf\(model, tokenizer=tokenizer\)"),
                        (lambda: hooked_transformer_from_hf(gpt2_lm, tokenizer=gpt2_lm),
                         r"hooked_transformer_from_hf\(model, tokenizer=tokenizer\)")):
        with pytest.raises(BcosTypeError, match=rf"^tokenizer: expected a transformers tokenizer, got a model .* "
                                                rf"swapped\. Pass the model first and its tokenizer second, e\.g\. "
                                                rf"{order}\.$"):
            call()


# ------------------------------------------------------------------ 4. misspelt keywords of closed signatures


def test_closed_signatures_keep_pythons_own_refusal_of_a_misspelt_keyword():
    """Decision: ``explain_dataset``, ``bcosify`` and ``explain_image`` take no ``**kwargs``, so Python's TypeError
    already names the misspelt keyword (and type checkers flag it before the call runs, which a ``**kwargs`` that
    only refused would hide); no "did you mean" layer is added to them. Pinned: the signatures stay closed."""
    from bcos_plugins import explain_dataset
    from bcos_plugins.vision import explain_image

    for function, wrong in ((explain_dataset, "targets"), (explain_dataset, "label_column"), (bcosify, "B"),
                            (explain_image, "targets")):
        kinds = {p.kind for p in inspect.signature(function).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, function.__name__
        assert wrong not in inspect.signature(function).parameters
        with pytest.raises(TypeError, match=rf"got an unexpected keyword argument '{wrong}'"):
            function(None, None, None, **{wrong: 1}) if function is explain_dataset else function(None, **{wrong: 1})


# ------------------------------------------------------------------ 5. foil = target


def test_explain_warns_naming_the_rows_whose_foil_is_their_target():
    """``explain(..., foil=target)`` explains target - foil = 0: every contribution 0, exact but almost always a slip,
    returned without a word. Now a warning names the rows (and the ids); rows with another foil are explained as
    before, and a foil that is never the target warns nothing."""
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=3)).eval(), b=1.1, verbose=False)
    ids, mask = padded_rows([7, 5, 6], 8, "right", seed=0)
    with pytest.warns(UserWarning, match=r"^foil: equals target in rows \[0, 2\] \(output ids 0, 1\), so the "
                                         r"explained value target - foil is 0 there") as caught:
        e = explain(model, ids, mask, target=[1, 2, 0], foil=[1, 0, 0])
    assert [w.filename for w in caught if "foil: equals" in str(w.message)] == [__file__]  # the caller's line
    assert e.contributions[[0, 2]].abs().max() == 0 and e.contributions[1].abs().max() > 0
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    predicted = int(logits[0].argmax())
    with pytest.warns(UserWarning, match=r"^foil: equals the predicted output \(target was left out\) in row"):
        explain(model, ids[:1], mask[:1], foil=predicted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explain(model, ids, mask, target=[1, 2, 0], foil=[0, 0, 1])
