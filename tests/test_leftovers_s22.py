"""Closing note 21's leftovers (session 22, helper-115), each pinned here.

- Gated MLPs: ``act(gate(x)) * up(x)`` with the whole activated branch held constant is linear in ``x`` through ``up``
  for any elementwise activation, so bcosify takes tanh, sigmoid, mish and the other parameter-free activations that
  have no ``x * gate(x)`` form there (it refused them); outside a gated MLP they stay refused with their reason.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import transformers as T
from conftest import VOCAB
from test_conformance import _stock

from bcos_plugins import bcosify, explain
from bcos_plugins.convert.architectures import SPECS, UnsupportedModuleError
from bcos_plugins.errors import BcosTypeError

warnings.filterwarnings("ignore", category=DeprecationWarning)

# ------------------------------------------------------------------ 1. gated-MLP activations without a gate kind

# transformers' config names of the activations a gated MLP now takes as they are (their classes are in
# GATE_BRANCH_ACTIVATIONS; no gate kind, so refused outside a gated MLP)
GATE_BRANCH_NAMES = ["hardswish", "laplace", "leaky_relu", "mish", "relu2", "relu6", "sigmoid", "sqrtsoftplus", "tanh"]
# one class per gated family: the causal LMs, and ModernBERT's classifier (its fused Wi)
GATED = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
         "ModernBertForSequenceClassification"]


def _activation_key(name: str) -> str:
    return "hidden_activation" if name.startswith(("Gemma2", "ModernBert")) else "hidden_act"


def _stock_with(name: str, activation: str) -> torch.nn.Module:
    return _stock(name, **{_activation_key(name): activation})  # random non-zero biases where a family has them


def _assert_complete(contributions: torch.Tensor, explained: torch.Tensor, rtol: float) -> None:
    total = contributions.sum(dim=tuple(range(1, contributions.dim())))
    assert torch.isfinite(contributions).all()
    gap = (total - explained).abs()
    assert (gap <= rtol * explained.abs().clamp_min(1e-2)).all(), (gap.tolist(), explained.tolist())


def test_the_gate_branch_classes_are_exactly_those_config_names_build():
    from transformers.activations import ACT2CLS

    from bcos_plugins.convert.bcosify import GATE_BRANCH_ACTIVATIONS

    classes = {(c[0] if isinstance(c, tuple) else c).__name__ for n, c in ACT2CLS.items() if n in GATE_BRANCH_NAMES}
    # ClippedGELU with another clip than gelu_10's, and torch's own Mish, are only put there by hand
    assert classes | {"ClippedGELUActivation", "Mish"} == GATE_BRANCH_ACTIVATIONS


@pytest.mark.parametrize("activation", GATE_BRANCH_NAMES)
@pytest.mark.parametrize("name", GATED)
def test_gated_mlps_take_activations_without_a_gate_kind_and_explain_exactly(name, activation):
    """Refused before ("has no gate kind" / "is 0.5 at x = 0"). The model's values are the stock model's activation's,
    the report names each kept activation and why, and explain and Captum's LayerBcos are complete, to float32 rounding
    (1e-4 relative) and in float64 to 1e-10."""
    from bcos_plugins.adapters.captum import LayerBcos

    model = bcosify(_stock_with(name, activation), b=1.25, verbose=False)
    report = model.bcos_report
    paths = sorted(report.gate_branch_activations)
    branch = "act" if name.startswith("ModernBert") else "act_fn"
    assert paths and all(p.endswith(f"mlp.{branch}") for p in paths)
    assert len(paths) == model.config.num_hidden_layers
    kind = type(model.get_submodule(paths[0])).__name__
    assert all(why.startswith(f"{kind}: the activated gate branch of a gated MLP") for why in
               report.gate_branch_activations.values())
    assert f"{len(paths)} gated-MLP activations kept as they are ({kind})" in report.summary()
    assert not any(p in report.activations for p in paths)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    target = 1 if SPECS[name].is_classifier else 5
    for dtype, rtol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
        model = model.to(dtype)
        expl = explain(model, ids, target=target)
        _assert_complete(expl.input_contributions, expl.explained, rtol)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        own = logits[:, target] if SPECS[name].is_classifier else logits[:, -1, target]
        torch.testing.assert_close(expl.explained, own)
        attributions, delta = LayerBcos(model).attribute(ids, target=target, return_convergence_delta=True)
        _assert_complete(attributions, expl.explained, rtol)
        assert (delta.abs() <= rtol * expl.explained.abs().clamp_min(1e-2)).all()
        torch.testing.assert_close(attributions, expl.input_contributions, rtol=rtol * 10, atol=rtol * 1e-2)


@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_the_bridge_explains_a_tanh_or_sigmoid_gated_llama_exactly(activation):
    """TransformerLens' bridge holds the gate projection's output constant: the activation after it is then constant
    too, whatever it is. (``hooked_transformer_from_hf`` refuses these: TransformerLens has no tanh / sigmoid.)"""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    model = bcosify(_stock_with("LlamaForCausalLM", activation), b=1.25, verbose=False)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    expl = explain_logits(transformer_bridge_from_hf(model), ids, target=5)
    assert expl.completeness_error.max() <= 1e-4
    torch.testing.assert_close(expl.explained, explain(model, ids, target=5).explained, rtol=1e-5, atol=1e-6)


def test_hooked_transformer_from_hf_explains_a_relu2_gated_llama_and_refuses_tanh_naming_why():
    """relu2 is the one newly accepted activation TransformerLens has: its gated MLP's hook_pre (the gate projection's
    output) is held constant, so the activation after it is too."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, hooked_transformer_from_hf

    from bcos_plugins.errors import BcosValueError

    model = bcosify(_stock_with("LlamaForCausalLM", "relu2"), b=1.25, verbose=False)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    expl = explain_logits(hooked_transformer_from_hf(model), ids, target=5)
    assert expl.completeness_error.max() <= 1e-4
    torch.testing.assert_close(expl.explained, explain(model, ids, target=5).explained, rtol=1e-5, atol=1e-6)
    tanh = bcosify(_stock_with("LlamaForCausalLM", "tanh"), b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match=r"^activation 'tanh' of this LlamaForCausalLM has no TransformerLens"):
        hooked_transformer_from_hf(tanh)


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "mish"])
def test_a_gated_activation_model_saves_and_reloads_as_the_same_model(tmp_path, activation):
    from bcos_plugins import load_bcos_model

    model = bcosify(_stock_with("Qwen2ForCausalLM", activation), b=1.25, verbose=False)
    model.save_pretrained(tmp_path)
    reloaded = load_bcos_model(tmp_path)
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert reloaded.bcos_report.gate_branch_activations == model.bcos_report.gate_branch_activations


@pytest.mark.parametrize("activation", ["prelu", "xielu"])
def test_a_gated_mlp_still_refuses_an_activation_with_learned_parameters(activation):
    with pytest.raises(UnsupportedModuleError, match=r"^model: bcosify cannot convert module 'model\.layers\.0\.mlp\."
                                                     r"act_fn' .*as a gated MLP's gate branch bcosify takes any "
                                                     r"parameter-free activation \(.*Sigmoid.*Tanh\), not one with "
                                                     r"learned parameters"):
        bcosify(_stock_with("LlamaForCausalLM", activation), verbose=False)


def test_outside_a_gated_mlp_tanh_and_sigmoid_stay_refused_naming_where_they_would_be_taken():
    from conftest import tiny_config

    for activation, reason in (("tanh", r"gate = tanh\(x\) / x"), ("sigmoid", r"is 0\.5 at x = 0")):
        config = tiny_config("gpt2")
        config.activation_function = activation
        torch.manual_seed(0)
        with pytest.raises(UnsupportedModuleError, match=rf"'transformer\.h\.0\.mlp\.act' .*{reason}.*; a gated MLP's "
                                                         r"gate branch \(Llama-shaped decoders, ModernBERT\) may hold "
                                                         r"it\. Supported"):
            bcosify(T.GPT2LMHeadModel(config).eval(), verbose=False)


def test_a_hand_placed_clipped_gelu_in_a_gate_branch_is_kept_and_gelu_10_stays_detachable():
    from transformers.activations import ClippedGELUActivation

    from bcos_plugins.nn import DetachableActivation

    stock = _stock_with("LlamaForCausalLM", "silu")
    stock.model.layers[0].mlp.act_fn = ClippedGELUActivation(-1.0, 3.0)
    stock.model.layers[1].mlp.act_fn = ClippedGELUActivation(-10, 10)
    model = bcosify(stock, verbose=False)
    assert list(model.bcos_report.gate_branch_activations) == ["model.layers.0.mlp.act_fn"]
    assert model.bcos_report.activations == {"model.layers.1.mlp.act_fn": "gelu_10"}
    assert isinstance(model.model.layers[1].mlp.act_fn, DetachableActivation)
    expl = explain(model.double(), torch.tensor([[4, 9, 13, 7]]), target=2)
    _assert_complete(expl.input_contributions, expl.explained, 1e-10)


# ------------------------------------------------------------------ 2. return_dict=False on the vision models


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_vision_models_return_transformers_tuple_for_return_dict_false(tiny_vits, vit_images, kind):
    """return_dict=False was ignored: the ModelOutput came back, and unpacking it as transformers' tuple,
    ``loss, logits = model(...)``, gave the strings "loss" and "logits"."""
    model = tiny_vits[kind]
    images, labels = vit_images
    with torch.no_grad():
        full = model(pixel_values=images, labels=labels, output_attentions=True)
        loss, logits, attentions = model(pixel_values=images, labels=labels, output_attentions=True,
                                         return_dict=False)
        plain = model(pixel_values=images, return_dict=False)
    assert isinstance(loss, torch.Tensor) and torch.equal(loss, full.loss) and torch.equal(logits, full.logits)
    assert isinstance(attentions, tuple) and all(torch.equal(a, b) for a, b in zip(attentions, full.attentions,
                                                                                    strict=True))
    assert type(plain) is tuple and len(plain) == 1 and torch.equal(plain[0], full.logits)
    with torch.no_grad():
        assert type(model(pixel_values=images, return_dict=True)).__name__ == "ImageClassifierOutput"
        model.config.return_dict = False
        try:  # None follows the config, as transformers models do
            assert type(model(pixel_values=images, return_dict=None)) is tuple
        finally:
            model.config.return_dict = True
    with pytest.raises(BcosTypeError, match=r"^return_dict: must be True, False or None, got str 'no'\. Pass "
                                            r"return_dict=False for a tuple, True for the ModelOutput or None for "
                                            r"config\.return_dict's choice"):
        model(pixel_values=images, return_dict="no")


# ------------------------------------------------------------------ 3. inseq info["step_scores"] with "deltas"


def test_inseq_info_lists_deltas_when_asked_as_every_other_step_score():
    """inseq records the step scores it was asked for in ``info["step_scores"]`` (merge_attributions matches outputs
    on it); "bcos" hands inseq the list without "deltas" (no step function has that name), so the record read [] for
    ``step_scores=["deltas"]`` and ["logit"] for ["logit", "deltas"], while ``step_scores["deltas"]`` was there."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    kwargs = {"generation_args": {"max_new_tokens": 2, "do_sample": False}, "show_progress": False}
    both = attribution_model.attribute("The cat sat", step_scores=["logit", "deltas"], **kwargs)
    assert both.info["step_scores"] == ["logit", "deltas"]
    assert set(both.sequence_attributions[0].step_scores) == {"logit", "deltas"}
    alone = attribution_model.attribute("The cat sat", step_scores=("deltas",), **kwargs)
    assert alone.info["step_scores"] == ["deltas"]
    assert attribution_model.attribute("The cat sat", **kwargs).info["step_scores"] == []  # inseq's own record
    merged = inseq.merge_attributions([both, attribution_model.attribute("A dog ran", step_scores=["logit", "deltas"],
                                                                         **kwargs)])
    assert merged.info["step_scores"] == ["logit", "deltas"] and len(merged.sequence_attributions) == 2


# ------------------------------------------------------------------ 4. one range check for per-token ids


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.uint8])
def test_segment_and_position_ids_are_range_checked_alike_in_every_integer_dtype(dtype):
    """token_type_ids and position_ids are checked by one helper (they were two copies of the check): the same
    message shape for both, in every integer dtype, and bool segment ids get the dtype refusal, not a crash."""
    from conftest import padded_batch, tiny_model

    from bcos_plugins.errors import BcosValueError

    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    ids, mask = padded_batch()
    types = torch.zeros_like(ids, dtype=dtype)
    types[1, 2] = 2
    with pytest.raises(BcosValueError, match=r"^token_type_ids: holds 2, outside the model's 2 segment types "
                                             r"\(config\.type_vocab_size\), 0 to 1\. Pass the segment ids"):
        explain(model, ids, mask, token_type_ids=types)
    positions = (torch.arange(9)[None] + 35).to(dtype)
    with pytest.raises(BcosValueError, match=r"^position_ids: holds 43, outside the model's 40 positions "
                                             r"\(config\.max_position_embeddings\), 0 to 39\. Leave position_ids out"):
        explain(model, ids, mask, position_ids=positions)
    with pytest.raises(BcosTypeError, match=r"^token_type_ids: is a torch\.bool tensor; segment ids are integers"):
        explain(model, ids, mask, token_type_ids=torch.zeros_like(ids, dtype=torch.bool))


# ------------------------------------------------------------------ 6. bootstrap of identical differences


def test_bootstrap_refuses_the_same_difference_on_every_unit_and_keeps_any_spread():
    """Every unit's difference equal gave the interval [d, d]: "no uncertainty", and excludes_zero() True for any
    d != 0, from units that say nothing about how much units not drawn differ (refused as one unit is)."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a = torch.linspace(0, 1, 40, dtype=torch.float64)
    for shift in (0.0, 0.25, -3.0):
        with pytest.raises(BcosValueError, match=rf"^values_b: minus values_a is {shift:g} on every one of the 40 "
                                                 r"units.*zero width"):
            paired_bootstrap_difference(a, a + shift)
    spread = a + 0.25
    spread[7] += 1e-9  # any spread gets its interval
    r = paired_bootstrap_difference(a, spread)
    assert r.ci_low < r.difference < r.ci_high and r.ci_high - r.ci_low < 1e-9


def test_bench_frontier_reports_a_saturated_metric_without_an_interval():
    from types import SimpleNamespace

    from benchmarks import bench_frontier

    cell = lambda values: {"methods": {"LIME": {"comp": values}, "B-cos": {"comp": values}}}  # noqa: E731
    same = [(cell([0.0, 0.5]), cell([0.0, 0.5])), (cell([1.0, 1.0]), cell([1.0, 1.0]))]
    columns = bench_frontier._metric_columns(same, "comp", "LIME", SimpleNamespace(bootstrap=200))
    assert columns["comp_diff"] == 0.0 and columns["comp_units"] == 4
    assert math.isnan(columns["comp_low"]) and math.isnan(columns["comp_high"])
    spread = [(cell([0.0, 0.5]), {"methods": {"B-cos": {"comp": [0.25, 0.5]}}}), (cell([1.0]), cell([1.0]))]
    columns = bench_frontier._metric_columns(spread, "comp", "LIME", SimpleNamespace(bootstrap=200))
    assert columns["comp_diff"] == pytest.approx(0.25 / 3)
    assert columns["comp_low"] <= columns["comp_diff"] <= columns["comp_high"]


def test_bootstrap_reads_lists_of_python_floats_in_float64():
    """torch.as_tensor made a list of Python floats float32, so differences of 1e-9 were rounded to 0 before the
    float64 arithmetic: the difference read 0.0 with the interval [0, 0] (bench_frontier passes lists)."""
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a = [1.0, 2.0, 3.0, 4.0]
    b = [1.0 + 1e-9, 2.0 + 2e-9, 3.0 + 4e-9, 4.0 + 1e-9]
    r = paired_bootstrap_difference(a, b)
    assert r.difference == pytest.approx(2e-9, rel=1e-6)
    assert r.ci_low < r.difference < r.ci_high
    assert paired_bootstrap_difference(tuple(a), tuple(b)) == r == paired_bootstrap_difference(
        torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
