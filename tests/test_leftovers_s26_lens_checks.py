"""The TransformerLens adapter's one "the model changed" check (helper-191, note 25's reviewer item): a cache's
snapshot of the cfg fields TransformerLens reads again at each call and of the weights' versions, taken at the run and
compared once per decomposition. Each test failed before its change."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_conformance import B, _stock

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
_BUILT: dict = {}


def _hooked(name: str = "GPT2LMHeadModel", bcos: bool = True):
    """A fresh HookedTransformer of the tiny (B-cos) ``name`` (the HF model is built once)."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    if (name, bcos) not in _BUILT:
        stock = _stock(name)
        _BUILT[name, bcos] = (bcosify(stock, b=B, verbose=False) if bcos else stock).eval()
    return hooked_transformer_from_hf(_BUILT[name, bcos])


# --------------------------------------------------------------- 1. an in-place edit after a move to another device


@pytest.mark.parametrize("overwrite", [False, True], ids=["module_to", "overwrite_module_params"])
def test_an_in_place_edit_after_moving_the_model_to_another_device_is_refused(overwrite):
    """Moving the model (and the cache) to another device keeps the values, so the cache's decompositions go on; but
    the check stopped comparing a weight once its device had changed, so a head's W_O scaled in place after the move
    (an ablation) was combined with the run's activations without a word. The move makes a new parameter here (to
    ``meta``, the one device besides the CPU this machine has; and under torch's overwrite mode), with a fresh version
    counter, which the write moves: refused now, naming the weight."""
    model = _hooked()
    _, cache = model.run_with_cache(TOKENS)
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    try:
        model.to("meta")
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    cache.to("meta")
    assert model.blocks[0].attn.W_O.device.type == "meta"
    # the move alone is no change: TransformerLens' decompositions run (on meta: shapes only)
    heads = cache.stack_head_results(layer=1)
    assert heads.shape == (model.cfg.n_heads, *TOKENS.shape, model.cfg.d_model)
    assert cache.logit_attrs(heads, tokens=3).shape == (model.cfg.n_heads, *TOKENS.shape)
    with torch.no_grad():
        model.blocks[0].attn.W_O[0].mul_(0.1)
    refusal = r"^cache: stack_head_results: the model's weights changed since the run that filled it " \
              r"\(blocks\.0\.attn\.W_O: written in place, also after a move to another device"
    with pytest.raises(BcosValueError, match=refusal):
        cache.stack_head_results(layer=1)
    with pytest.raises(BcosValueError, match=r"^cache: get_full_resid_decomposition: .*blocks\.0\.attn\.W_O"):
        cache.get_full_resid_decomposition()


def test_a_move_keeping_the_parameter_is_told_from_a_write_after_it_by_the_version_counter():
    """The paths a move takes on a GPU (CPU <-> CUDA keeps the parameter and its version counter) and under torch's swap
    mode (the same parameter, a fresh counter), neither reachable on a CPU-only machine (a CPU parameter cannot take a
    meta tensor's place, and swap mode refuses meta), told apart from a write after them by the versions alone."""
    from bcos_plugins.adapters._lens.model_changes import WeightVersion, _weight_changed

    then = WeightVersion(3, 1000, torch.float32, torch.device("cpu"))

    def now(version, pointer=2000, dtype=torch.float32, device="cuda:0"):
        return WeightVersion(version, pointer, dtype, torch.device(device))

    assert not _weight_changed(then, now(3), same_tensor=True)  # Module.to: the counter kept
    assert not _weight_changed(then, now(0), same_tensor=True)  # swap mode: a fresh counter
    assert _weight_changed(then, now(4), same_tensor=True)  # a write after the move
    assert _weight_changed(then, now(1), same_tensor=True)  # a write after a swap-mode move
    assert not _weight_changed(then, now(0), same_tensor=False)  # a new parameter (overwrite mode, meta)
    assert _weight_changed(then, now(1), same_tensor=False)
    assert _weight_changed(then, now(3), same_tensor=False)
    assert _weight_changed(then, now(3, dtype=torch.float64), same_tensor=True)  # .to("cuda", torch.float64)
    assert _weight_changed(then, now(3, device="cpu"), same_tensor=True)  # another storage on the same device
    assert not _weight_changed(then, now(3, pointer=1000, device="cpu"), same_tensor=True)
    assert not _weight_changed(then, now(None), same_tensor=False)  # an inference tensor: no counter to read


# --------------------------------------------------------------- 2. a cfg field changed since the run


def test_a_normalization_type_set_to_none_after_the_run_is_refused_by_the_cache():
    """``model.cfg.normalization_type = None`` after the run: TransformerLens' apply_ln_to_stack then left the final
    norm out of the stack, while the run's logits went through it, so logit_attrs of decompose_resid missed the
    logits, without a word (the "changed after building" check lets None through at the final norm: the forward
    skips ln_final under None as well, but this run did not). Refused naming the field, both values and the fix."""
    model = _hooked()
    logits, cache = model.run_with_cache(TOKENS)
    stack = cache.decompose_resid()
    torch.testing.assert_close(cache.logit_attrs(stack, tokens=3).sum(0), logits[..., 3], atol=1e-5, rtol=0)
    model.cfg.normalization_type = None
    # what TransformerLens' own sum gives now, without the check: not the run's logits
    from transformer_lens import ActivationCache

    unchecked = ActivationCache(cache.cache_dict, model).logit_attrs(stack, tokens=3).sum(0)
    assert (unchecked - logits[..., 3]).abs().max() > 1e-2
    refusal = r"^cache: logit_attrs: model\.cfg\.normalization_type was 'LN' at the run that filled it and is None " \
              r"now; .*Set model\.cfg\.normalization_type back to 'LN', or run run_with_cache again"
    with pytest.raises(BcosValueError, match=refusal):
        cache.logit_attrs(stack, tokens=3)
    with pytest.raises(BcosValueError, match=r"^cache: apply_ln_to_stack: model\.cfg\.normalization_type was 'LN'"):
        cache.accumulated_resid(layer=1, apply_ln=True)
    model.cfg.normalization_type = "LNPre"  # the same kind of norm: the numbers do not change
    torch.testing.assert_close(cache.logit_attrs(stack, tokens=3).sum(0), logits[..., 3], atol=1e-5, rtol=0)


def test_a_logit_soft_cap_removed_after_the_run_is_refused_by_logit_attrs():
    """A cache filled while ``cfg.output_logits_soft_cap`` capped the logits (TransformerLens' forward reads it at each
    call), decomposed after the cap was turned off: logit_attrs' refusal of a soft-capping model looked at the cfg of
    the call only, and the stack summed to the uncapped logits, not the run's, without a word. Refused now."""
    model = _hooked("LlamaForCausalLM", bcos=False)
    model.cfg.output_logits_soft_cap = 0.5
    logits, cache = model.run_with_cache(TOKENS)
    assert logits.abs().max() <= 0.5
    model.cfg.output_logits_soft_cap = -1.0
    stack = cache.decompose_resid()
    refusal = r"^cache: logit_attrs: model\.cfg\.output_logits_soft_cap was 0\.5 at the run that filled it and is " \
              r"-1\.0 now; .*Set model\.cfg\.output_logits_soft_cap back to 0\.5"
    with pytest.raises(BcosValueError, match=refusal):
        cache.logit_attrs(stack, tokens=3)
    model.cfg.output_logits_soft_cap = 0.5  # as at the run: the soft-cap's own refusal again
    with pytest.raises(BcosError, match=r"soft-caps its logits \(0\.5 \* tanh"):
        cache.logit_attrs(stack, tokens=3)


# --------------------------------------------------------------- 3. compared once per decomposition


@pytest.mark.parametrize("call", [
    lambda cache: cache.compute_head_results(),
    lambda cache: cache.get_neuron_results(1),
    lambda cache: cache.stack_head_results(layer=1),
    lambda cache: cache.stack_neuron_results(layer=2, apply_ln=True),
    lambda cache: cache.get_full_resid_decomposition(apply_ln=True),
    lambda cache: cache.logit_attrs(cache.decompose_resid(), tokens=3),
], ids=["compute_head_results", "get_neuron_results", "stack_head_results", "stack_neuron_results",
        "get_full_resid_decomposition", "logit_attrs"])
def test_a_decomposition_compares_the_weights_with_the_run_once(monkeypatch, call):
    """``compute_head_results`` / ``get_neuron_results`` compared every weight twice (the B-cos cache's override, then
    the hook-checked one through ``super()``), and TransformerLens' decompositions call each other, so a
    get_full_resid_decomposition compared them once per block and more. Once now per call of the caller's, and a
    refusal still comes from the outermost call."""
    from bcos_plugins.adapters._lens.model_changes import ModelSnapshot

    model = _hooked()
    _, cache = model.run_with_cache(TOKENS)
    compared = []
    refuse_changes = ModelSnapshot.refuse_changes

    def counted(self, model, method, *, weights=True):
        compared.extend([method] if weights else [])
        return refuse_changes(self, model, method, weights=weights)

    monkeypatch.setattr(ModelSnapshot, "refuse_changes", counted)
    call(cache)
    assert len(compared) == 1, compared
    compared.clear()
    with torch.no_grad():
        model.blocks[1].mlp.W_out.mul_(0.5)
    with pytest.raises(BcosValueError, match=r"blocks\.1\.mlp\.W_out"):
        call(cache)
    assert len(compared) == 1


# --------------------------------------------------------------- 4. a bridge's normalization_type edited before the run


@pytest.mark.parametrize("name, edited", [("GPT2LMHeadModel", "RMS"), ("LlamaForCausalLM", "LN"),
                                          ("GPT2LMHeadModel", None)])
def test_a_bridges_normalization_type_edited_before_the_run_is_refused(name, edited):
    """A bridge's forward runs the transformers model's own norms and never reads ``cfg.normalization_type``, but
    TransformerLens' apply_ln_to_stack does (whether to centre; ``None``: no norm at all), and the "changed after
    building" check judged only a HookedTransformer's norm classes: an edit before the run (which the run's snapshot
    holds too) left logit_attrs of decompose_resid 0.043 (GPT-2 set to RMS), 0.082 (Llama set to LN) and 0.072 (GPT-2
    set to None) off the run's logits, without a word. Refused naming the field, the wrapped norm and the fix."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    if (name, True) not in _BUILT:
        _BUILT[name, True] = bcosify(_stock(name), b=B, verbose=False).eval()
    bridge = transformer_bridge_from_hf(_BUILT[name, True])
    original = bridge.cfg.normalization_type
    logits, cache = bridge.run_with_cache(TOKENS)
    torch.testing.assert_close(cache.logit_attrs(cache.decompose_resid(), tokens=3).sum(0), logits[..., 3],
                               atol=1e-5, rtol=0)
    bridge.cfg.normalization_type = edited
    logits, cache = bridge.run_with_cache(TOKENS)
    # what TransformerLens' own sum gives now, without the check: not the run's logits
    from transformer_lens import ActivationCache

    unchecked = ActivationCache(cache.cache_dict, bridge).logit_attrs(cache.decompose_resid(), tokens=3).sum(0)
    assert (unchecked - logits[..., 3]).abs().max() > 1e-2
    wrapped = "BcosLayerNorm" if original == "LN" else "DetachableRMSNorm"
    refusal = rf"^model: apply_ln_to_stack: model\.cfg\.normalization_type is {edited!r} \(changed after the model " \
              rf"was built\?\), but the norm the stack meets is a \w+ \({wrapped}\).*Set model\.cfg\.normalization_type " \
              rf"back to '{original}'"
    with pytest.raises(BcosValueError, match=refusal):
        cache.logit_attrs(cache.decompose_resid(), tokens=3)
    with pytest.raises(BcosValueError, match=refusal):
        cache.decompose_resid(layer=1, apply_ln=True)


# --------------------------------------------------------------- 5. a cache copied or saved with its model


@pytest.mark.parametrize("how", ["torch.save", "deepcopy"])
def test_a_cache_saved_or_copied_with_its_model_decomposes_as_the_original(tmp_path, how):
    """``torch.save(cache)`` / ``copy.deepcopy(cache)`` copy the model with the cache, into new tensors, which the
    run's weight versions could not be compared with: every decomposition of the reloaded cache was refused as "the
    model's weights changed since the run" (all of them named), though nothing had. The copy now records its own model
    and decomposes as the original did; a model changed before the copy is still refused (the copy holds the changed
    weights), naming what had changed."""
    import copy

    def copied(cache):
        if how == "deepcopy":
            return copy.deepcopy(cache)
        torch.save(cache, tmp_path / "cache.pt")
        return torch.load(tmp_path / "cache.pt", weights_only=False)

    model = _hooked()
    logits, cache = model.run_with_cache(TOKENS)
    twin = copied(cache)  # before any decomposition: torch deep-copies no tensor made with autograd (hook_result)
    assert twin.model is not model
    heads = cache.stack_head_results(layer=1)
    torch.testing.assert_close(twin.stack_head_results(layer=1), heads, atol=0, rtol=0)
    torch.testing.assert_close(twin.logit_attrs(twin.decompose_resid(), tokens=3).sum(0), logits[..., 3],
                               atol=1e-5, rtol=0)
    with torch.no_grad():
        twin.model.blocks[0].attn.W_O[0].mul_(0.1)  # the copy's own model, edited after the copy
    with pytest.raises(BcosValueError, match=r"^cache: stack_head_results: the model's weights changed .*W_O"):
        twin.stack_head_results(layer=1)
    _, cache = model.run_with_cache(TOKENS)
    with torch.no_grad():
        model.blocks[0].attn.W_O[0].mul_(0.1)  # edited after the run, before the copy
    refusal = r"^cache: stack_head_results: it is a copy .* of a cache whose model had changed since the run that " \
              r"filled it \(blocks\.0\.attn\.W_O\)"
    with pytest.raises(BcosValueError, match=refusal):
        copied(cache).stack_head_results(layer=1)
