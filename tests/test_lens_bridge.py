"""TransformerBridge on B-cos GPT-2, B-cos Llama and a bilinear Llama (TransformerLens 3.9 and 4.x).

The user's model is never modified, logits equal the HF model's, explanations through the bridge's hooks
are complete, and TransformerLens' run_with_cache / run_with_hooks / patching work on the bridged models.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from bcos_plugins.adapters._lens import bridge as bridge_module
from bcos_plugins.adapters.transformer_lens import check_bridge_internals, transformer_bridge_from_hf
from conftest import VOCAB, tiny_config, tiny_model
from transformer_lens import patching

from bcos_plugins import BcosError, bcosify, explanation_mode
from bcos_plugins.nn.linear import BcosLinear

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bilinear_llama():
    config = tiny_config("llama")
    config.hidden_act = "linear"
    torch.manual_seed(0)
    return T.LlamaForCausalLM(config).eval()


HF_MODELS = {
    "bcos_gpt2": lambda: bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False),
    "bcos_llama": lambda: bcosify(tiny_model("LlamaForCausalLM"), b=1.1, verbose=False),
    "bilinear_llama": _bilinear_llama,
}
_BUILT: dict = {}


def built(name: str):
    """(hf model, snapshot of its state before bridging, module types before, bridge), once per module."""
    if name not in _BUILT:
        hf = HF_MODELS[name]().eval()
        state = {k: v.clone() for k, v in hf.state_dict().items()}
        types = {n: type(m) for n, m in hf.named_modules()}
        _BUILT[name] = (hf, state, types, transformer_bridge_from_hf(hf))
    return _BUILT[name]


def ids(seed: int = 1, batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def explain_through_hooks(bridge, tokens, target: int, attention_mask=None):
    """Input x gradient at the bridge's embedding hooks in explanation mode: (contributions, explained)."""
    leaves = {}

    def capture(activation, hook):
        leaves[hook.name] = activation.detach().requires_grad_(True)
        return leaves[hook.name]

    names = [n for n in ("hook_embed", "hook_pos_embed") if n in bridge.hook_dict]
    with explanation_mode(bridge), torch.enable_grad():
        explained = bridge.run_with_hooks(tokens, attention_mask=attention_mask,
                                          fwd_hooks=[(n, capture) for n in names])[:, -1, target]
        grads = torch.autograd.grad(explained.sum(), list(leaves.values()))
    contributions = sum(leaf * g for leaf, g in zip(leaves.values(), grads, strict=True))
    return contributions.detach(), explained.detach()


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_users_model_untouched_and_logits_equal(name):
    hf, state, types, bridge = built(name)
    assert {n: type(m) for n, m in hf.named_modules()} == types  # no submodule swapped for a bridge component
    now = hf.state_dict()
    assert now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)
    tokens = ids()
    with torch.no_grad():
        expected = hf(tokens).logits
        got = bridge(tokens)
    assert ((got - expected).abs().max() / expected.abs().max()) <= 1e-5
    mask = torch.ones_like(tokens)
    mask[1, -2:] = 0  # right padding: the real positions agree with the masked HF forward
    with torch.no_grad():
        masked = hf(tokens, attention_mask=mask).logits
        got_masked = bridge(tokens, attention_mask=mask)
    real = mask.bool()
    assert ((got_masked[real] - masked[real]).abs().max() / masked.abs().max()) <= 1e-5


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_explanation_through_the_bridge_hooks_is_complete(name):
    _, _, _, bridge = built(name)
    tokens = ids(seed=3)
    # these random ids end in the pad id (0) in one row only: the mask says every position is a real token (without
    # it the bridge warns of unmasked padding, UnmaskedPaddingWarning)
    mask = torch.ones_like(tokens)
    contributions, explained = explain_through_hooks(bridge, tokens, target=5, attention_mask=mask)
    total = contributions.sum((1, 2))
    assert ((total - explained).abs() / explained.abs()).max() <= 1e-4
    with torch.no_grad():  # explanation mode leaves the forward alone
        assert torch.equal(bridge(tokens, attention_mask=mask)[:, -1, 5], explained)


def test_bcos_gpt2_split_parts_are_bcos_layers_with_the_same_maths():
    hf, _, _, bridge = built("bcos_gpt2")
    attn = bridge.blocks[0].attn
    q, k, v = (getattr(attn, p).original_component for p in ("q", "k", "v"))
    assert all(isinstance(part, BcosLinear) and part.b == 1.5 for part in (q, k, v))
    # queries and keys only shape the attention pattern: constant in explanation mode, as in c_attn
    assert q.constant_outputs == slice(None) and k.constant_outputs == slice(None) and v.constant_outputs is None
    x = torch.randn(3, 5, hf.config.n_embd, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = hf.transformer.h[0].attn.c_attn(x)
        split = torch.cat([q(x), k(x), v(x)], dim=-1)
    torch.testing.assert_close(split, fused, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_run_with_cache_hooks_and_patching(name):
    _, _, _, bridge = built(name)
    clean = ids(seed=4, batch=1)
    logits, cache = bridge.run_with_cache(clean)
    assert "blocks.0.hook_resid_pre" in cache and "blocks.1.attn.hook_pattern" in cache
    pattern = cache["blocks.1.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
    ablated = bridge.run_with_hooks(clean, fwd_hooks=[("blocks.0.hook_mlp_out", lambda act, hook: act * 0)])
    assert not torch.allclose(ablated, logits)
    with torch.no_grad():
        torch.testing.assert_close(bridge(clean), logits)  # run_with_hooks removed its hook

    corrupted = clean.clone()
    corrupted[0, 3] = (clean[0, 3] + 1) % VOCAB

    def metric(out):
        return out[0, -1, 5]

    result = patching.get_act_patch_resid_pre(bridge, corrupted, cache, metric)
    assert result.shape == (bridge.cfg.n_layers, clean.shape[1])
    # patching the only corrupted position at the first layer restores the clean run
    torch.testing.assert_close(result[0, 3], metric(logits), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(result[0, 5], metric(bridge(corrupted)), rtol=1e-4, atol=1e-5)


def test_bridge_internals_check_fails_loudly_when_transformer_lens_changes(monkeypatch):
    check_bridge_internals()  # the installed TransformerLens has everything the adapter relies on
    real = bridge_module._bridge_classes()
    changed = type("LinearBridge", (torch.nn.Module,), {})  # a release whose LinearBridge lost the API we use
    monkeypatch.setattr(bridge_module, "_bridge_classes", lambda: (*real[:4], changed, real[5]))
    with pytest.raises(BcosError, match="LinearBridge.set_original_component is gone"):
        check_bridge_internals()
    with pytest.raises(BcosError, match="bridge internals changed"):
        transformer_bridge_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))


def test_bridge_error_paths():
    with pytest.raises(BcosError, match="hf_model: BertForSequenceClassification is not supported"):
        transformer_bridge_from_hf(tiny_model("BertForSequenceClassification"))
    with pytest.raises(BcosError, match="hf_model: expected a transformers model"):
        transformer_bridge_from_hf("gpt2")
    maxout = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False)
    c_attn = maxout.transformer.h[0].attn.c_attn
    c_attn.max_out = 2  # (a MaxOut fused projection: its groups are not q/k/v units)
    with pytest.raises(BcosError, match="MaxOut"):
        transformer_bridge_from_hf(maxout)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_explain_logits_works_on_the_bridge(name):
    """The package's TransformerLens explanation runs on bridges too and agrees with the bridge's hooks."""
    from bcos_plugins.adapters.transformer_lens import explain_logits

    _, _, _, bridge = built(name)
    tokens = ids(seed=3)
    mask = torch.ones_like(tokens)  # every position real (the random ids end in the pad id 0 in one row only)
    expl = explain_logits(bridge, tokens, target=5, attention_mask=mask)
    contributions, explained = explain_through_hooks(bridge, tokens, target=5, attention_mask=mask)
    torch.testing.assert_close(expl.explained, explained)
    assert expl.completeness_error.max() < 1e-4
    torch.testing.assert_close(expl.input_contributions, contributions, rtol=1e-5, atol=1e-6)


def test_public_api_names_resolve_or_explain_the_version():
    """Every name in ``__all__`` imports; the HookedTransformer names are public exactly when TL 3.x is there,
    and under 4.x each one raises an ImportError that names the version and the alternative."""
    from bcos_plugins.adapters import transformer_lens as lens_adapter

    for name in lens_adapter.__all__:
        assert getattr(lens_adapter, name) is not None, name
    hooked = set(lens_adapter._HOOKED_API)
    if lens_adapter.HAS_HOOKED_TRANSFORMER:
        assert lens_adapter.__all__[-len(hooked):] == lens_adapter._HOOKED_API
    else:
        assert not hooked & set(lens_adapter.__all__)
        for name in sorted(hooked):
            with pytest.raises(ImportError, match="transformer_bridge_from_hf"):
                getattr(lens_adapter, name)


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama"])
def test_transformer_lens_own_bridge_construction_refuses_a_bcos_model_and_leaves_it_untouched(name, tmp_path):
    """TransformerLens' boot_transformers (and build_bridge_from_module, which TransformerBridge.__init__ guards)
    would wrap the user's B-cos model in place and rebuild GPT-2's c_attn as plain layers: refused up front."""
    from transformer_lens.model_bridge import TransformerBridge

    hf = HF_MODELS[name]().eval()
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    types = {n: type(m) for n, m in hf.named_modules()}
    config = hf.config.to_dict()
    tokenizer = bridge_module._reloadable(bridge_module._placeholder_tokenizer(VOCAB), str(tmp_path))
    with pytest.raises(BcosError, match=r"hf_model: .* holds B-cos .*transformer_bridge_from_hf\(model"):
        TransformerBridge.boot_transformers("tiny", hf_model=hf, tokenizer=tokenizer)
    from transformer_lens.model_bridge.sources.transformers import boot

    with pytest.raises(BcosError, match="transformer_bridge_from_hf"):
        boot("tiny", hf_model=hf, tokenizer=tokenizer)
    with pytest.raises(BcosError, match="TransformerBridge would wrap it in place"):
        TransformerBridge(hf, adapter=None, tokenizer=tokenizer)  # any other path that builds a bridge
    assert {n: type(m) for n, m in hf.named_modules()} == types
    assert all(torch.equal(v, state[k]) for k, v in hf.state_dict().items())
    assert hf.config.to_dict() == config
    # the plain (non-B-cos) models TransformerLens handles itself still boot through it
    plain = _bilinear_llama()
    tokens = ids()
    with torch.no_grad():
        expected = plain(tokens).logits
        booted = TransformerBridge.boot_transformers("tiny", hf_model=plain, tokenizer=tokenizer)(tokens)
    torch.testing.assert_close(booted, expected, rtol=1e-4, atol=1e-5)


def test_boot_guard_fails_loudly_when_transformer_lens_changes(monkeypatch):
    from bcos_plugins.adapters._lens import boot_guard

    boot_guard.check_boot_guard()  # the installed TransformerLens has what the guard relies on
    bridge_cls, source = boot_guard._targets()
    assert boot_guard.is_guarded(bridge_cls.__init__) and boot_guard.is_guarded(source.boot)
    moved = type("transformers_source", (), {})  # a release whose boot moved elsewhere
    monkeypatch.setattr(boot_guard, "_targets", lambda: (bridge_cls, moved))
    with pytest.raises(BcosError, match=r"sources.transformers.boot\(..., hf_model=\) is gone"):
        boot_guard.check_boot_guard()
    with pytest.raises(BcosError, match="boot guard"):
        boot_guard.install_boot_guard()


# TransformerLens called directly, as its docs show it: the TransformerLens adapter is never imported
_DIRECT_BOOT = """
import sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)
{imports}
import torch, transformers as T
sys.path.insert(0, {tests!r})
from conftest import tiny_model
from transformer_lens.model_bridge import TransformerBridge
from bcos_plugins import BcosError, bcosify

model = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False)
tokens = torch.tensor([[5, 6, 7, 8]])
with torch.no_grad():
    before = model(tokens).logits
try:
    TransformerBridge.boot_transformers("tiny", hf_model=model,
                                       tokenizer=T.AutoTokenizer.from_pretrained({tokenizer!r}))
    print("booted")
except BcosError as error:
    print(type(error).__name__, str(error).split(";")[0])
with torch.no_grad():
    print("logits unchanged:", torch.equal(model(tokens).logits, before))
print("adapter imported:", "bcos_plugins.adapters.transformer_lens" in sys.modules)
"""


@pytest.mark.parametrize("imports", ["import bcos_plugins\nimport transformer_lens",
                                     "import transformer_lens\nimport bcos_plugins"])
def test_transformer_lens_own_boot_refuses_a_bcos_model_without_the_adapter_imported(imports, tmp_path):
    """Whoever calls TransformerLens' boot_transformers directly never imports the TransformerLens adapter, whose
    import installed the guard: TransformerLens rewrote the B-cos GPT-2 in place (logits moved by 0.27) and
    explain then reported it inexact. import bcos_plugins installs the guard, in either import order."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    bridge_module._reloadable(bridge_module._placeholder_tokenizer(VOCAB), str(tmp_path))  # saves it there
    script = _DIRECT_BOOT.format(imports=imports, tests=str(Path(__file__).parent), tokenizer=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "BcosTypeError hf_model: GPT2LMHeadModel holds B-cos (dynamic-weight) modules",
        "logits unchanged: True", "adapter imported: False"], out.stdout + out.stderr[-3000:]


def test_a_bridge_without_tokenizer_refuses_text_instead_of_reading_it_as_token_0():
    """The TransformerLens page's form, transformer_bridge_from_hf(hf) without tokenizer=: text used to become t0."""
    _, _, _, bridge = built("bcos_gpt2")
    for text_call in (lambda: bridge.to_tokens("Once upon a time"), lambda: bridge.to_str_tokens("Once upon a time"),
                      lambda: bridge("Once upon a time"), lambda: bridge.run_with_cache("Once upon a time")):
        with pytest.raises(BcosError, match=r"tokenizer: this bridge was built without tokenizer=.*tokenizer="):
            text_call()
    tokens = ids(batch=1)
    assert bridge.to_str_tokens(tokens[0]) == [f"t{int(i)}" for i in tokens[0]]  # ids still read and decode
    assert bridge(tokens).shape == (1, tokens.shape[1], VOCAB)


def test_a_bridge_with_the_models_tokenizer_reads_text(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {w: i for i, w in enumerate(["<unk>", "once", "upon", "a", "time"])}
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<unk>",
                                          eos_token="<unk>")
    hf, _, _, _ = built("bcos_gpt2")
    bridge = transformer_bridge_from_hf(hf, tokenizer=tokenizer)
    assert bridge.to_tokens("once upon a time", prepend_bos=False).tolist() == [[1, 2, 3, 4]]


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama"])
def test_transformer_lens_head_results_are_exact_on_bcos_bridges(name):
    """TransformerLens' own per-head results on a B-cos bridge are each head's share of the forward's attn_out
    (hook_z @ raw W_O missed it by about its own size): they sum to attn_out per layer."""
    _, _, _, bridge = built(name)
    n_layers, n_heads = bridge.cfg.n_layers, bridge.cfg.n_heads
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids())
        heads, labels = cache.stack_head_results(layer=n_layers, return_labels=True)
        cache.compute_head_results()
    assert labels == [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    for layer in range(n_layers):
        attn_out = cache[("attn_out", layer)]
        per_layer = heads[layer * n_heads:(layer + 1) * n_heads].sum(0)
        assert ((per_layer - attn_out).abs().max() / attn_out.abs().max()) <= 1e-5
        assert torch.equal(cache[("result", layer, "attn")].sum(-2), per_layer)
    # the shares are checked against the cached attn_out: where something follows the output projection (Gemma 2's
    # post-attention norm; here a doctored cache) or attn_out was not cached, refused instead of returned
    cache.cache_dict["blocks.1.hook_attn_out"] = 2 * cache.cache_dict["blocks.1.hook_attn_out"]
    with pytest.raises(BcosError, match="layer 1 attention output is not its output projection's"):
        cache.stack_head_results(layer=n_layers)
    del cache.cache_dict["blocks.1.hook_attn_out"]
    with pytest.raises(BcosError, match="lacks hook_attn_out"):
        cache.compute_head_results()
    # a cache without its batch dimension: TransformerLens 3.9 would recompute from the raw W_O, so refused
    with torch.no_grad():
        _, single = bridge.run_with_cache(ids(batch=1), remove_batch_dim=True)
    with pytest.raises(BcosError, match="no batch dimension .*remove_batch_dim=False"):
        single.stack_head_results(layer=n_layers)


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama"])
def test_transformer_lens_neuron_results_are_exact_on_bcos_bridges(name):
    """TransformerLens' per-neuron results on a B-cos bridge are each neuron's share of the forward's mlp_out
    (hook_post @ raw W_out missed it by about its own size), with TransformerLens' slicing and projection."""
    _, _, _, bridge = built(name)
    n_layers, d_mlp = bridge.cfg.n_layers, bridge.cfg.d_mlp
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids())
        neurons, labels = cache.stack_neuron_results(n_layers, return_labels=True)
        direction = torch.randn(bridge.cfg.d_model, generator=torch.Generator().manual_seed(0))
        full = cache.get_neuron_results(1)
        projected = cache.get_neuron_results(1, project_output_onto=direction)
        one = cache.get_neuron_results(1, neuron_slice=3, pos_slice=-1)
    assert labels == [f"L{layer}N{n}" for layer in range(n_layers) for n in range(d_mlp)]
    for layer in range(n_layers):
        mlp_out = cache[("mlp_out", layer)]
        assert ((neurons[layer * d_mlp:(layer + 1) * d_mlp].sum(0) - mlp_out).abs().max() / mlp_out.abs().max()
                ) <= 1e-5
    torch.testing.assert_close(projected, full @ direction)
    torch.testing.assert_close(one, full[:, -1, 3])


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama"])
def test_transformer_lens_raw_weight_decompositions_refuse_on_bcos_bridges_naming_the_exact_alternative(name):
    """Where TransformerLens' path still reads raw W_out (the fused norm-and-project path of stack_neuron_results,
    also through get_full_resid_decomposition), a B-cos bridge raises instead of returning wrong numbers."""
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition

    _, _, _, bridge = built(name)
    tokens = ids()
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens)
    alternatives = r"token_component_decomposition\(bridge.*explain_logits.*hooked_transformer_from_hf"
    direction = torch.ones(bridge.cfg.d_model)
    with pytest.raises(BcosError, match=r"ActivationCache.stack_neuron_results: .*apply_ln=True and "
                                        r"project_output_onto=.*" + alternatives):
        cache.stack_neuron_results(bridge.cfg.n_layers, apply_ln=True, project_output_onto=direction)
    with pytest.raises(BcosError, match=r"ActivationCache.stack_neuron_results: .*" + alternatives):
        cache.get_full_resid_decomposition(expand_neurons=True, apply_ln=True, project_output_onto=direction)
    # without the fused path the full decomposition stacks the exact head and neuron results
    resid = cache[("resid_post", bridge.cfg.n_layers - 1)]
    for expand_neurons in (False, True):
        total = cache.get_full_resid_decomposition(expand_neurons=expand_neurons).sum(0)
        assert ((total - resid).abs().max() / resid.abs().max()) <= 1e-5
    # the alternative the messages name is exact on this bridge
    table = token_component_decomposition(bridge, tokens, target=5)
    assert table.completeness_error.max() < 1e-4


def test_transformer_lens_decompositions_keep_their_behaviour_on_bridges_without_bcos_projections():
    """A bilinear (or plain) model's W_O / W_out are the weights its forward applies: TransformerLens' own per-head
    and per-neuron results stay available there, and sum to attn_out / mlp_out."""
    _, _, _, bridge = built("bilinear_llama")
    n_layers = bridge.cfg.n_layers
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids())
        heads = cache.stack_head_results(layer=n_layers)
        neurons = cache.stack_neuron_results(layer=n_layers)
    attn_out = sum(cache[("attn_out", layer)] for layer in range(n_layers))
    mlp_out = sum(cache[("mlp_out", layer)] for layer in range(n_layers))
    torch.testing.assert_close(heads.sum(0), attn_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(neurons.sum(0), mlp_out, rtol=1e-4, atol=1e-5)


def test_logit_attrs_on_a_plain_bridge_sums_to_the_logit_less_b_u_and_the_users_tied_head_stays_tied():
    """The final norm's gain and bias go into the bridge copy's LM head (logit_attrs leaves b_U out, as for
    TransformerLens' own folded models); the user's GPT-2 keeps its values and its head tied to the embeddings."""
    hf = tiny_model("GPT2LMHeadModel").eval()
    with torch.no_grad():
        hf.transformer.ln_f.weight.normal_(1, 0.5, generator=torch.Generator().manual_seed(0))
        hf.transformer.ln_f.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    bridge = transformer_bridge_from_hf(hf)
    assert all(torch.equal(v, state[k]) for k, v in hf.state_dict().items())
    assert hf.lm_head.weight is hf.transformer.wte.weight
    tokens = ids()
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)
        expected = hf(tokens).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    target = logits.argmax(-1)
    logit = logits.gather(-1, target[..., None])[..., 0]
    attrs = cache.logit_attrs(cache.decompose_resid(), tokens=target).sum(0)
    assert bridge.b_U.abs().max() > 1e-3  # the bias' share is real, and outside the decomposition
    torch.testing.assert_close(attrs + bridge.b_U[target], logit, rtol=1e-5, atol=1e-5)


def test_cache_guard_fails_loudly_when_transformer_lens_moves_what_it_reads(monkeypatch):
    from bcos_plugins.adapters._lens import boot_guard
    from transformer_lens import ActivationCache

    assert all(boot_guard.is_guarded(vars(ActivationCache)[n]) for n in boot_guard.CACHE_WEIGHT_READERS)

    class NewReader(ActivationCache):  # a release with another method reading the raw output weights
        def head_contributions(self):
            return self["z", 0] * self.model.blocks[0].attn.W_O

    monkeypatch.setattr(boot_guard, "_cache_target", lambda: NewReader)
    with pytest.raises(BcosError, match=r"\['head_contributions'\] now read W_O / W_out"):
        boot_guard.check_boot_guard()
    renamed = type("RenamedCache", (), {name: lambda self: None for name in boot_guard.CACHE_WEIGHT_READERS[1:]})
    monkeypatch.setattr(boot_guard, "_cache_target", lambda: renamed)
    with pytest.raises(BcosError, match=r"ActivationCache no longer defines \['compute_head_results'\]"):
        boot_guard.check_boot_guard()


def test_a_cpu_models_bridge_stays_on_the_cpu_of_a_machine_with_cuda(monkeypatch):
    """TransformerLens boots a bridge on its default device (CUDA wherever one is present) unless told otherwise: a
    CPU model's bridge on a GPU machine went to the GPU and its cache decompositions mixed devices (found on an H200).
    The machine's CUDA is simulated: before the fix the boot moved the copy to "cuda", which this CPU build refuses."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    hf = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5)
    bridge = transformer_bridge_from_hf(hf)
    assert {p.device.type for p in bridge.parameters()} == {"cpu"}
    assert torch.device(bridge.cfg.device).type == "cpu"
    _, cache = bridge.run_with_cache(ids())
    stack = cache.get_full_resid_decomposition(expand_neurons=True)
    assert stack.device.type == "cpu"
