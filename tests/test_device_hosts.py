"""TransformerLens, sae-lens and inseq on one device agree with a float64 CPU reference of the same model.

The companion of tests/test_device_paths.py (same device rule: ``BCOS_TEST_DEVICE``, default ``cpu``, what CI runs;
``BCOS_TEST_DEVICE=cuda`` on a GPU). For each decoder family TransformerLens takes (the registry's classes with a
converter, and those the bridge takes; the tiny configs of tests/test_conformance.py, B = 1.25, norm gains moved
off 1), the model on the device (float32) against the same model built in float64 on the CPU:

- TransformerLens' own calls as users write them: ``model.run_with_cache`` keeps every cached tensor on the device;
  ``cache.decompose_resid`` / ``get_full_resid_decomposition`` / ``accumulated_resid`` with ``cache.logit_attrs``
  sum to the logit there (refused, naming the exact split, where Gemma 2 soft-caps its logits), and
  ``stack_head_results`` / ``stack_neuron_results`` sum to each layer's attention / MLP output; every stack equals
  the reference's within float32 rounding (``hooked_transformer_from_hf`` and ``transformer_bridge_from_hf``);
- the package's ``explain_logits`` and ``token_component_decomposition`` on both model kinds: complete on the
  device, equal to the reference;
- sae-lens: a ``HookedSAETransformer`` with an SAE spliced in with its error term: the tokens' share plus the
  error term's reported share is the logit on the device, both equal to the reference's; ``explain_sae_feature``
  (attached SAE, and an unattached one on a bridge) likewise; ``BilinearSAEInteractions`` on a bilinear layer;
- inseq: ``inseq.load_model(model, "bcos", device=...).attribute`` + ``aggregate`` on every B-cos causal LM: the
  aggregated scores sum to each generated step's logit and equal the reference's; the package's
  ``load_classifier(...).attribute`` on every B-cos classifier likewise (scores summing to each class logit).

A tensor an adapter creates on the CPU inside one of these paths fails here on a GPU. Two were found by reading the
code, not yet by a GPU run: ``BilinearSAEInteractions.top_interactions`` masked CUDA blocks with a CPU mask (an error
there) and ``low_rank_correlation`` returned its correlations on the CPU beside device tensors. A third showed on the
CPU: a deep copy of a ``HookedSAETransformer`` ran the original's MLPs (so a copy moved to a GPU used CPU weights).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import VOCAB
from test_conformance import (
    BRIDGE_NAMES,
    CAUSAL_LM_NAMES,
    CLASSIFIER_NAMES,
    CONFIGS,
    LENS_NAMES,
    RTOL,
    _converted,
    _family,
    _stock,
    _with_trained_norm_gains,
    _word_tokenizer,
)
from test_device_paths import DEVICE, _close_to

from bcos_plugins.errors import BcosTypeError, BcosValueError

# within float32 rounding of the float64 reference, relative to the largest value compared (as test_device_paths)
FLOAT32_SHARE = 1e-4


def _on_device(tensor: torch.Tensor) -> bool:
    return tensor.device.type == DEVICE.type


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(seed))


_PAIRS: dict[tuple, tuple[torch.nn.Module, torch.nn.Module]] = {}


def _lens_pair(kind: str, name: str, model_class=None):
    """(the TransformerLens model of ``name`` on DEVICE in float32, the same built from a float64 copy on the CPU).
    ``kind`` is "hooked" (``hooked_transformer_from_hf``) or "bridge" (``transformer_bridge_from_hf``). The
    reference is built from the float64 transformers model, not cast from the float32 one: the final norm's gain is
    folded into ``W_U`` when the model is built, and a float32 fold is already rounded."""
    key = (kind, name, model_class)
    if key not in _PAIRS:
        hf_model = _with_trained_norm_gains(name)
        if kind == "hooked":
            from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf as build

            extra = {} if model_class is None else {"model_class": model_class}
            make = lambda hf: build(hf, **extra)  # noqa: E731
        else:
            from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf as make
        reference = make(copy.deepcopy(hf_model).double())
        _PAIRS[key] = (make(hf_model).to(DEVICE), reference)
    return _PAIRS[key]


def _refused_here(kind: str, name: str) -> bool:
    """Whether this environment's transformers is one ``hooked_transformer_from_hf`` refuses for ``name`` by design
    (Gemma 2 below GEMMA2_MIN_TRANSFORMERS, whose logits TransformerLens' Gemma 2 does not reproduce: the GPU image has
    transformers 5.17, CI a newer one). Then the test asserts that refusal, with its message, instead of the pair."""
    import transformers
    from bcos_plugins.adapters._lens.conversions.gemma2 import GEMMA2_MIN_TRANSFORMERS
    from packaging.version import Version
    if kind != "hooked" or _family(name) != _family("Gemma2ForCausalLM"):
        return False
    if Version(transformers.__version__) >= Version(GEMMA2_MIN_TRANSFORMERS):
        return False
    with pytest.raises(BcosValueError, match=rf"needs transformers >= {GEMMA2_MIN_TRANSFORMERS}"):
        _lens_pair(kind, name)
    return True


def _soft_capped(name: str) -> bool:
    """Whether the family's tiny config soft-caps its logits (Gemma 2): then no sum of per-component terms is one."""
    return getattr(CONFIGS[_family(name)](), "final_logit_softcapping", None) is not None


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach(), expected.detach()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def _check_cache(model, reference, tokens: torch.Tensor, soft_capped: bool, per_component: bool = True) -> None:
    """TransformerLens' own decomposition calls on the device: on the device, summing to what they decompose, and
    equal to the reference's. ``per_component=False``: the per-head and per-neuron results are refused (a B-cos
    Gemma 2 bridge; tests/test_conformance.py checks the refusals), so neither they nor the full decomposition
    built from them are checked."""
    logits, cache = model.run_with_cache(tokens.to(DEVICE))
    with torch.no_grad():
        expected_logits, expected_cache = reference.run_with_cache(tokens)
    assert _on_device(logits)
    off = sorted(name for name, value in cache.cache_dict.items() if not _on_device(value))
    assert not off, f"cached on another device than {DEVICE}: {off}"
    _close_to(logits, expected_logits, 1e-5, "logits")
    target = expected_logits.argmax(-1)  # the reference's: float32 rounding must not pick another token
    foil = expected_logits.argmin(-1)
    stacks = {"decompose_resid": lambda c: c.decompose_resid(),
              "accumulated_resid": lambda c: c.accumulated_resid(layer=-1)[-1:]}
    if per_component:
        stacks["get_full_resid_decomposition"] = lambda c: c.get_full_resid_decomposition(expand_neurons=True)
    for label, stack_of in stacks.items():
        stack, expected_stack = stack_of(cache), stack_of(expected_cache)
        assert _on_device(stack), label
        _close_to(stack, expected_stack, FLOAT32_SHARE, label)
        if soft_capped:  # the logit is cap * tanh(z / cap): no sum of per-component terms equals it
            with pytest.raises(BcosTypeError, match=r"logit_attrs: .*soft-caps.*token_component_decomposition"):
                cache.logit_attrs(stack, tokens=target.to(DEVICE))
            continue
        attrs = cache.logit_attrs(stack, tokens=target.to(DEVICE), incorrect_tokens=foil.to(DEVICE))
        expected_attrs = expected_cache.logit_attrs(expected_stack, tokens=target, incorrect_tokens=foil)
        assert _on_device(attrs), label
        difference = (expected_logits.gather(-1, target[..., None]) - expected_logits.gather(-1, foil[..., None]))
        assert _relative(attrs.sum(0), difference[..., 0].to(attrs)) <= RTOL, label
        _close_to(attrs, expected_attrs, FLOAT32_SHARE, f"logit_attrs of {label}")
    if not per_component:
        return
    cfg = model.cfg
    heads, expected_heads = cache.stack_head_results(layer=-1), expected_cache.stack_head_results(layer=-1)
    neurons = cache.stack_neuron_results(cfg.n_layers)
    expected_neurons = expected_cache.stack_neuron_results(cfg.n_layers)
    assert _on_device(heads) and _on_device(neurons)
    _close_to(heads, expected_heads, FLOAT32_SHARE, "stack_head_results")
    _close_to(neurons, expected_neurons, FLOAT32_SHARE, "stack_neuron_results")
    for layer in range(cfg.n_layers):
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        assert _relative(heads[layer * cfg.n_heads:(layer + 1) * cfg.n_heads].sum(0), attn_out) <= RTOL
        mlp_out = cache[f"blocks.{layer}.hook_mlp_out"]
        assert _relative(neurons[layer * cfg.d_mlp:(layer + 1) * cfg.d_mlp].sum(0), mlp_out) <= RTOL


def test_the_requested_device_is_there():
    """A run asked for a device that is missing fails here instead of testing the CPU under the device's name."""
    torch.empty(1, device=DEVICE)


@pytest.mark.parametrize("name", LENS_NAMES)
def test_hooked_transformer_caches_on_the_device_decompose_exactly_and_equal_the_reference(name):
    if _refused_here("hooked", name):
        return
    model, reference = _lens_pair("hooked", name)
    assert next(model.parameters()).device.type == DEVICE.type == torch.device(model.cfg.device).type
    _check_cache(model, reference, _tokens(8), _soft_capped(name))


@pytest.mark.parametrize("name", BRIDGE_NAMES)
def test_bridge_caches_on_the_device_decompose_exactly_and_equal_the_reference(name):
    model, reference = _lens_pair("bridge", name)
    _check_cache(model, reference, _tokens(9), _soft_capped(name), per_component=not _soft_capped(name))


@pytest.mark.parametrize(("kind", "name"), [("hooked", n) for n in LENS_NAMES] + [("bridge", n) for n in BRIDGE_NAMES])
def test_explain_logits_and_token_components_on_the_device_equal_the_reference(kind, name):
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    if _refused_here(kind, name):
        return
    model, reference = _lens_pair(kind, name)
    tokens = _tokens(10)
    mask = torch.ones_like(tokens)
    # left padding on one row; not on a bridge, whose own attention (TransformerLens 3.9) gives a float64 model's
    # left-padded row NaN logits everywhere (float32 and the transformers model itself are finite)
    if kind == "hooked":
        mask[1, :2] = 0
    with torch.no_grad():
        target = reference(tokens, attention_mask=mask)[:, -1].argmax(-1)
    given = {"target": target, "attention_mask": mask}
    expected = explain_logits(reference, tokens, **given)
    actual = explain_logits(model, tokens.to(DEVICE), target=target.to(DEVICE), attention_mask=mask.to(DEVICE))
    assert _on_device(actual.contributions) and _on_device(actual.input_contributions)
    assert (actual.completeness_error.cpu() <= RTOL).all()
    _close_to(actual.explained, expected.explained, 1e-5, "explained logit")
    _close_to(actual.contributions, expected.contributions, FLOAT32_SHARE, "token contributions")

    expected_table = token_component_decomposition(reference, tokens, **given)
    table = token_component_decomposition(model, tokens.to(DEVICE), target=target.to(DEVICE),
                                          attention_mask=mask.to(DEVICE))
    assert table.labels == expected_table.labels
    assert _on_device(table.table)
    assert (table.completeness_error.cpu() <= RTOL).all()
    _close_to(table.table, expected_table.table, FLOAT32_SHARE, "token x component shares")
    _close_to(table.token_totals, expected.contributions, FLOAT32_SHARE, "token totals")


def _spliced_sae(d_model: int, hook_name: str, seed: int):
    """A bias-free StandardSAE on ``hook_name`` with random weights (float32, on the CPU)."""
    from sae_lens import StandardSAE, StandardSAEConfig

    sae_cfg = StandardSAEConfig(d_in=d_model, d_sae=4 * d_model, device="cpu")
    sae_cfg.metadata.hook_name = hook_name
    sae = StandardSAE(sae_cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(sae.W_enc.shape, generator=g))
        sae.W_dec.copy_(torch.randn(sae.W_dec.shape, generator=g) / d_model)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


@pytest.mark.parametrize("name", LENS_NAMES)
def test_a_spliced_sae_on_the_device_reports_its_error_share_as_the_reference(name):
    """sae-lens' HookedSAETransformer with an SAE spliced in with its error term: on the device the tokens' share
    plus the error term's reported share is the logit, and both equal the float64 reference's; explain_sae_feature
    of a feature of that SAE likewise (its token contributions plus its bias terms are the pre-activation)."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature, sae_error_share
    from sae_lens import HookedSAETransformer

    if _refused_here("hooked", name):
        return
    hook = "blocks.0.hook_resid_post"
    # deep copies (SAEs get attached to them), as a user keeps a model and moves a copy to the GPU
    device_model, reference = (copy.deepcopy(m) for m in _lens_pair("hooked", name, HookedSAETransformer))
    sae = _spliced_sae(device_model.cfg.d_model, hook, seed=3)
    device_sae, reference_sae = copy.deepcopy(sae).to(DEVICE), copy.deepcopy(sae).to(torch.float64)
    assert _on_device(device_sae.W_enc)
    device_model.add_sae(device_sae, use_error_term=True)
    reference.add_sae(reference_sae, use_error_term=True)
    tokens = _tokens(11)
    expected = sae_error_share(reference, tokens, target=4)
    actual = sae_error_share(device_model, tokens.to(DEVICE), target=4)
    assert set(actual.error_shares) == {hook}
    assert _on_device(actual.error_share) and _on_device(actual.explanation.contributions)
    explained = actual.explanation.explained
    assert float(actual.error_fraction.abs().max()) > 1e-3  # the error term carries a real share
    total = actual.explanation.total + actual.error_share
    assert _relative(total, explained) <= RTOL
    _close_to(actual.explanation.explained, expected.explanation.explained, 1e-5, "explained logit")
    _close_to(actual.error_share, expected.error_share, FLOAT32_SHARE, "error share")
    _close_to(actual.explanation.contributions, expected.explanation.contributions, FLOAT32_SHARE,
              "token contributions")

    # the SAE's most active feature at the last position (the reference's choice)
    with torch.no_grad():
        _, cache = reference.run_with_cache(tokens)
    feature = int(cache[f"{hook}.hook_sae_acts_pre"][0, -1].argmax())
    expected_feature = explain_sae_feature(reference, tokens, reference_sae, feature)
    feature_expl = explain_sae_feature(device_model, tokens.to(DEVICE), device_sae, feature)
    assert _on_device(feature_expl.contributions) and _on_device(feature_expl.pre_activation)
    assert _relative(feature_expl.total + feature_expl.bias_terms, feature_expl.pre_activation) <= RTOL
    _close_to(feature_expl.pre_activation, expected_feature.pre_activation, 1e-5, "pre-activation")
    _close_to(feature_expl.contributions, expected_feature.contributions, FLOAT32_SHARE, "feature token contributions")


def _hooked_sae_transformer(construct: str):
    from bcos_plugins.adapters import transformer_lens as lens
    from sae_lens import HookedSAETransformer

    if construct == "BcosTransformerConfig":
        return lens.bcos_model_class(HookedSAETransformer)(lens.BcosTransformerConfig(
            d_model=8, n_layers=2, n_heads=2, d_head=4, d_mlp=12, d_vocab=VOCAB, n_ctx=8, act_fn="silu",
            gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary", bcos_b=1.5, seed=0,
            device="cpu"))
    hf_model = _with_trained_norm_gains("GPT2LMHeadModel") if construct == "B-cos GPT-2" else \
        _stock("LlamaForCausalLM")  # a plain model without biases: its explanations are complete too
    return lens.hooked_transformer_from_hf(hf_model, model_class=HookedSAETransformer)


@pytest.mark.parametrize("construct", ["B-cos GPT-2", "plain Llama", "BcosTransformerConfig"])
def test_a_deep_copy_of_a_hooked_sae_transformer_on_the_device_runs_its_own_mlps(construct):
    """sae-lens' HookedSAETransformer routes each MLP through hook_in with a lambda over the MLP, which
    ``copy.deepcopy`` does not copy: the copy's MLPs ran the original's (its weights and device, its gradients, its
    hooks). A copy moved to the device while the original stays on the CPU runs its own, fires its own MLP hooks and
    explains completely (it missed the MLPs' share: completeness error 0.35 on the B-cos GPT-2)."""
    from bcos_plugins.adapters.transformer_lens import explain_logits

    original = _hooked_sae_transformer(construct)
    moved = copy.deepcopy(original).to(DEVICE)
    tokens = _tokens(13)[:, :6]
    seen = []
    original.blocks[0].mlp.hook_in.add_hook(lambda x, hook: seen.append(hook.name))
    _, cache = moved.run_with_cache(tokens.to(DEVICE))
    original.reset_hooks()
    assert not seen, "running the copy ran the original's MLP"
    assert {f"blocks.{i}.mlp.hook_in" for i in range(moved.cfg.n_layers)} <= set(cache.keys())
    assert _on_device(cache["blocks.0.mlp.hook_post"])
    expected = explain_logits(original, tokens, target=4)
    actual = explain_logits(moved, tokens.to(DEVICE), target=4)
    assert (actual.completeness_error.cpu() <= RTOL).all()
    _close_to(actual.contributions, expected.contributions.double(), FLOAT32_SHARE, "token contributions")


@pytest.mark.parametrize("name", BRIDGE_NAMES)
def test_explain_sae_feature_on_a_bridge_on_the_device_equals_the_reference(name):
    """An SAE not attached (a bridge takes none), read at a residual hook of the bridge on the device."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    model, reference = _lens_pair("bridge", name)
    sae = _spliced_sae(model.cfg.d_model, "blocks.1.hook_resid_pre", seed=4)
    tokens = _tokens(12)
    expected = explain_sae_feature(reference, tokens, copy.deepcopy(sae).to(torch.float64), 5)
    actual = explain_sae_feature(model, tokens.to(DEVICE), copy.deepcopy(sae).to(DEVICE), 5)
    assert _on_device(actual.contributions) and _on_device(actual.pre_activation)
    assert _relative(actual.total + actual.bias_terms, actual.pre_activation) <= RTOL
    _close_to(actual.pre_activation, expected.pre_activation, 1e-5, "pre-activation")
    _close_to(actual.contributions, expected.contributions, FLOAT32_SHARE, "token contributions")


def test_bilinear_sae_interactions_on_the_device_equal_the_reference():
    """``BilinearSAEInteractions`` on a bilinear layer and SAEs on the device: interactions, the top pairs (streamed
    over row blocks), the spectrum and the low-rank correlation equal the float64 CPU reference's, and stay on the
    device (top_interactions built its masks and pair list on the CPU, low_rank_correlation its result)."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from sae_lens import TopKSAE, TopKSAEConfig

    from bcos_plugins.bilinear import BilinearMLP

    d_model, d_sae = 8, 24
    torch.manual_seed(0)
    layer = BilinearMLP(d_model, 16).double()
    saes = []
    for seed in (1, 2):
        sae = TopKSAE(TopKSAEConfig(d_in=d_model, d_sae=d_sae, k=8, device="cpu"))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
                param.copy_(torch.randn(param.shape, generator=g))
        saes.append(sae)
    x = torch.randn(200, d_model, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    reference = BilinearSAEInteractions(layer, *(copy.deepcopy(s).to(torch.float64) for s in saes))
    on_device = BilinearSAEInteractions(copy.deepcopy(layer).float().to(DEVICE),
                                        *(copy.deepcopy(s).to(DEVICE) for s in saes))
    interactions = on_device.feature_interactions(5)
    assert _on_device(interactions)
    _close_to(interactions, reference.feature_interactions(5), FLOAT32_SHARE, "feature interactions")
    top, expected_top = on_device.top_interactions(5, k=10, block_size=7), reference.top_interactions(5, k=10,
                                                                                                      block_size=7)
    assert [(t.first, t.second) for t in top] == [(t.first, t.second) for t in expected_top]
    _close_to(torch.tensor([t.value for t in top]), torch.tensor([t.value for t in expected_top]), FLOAT32_SHARE,
              "top interaction values")
    eig, expected_eig = on_device.spectrum(2), reference.spectrum(2)
    assert _on_device(eig.eigenvalues)
    _close_to(eig.eigenvalues, expected_eig.eigenvalues, FLOAT32_SHARE, "eigenvalues")
    features = [0, 1, 2, 3]
    result = on_device.low_rank_correlation(x.float().to(DEVICE), features, ranks=[1, d_model])
    expected_result = reference.low_rank_correlation(x, features, ranks=[1, d_model])
    assert _on_device(result.correlations) and _on_device(result.active_tokens)
    assert torch.equal(result.active_tokens.cpu(), expected_result.active_tokens.to(result.active_tokens.dtype))
    # NaN where a feature is active on fewer than 2 tokens: at the same places
    assert torch.equal(result.correlations.isnan().cpu(), expected_result.correlations.isnan())
    assert not expected_result.correlations.isnan().all()
    _close_to(result.correlations.nan_to_num(), expected_result.correlations.nan_to_num(), 1e-3,
              "low-rank correlations")


@pytest.mark.parametrize("name", CAUSAL_LM_NAMES)
def test_inseq_attribute_and_aggregate_on_the_device_equal_the_reference(name):
    """inseq's own workflow on a B-cos causal LM loaded on the device: ``attribute`` (greedy generation of two
    tokens) and ``aggregate``; the aggregated token scores sum to each step's logit and equal the float64 CPU
    reference's (same prompts, same generated tokens)."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq

    hf_model = _with_trained_norm_gains(name)
    reference_model = copy.deepcopy(hf_model).double()
    # prompts of two lengths (inseq pads the shorter), except for Gemma 2, whose stock eager attention gives a float64
    # query that sees only padding keys NaN (tests/test_device_paths._side): one prompt, never padded (a second
    # one of the same length gets padded when its generation ends early)
    prompts = ["w5 w9 w11 w4"] + ([] if name.startswith("Gemma2") else ["w7 w30"])
    args = {"generation_args": {"max_new_tokens": 2, "do_sample": False}, "step_scores": ["logit"],
            "show_progress": False}
    outputs = {}
    for label, model, device in (("reference", reference_model, "cpu"), ("device", hf_model, str(DEVICE))):
        attribution_model = inseq.load_model(model, "bcos", tokenizer=_word_tokenizer(), device=device)
        assert next(attribution_model.model.parameters()).device.type == torch.device(device).type
        outputs[label] = attribution_model.attribute(prompts, **args).sequence_attributions
    for seq, expected_seq in zip(outputs["device"], outputs["reference"], strict=True):
        assert [t.id for t in seq.target] == [t.id for t in expected_seq.target]
        aggregated = seq.aggregate().target_attributions.cpu()
        expected_aggregated = expected_seq.aggregate().target_attributions.cpu()
        logits = seq.step_scores["logit"].cpu()
        torch.testing.assert_close(torch.nansum(aggregated, 0).double(), logits.double(), rtol=RTOL, atol=1e-5)
        _close_to(logits, expected_seq.step_scores["logit"].cpu().double(), 1e-5, "step logits")
        assert torch.equal(aggregated.isnan(), expected_aggregated.isnan())
        _close_to(aggregated.nan_to_num(), expected_aggregated.nan_to_num().double(), FLOAT32_SHARE,
                  "aggregated token scores")


@pytest.mark.parametrize("name", CLASSIFIER_NAMES)
def test_inseq_load_classifier_on_the_device_equals_the_reference(name):
    """The package's inseq-style classifier (``load_classifier(...).attribute``) on a model on the device: token x
    class scores summing to each class logit, equal to the float64 CPU reference's."""
    from bcos_plugins.adapters.inseq import load_classifier

    model = _converted(name)
    device_model, reference = copy.deepcopy(model).to(DEVICE), copy.deepcopy(model).double()
    # two lengths (the shorter padded), except Gemma 2 (float64 NaN where a query sees only padding: see above)
    texts = ["w5 w9 w11 w4 w8"] + ([] if name.startswith("Gemma2") else ["w7 w3"])
    expected = load_classifier(reference, _word_tokenizer()).attribute(texts).sequence_attributions
    actual = load_classifier(device_model, _word_tokenizer()).attribute(texts).sequence_attributions
    for seq, expected_seq in zip(actual, expected, strict=True):
        assert [t.id for t in seq.source] == [t.id for t in expected_seq.source]
        logits = seq.step_scores["logit"].cpu()
        totals = seq.source_attributions.sum(dim=(0, 2)).cpu()
        assert ((totals - logits).abs() <= RTOL * logits.abs().max()).all()
        _close_to(logits, expected_seq.step_scores["logit"].cpu(), 1e-5, "class logits")
        _close_to(seq.source_attributions.sum(-1), expected_seq.source_attributions.sum(-1).cpu(), FLOAT32_SHARE,
                  "token x class scores")
