"""Note 23 leftovers, session 24 (helper-173): inseq deltas after a reduction other than the sum, TransformerLens
weight-processing keywords, the near-zero-logit refusal's fix, held norms' plain-tensor weights. Each test fails
before its fix."""

from __future__ import annotations

import copy
import warnings

import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
import inseq
import pytest
import torch
import transformers as T
from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="module")
def attributed():
    """One "bcos" attribution of a prompt of 5 tokens and 3 generated ones, with its logit step score."""
    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    return attribution_model.attribute("The cat sat on the", generation_args={"max_new_tokens": 3, "do_sample": False},
                                       step_scores=["logit"], show_progress=False)


# ------------------------------------------------------------------ 1. inseq: deltas after a reduction not the sum


@pytest.mark.parametrize(("aggregator", "kwargs", "how"), [
    ("vnorm", {}, r"with 'vnorm' instead of the signed sum"),
    ("absmax", {}, r"with 'absmax' instead of the signed sum"),
    ("scores", {"aggregate_fn": "vnorm"}, r"with 'scores' \('vnorm'\) instead of the signed sum"),
    (None, {"normalize": True}, r"as a normalised or rescaled sum"),
    ("sum", {"normalize": True}, r"as a normalised or rescaled sum"),
    (["spans", "vnorm"], {"target_spans": (1, 3)}, r"with 'vnorm' instead of the signed sum"),
])
def test_inseq_reductions_other_than_the_sum_drop_the_deltas_they_would_leave_stale(attributed, aggregator, kwargs,
                                                                                    how):
    """``aggregate("vnorm")``, ``"absmax"`` or ``normalize=True`` turn each column into norms, maxima or shares (a
    column summing to 1, or to 3.1 of norms, for a 0.45 logit) and kept ``deltas`` (sum of contributions - logit,
    1e-7), a completeness claim about the signed sum they no longer are, silently. Dropped now, with the one
    warning that weight_attributions gives; the output aggregated from keeps its own."""
    before = copy.deepcopy(attributed.sequence_attributions[0].step_scores["deltas"])
    with pytest.warns(UserWarning, match=rf"^inseq: aggregate\(\) reduced the embedding dimension {how}, so the "
                                         r"token scores no longer sum to the attributed values; the step score "
                                         r"'deltas' .* was dropped rather than left stale\. Check completeness on "
                                         r"aggregate\(\)"):
        seq = attributed.aggregate(aggregator, **kwargs).sequence_attributions[0]
    assert "deltas" not in seq.step_scores and "logit" in seq.step_scores
    torch.testing.assert_close(attributed.sequence_attributions[0].step_scores["deltas"], before, rtol=0, atol=0)


@pytest.mark.parametrize(("aggregator", "kwargs"), [(None, {}), ("sum", {}), ("scores", {}),
                                                    ("scores", {"aggregate_fn": "sum"}), ("signed_sum", {}),
                                                    (["spans", "sum"], {"target_spans": (1, 3)})])
def test_inseq_the_signed_sum_keeps_its_deltas_unwarned(attributed, aggregator, kwargs):
    """The signed, unnormalised sum keeps ``deltas``, which still hold: sum(scores) - logit = deltas."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        seq = attributed.aggregate(aggregator, **kwargs).sequence_attributions[0]
    totals = torch.nansum(seq.target_attributions.double(), dim=0)
    torch.testing.assert_close(totals - seq.step_scores["deltas"].double(), seq.step_scores["logit"].double(),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 2. TransformerLens: weight-processing keywords


@pytest.mark.parametrize("keyword", ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases",
                                     "refactor_factored_attn_matrices"])
def test_hooked_transformer_from_hf_keeps_a_closed_signature_without_weight_processing_keywords(keyword):
    """Decision: ``hooked_transformer_from_hf`` takes no ``**kwargs``, so HookedTransformer.from_pretrained's weight
    processing keywords get Python's own "unexpected keyword argument" naming them, before anything is built (and a
    type checker flags them). Weight processing assumes fixed weights, a B-cos model's are input-dependent, and the
    cache's own decompositions are exact without it (docs/hosts/transformer-lens.md). Pinned: the signature stays
    closed, none of these is a parameter."""
    import inspect

    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    parameters = inspect.signature(hooked_transformer_from_hf).parameters
    assert inspect.Parameter.VAR_KEYWORD not in {p.kind for p in parameters.values()}
    assert keyword not in parameters
    with pytest.raises(TypeError, match=rf"got an unexpected keyword argument '{keyword}'"):
        hooked_transformer_from_hf(None, **{keyword: False})


# ------------------------------------------------------------------ 3. the near-zero-logit refusal names its fix


def test_a_near_zero_float32_logit_is_refused_naming_float64_as_the_fix():
    """A one-token float32 Qwen3 text whose logit is -1.9e-5 (its contributions adding up to 0.42 in absolute value,
    so float32 rounding alone is 0.26 % of the value) is refused as cancelled to noise. Decision: the refusal stays (a
    scale-aware tolerance would let 100 % errors through on near-zero values), but the message named float64 only as
    an alternative to hunting huge embedding rows; it now says rounding of a value this close to 0 may be the cause
    and names the fix that tells the two apart: float64, the inputs unchanged, where the same text is exact."""
    from bcos_plugins import bcosify, explain
    from bcos_plugins.errors import BcosRuntimeError

    torch.manual_seed(0)
    config = T.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, head_dim=8,
                           tie_word_embeddings=False)
    model = bcosify(T.Qwen3ForCausalLM(config).eval(), b=1.1, verbose=False)
    ids, target = torch.tensor([[5]]), 7
    seen = {}
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.setdefault("h", args[0].detach()))
    with torch.no_grad():
        model(ids)
        hook.remove()
        h = seen["h"][0, -1].double()  # the head's input: its row for the target sets the logit to -1.9e-5
        row = model.lm_head.weight[target].double()
        model.lm_head.weight[target] = (row - ((row @ h) + 1.9e-5) / (h @ h) * h).float()
        assert abs(float(model(ids).logits[0, -1, target]) + 1.9e-5) < 1e-7
    with pytest.raises(BcosRuntimeError, match=r"^explain: the contributions of row \[0\] do not sum to the explained "
                                               r"value .*overflowed or cancelled to noise, or the value is so close "
                                               r"to 0 that float32 rounding of the contributions alone \(they add up "
                                               r"to 0\.\d+ in absolute value: .* of the value\) is beyond the "
                                               r"tolerance.*Explain in float64 \(model\.double\(\), the inputs "
                                               r"unchanged\)"):
        explain(model, ids, target=target)
    exact = explain(model.double(), ids, target=target)  # the fix it names: the same text, exact
    assert abs(float(exact.explained[0]) + 1.9e-5) < 1e-7 and float(exact.completeness_error.max()) < 1e-9


# ------------------------------------------------------------------ 4. held norms: one rule for a plain-tensor weight


def _with_a_plain_tensor_weight(module: torch.nn.Module) -> torch.nn.Module:
    weight = module.weight.detach().clone()
    del module.weight
    module.weight = weight  # an attribute, no parameter
    return module


def test_the_norms_refuse_to_hold_a_weight_that_is_no_parameter_as_from_linear_does():
    """``from_layer_norm`` / ``from_rms_norm(..., hold=True)`` silently copied a weight that is a plain tensor (the
    built norm's weight was not the one asked to be held), where ``from_linear(..., hold=True)`` refuses it: one rule
    for all, the refusal. ``hold=False`` copies it as before, and bcosify, which holds only parameters, converts a
    model with such a norm (its weight copied) with the logits unchanged."""
    from bcos_plugins import bcosify
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.nn import BcosLayerNorm, BcosLinear
    from bcos_plugins.nn.norm import DetachableRMSNorm

    refusal = r"^hold: needs a weight parameter to hold, got a Tensor of shape \(6,\)\. Pass hold=False"
    norm = _with_a_plain_tensor_weight(torch.nn.LayerNorm(6))
    with pytest.raises(BcosValueError, match=refusal):
        BcosLayerNorm.from_layer_norm(norm, hold=True)
    copied = BcosLayerNorm.from_layer_norm(norm)
    assert isinstance(copied.weight, torch.nn.Parameter) and torch.equal(copied.weight, norm.weight)
    rms = _with_a_plain_tensor_weight(T.models.llama.modeling_llama.LlamaRMSNorm(6))
    with pytest.raises(BcosValueError, match=refusal):
        DetachableRMSNorm.from_rms_norm(rms, hold=True)
    assert torch.equal(DetachableRMSNorm.from_rms_norm(rms).weight, rms.weight)
    linear = _with_a_plain_tensor_weight(torch.nn.Linear(6, 4))
    with pytest.raises(BcosValueError, match=r"^hold: needs a weight parameter .* got a Tensor of shape \(4, 6\)"):
        BcosLinear.from_linear(linear, b=1.25, hold=True)
    assert BcosLayerNorm.from_layer_norm(torch.nn.LayerNorm(6, elementwise_affine=False), hold=True).weight is None

    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    model = T.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    twin = copy.deepcopy(model)  # its norm keeps the parameter
    _with_a_plain_tensor_weight(model.model.norm)
    converted, held = bcosify(model, b=1.25, verbose=False), bcosify(twin, b=1.25, verbose=False)
    assert isinstance(converted.model.norm, DetachableRMSNorm)
    assert torch.equal(converted.model.norm.weight, held.model.norm.weight)
    ids = torch.tensor([[3, 9, 4]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, held(ids).logits, rtol=0, atol=0)
