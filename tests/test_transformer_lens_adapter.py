"""TransformerLens adapter: bilinear and B-cos transformers as HookedTransformers."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
import transformers as T
from bcos_plugins.adapters._lens import activation as lens_activation
from bcos_plugins.adapters.transformer_lens import (
    BcosHookedTransformer,
    BcosTransformerConfig,
    bcos_model_class,
    bilinear_config,
    explain_logits,
    hooked_transformer_from_hf,
    make_explainable,
)
from conftest import VOCAB, padded_batch, tiny_config, tiny_model
from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig
from transformer_lens import HookedTransformer, HookedTransformerConfig, patching
from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

from bcos_plugins import bcosify, explain, explanation_mode
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)

SIZE = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=40, n_ctx=16, device="cpu")
GPT2_LIKE = dict(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard")
LLAMA_LIKE = dict(act_fn="silu", gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary",
                  n_key_value_heads=2)


def tokens(seed: int = 1, batch: int = 3, length: int = 9, vocab: int = 40) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def tiny_bilinear(seed: int = 0, **kw) -> HookedTransformer:
    size = {k: v for k, v in SIZE.items() if k != "d_head"}
    return HookedTransformer(bilinear_config(**size, seed=seed, **kw)).eval()


def tiny_bcos(layout: dict, seed: int = 0, **kw) -> BcosHookedTransformer:
    return BcosHookedTransformer(BcosTransformerConfig(**SIZE, **layout, seed=seed, bcos_b=1.5, **kw)).eval()


def tiny_plain(seed: int = 0) -> HookedTransformer:
    return HookedTransformer(HookedTransformerConfig(**SIZE, **GPT2_LIKE, seed=seed)).eval()


# ---------------------------------------------------------------- bilinear: the "linear" activation


def test_linear_activation_registered_idempotently():
    assert SUPPORTED_ACTIVATIONS["linear"] is lens_activation.identity_activation
    importlib.reload(lens_activation)  # a second import registers nothing new and does not raise
    lens_activation.register_linear_activation()
    assert SUPPORTED_ACTIVATIONS["linear"](torch.tensor([-2.0, 3.0])).tolist() == [-2.0, 3.0]


def test_foreign_linear_registration_is_not_clobbered():
    original = SUPPORTED_ACTIVATIONS["linear"]
    SUPPORTED_ACTIVATIONS["linear"] = torch.relu
    try:
        with pytest.raises(RuntimeError, match="already registered"):
            lens_activation.register_linear_activation()
        assert SUPPORTED_ACTIVATIONS["linear"] is torch.relu
    finally:
        SUPPORTED_ACTIVATIONS["linear"] = original


def test_bilinear_identity_through_hooks():
    model = tiny_bilinear()
    assert model.cfg.gated_mlp and model.cfg.act_fn == "linear"
    _, cache = model.run_with_cache(tokens())
    for layer in range(2):
        pre, pre_lin, post = (cache[f"blocks.{layer}.mlp.{h}"] for h in ("hook_pre", "hook_pre_linear", "hook_post"))
        torch.testing.assert_close(post, pre * pre_lin, rtol=0, atol=0)
        assert post.abs().max() > 0
    biases = {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1].startswith(("b_", "_b_"))}
    assert biases and all(p.detach().abs().max() == 0 for p in biases.values())


def test_bilinear_config_refuses_non_bilinear_overrides():
    with pytest.raises(ValueError, match="fixes 'act_fn'"):
        bilinear_config(d_model=16, n_layers=1, n_heads=4, d_mlp=8, d_vocab=10, n_ctx=8, act_fn="gelu")
    with pytest.raises(ValueError, match="not divisible"):
        bilinear_config(d_model=15, n_layers=1, n_heads=4, d_mlp=8, d_vocab=10, n_ctx=8)


# ---------------------------------------------------------------- hooks and names


@pytest.mark.parametrize("layout", [GPT2_LIKE, LLAMA_LIKE], ids=["gpt2_like", "llama_like"])
def test_bcos_cache_keys_are_standard_names_plus_bcos_scales(layout):
    plain = HookedTransformer(HookedTransformerConfig(**SIZE, **layout, seed=0)).eval()
    bcos = tiny_bcos(layout)
    _, plain_cache = plain.run_with_cache(tokens())
    _, bcos_cache = bcos.run_with_cache(tokens())
    extra = set(bcos_cache.keys()) - set(plain_cache.keys())
    assert set(plain_cache.keys()) <= set(bcos_cache.keys())
    assert extra and all(k.split(".")[-1].startswith("hook_bcos_scale_") for k in extra)
    assert {"blocks.0.attn.hook_bcos_scale_o", "blocks.1.mlp.hook_bcos_scale_out"} <= extra
    assert not [k for k in bcos.state_dict() if k.rsplit(".", 1)[-1].startswith(("b_", "_b_")) or k.endswith(".b")]


def test_bcos_scale_hook_is_the_bcos_factor():
    model = tiny_bcos(GPT2_LIKE)
    _, cache = model.run_with_cache(tokens())
    mlp = model.blocks[0].mlp
    x = cache["blocks.0.ln2.hook_normalized"] * model.blocks[0].ln2.w
    unit = mlp.W_in / mlp.W_in.norm(dim=0, keepdim=True)
    cos = (x @ unit) / x.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_bcos_scale_in"], cos.abs() ** 0.5, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_pre"], cos.abs() ** 0.5 * (x @ unit), rtol=1e-4, atol=1e-5)


def test_bcos_use_attn_result_splits_the_output_by_head():
    model = tiny_bcos(GPT2_LIKE, use_attn_result=True)
    reference = tiny_bcos(GPT2_LIKE)
    reference.load_state_dict(model.state_dict())
    ids = tokens()
    logits, cache = model.run_with_cache(ids)
    torch.testing.assert_close(cache["blocks.1.attn.hook_result"].sum(2), cache["blocks.1.hook_attn_out"])
    torch.testing.assert_close(logits, reference(ids), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reuse", [False, True], ids=["default", "reuse_unit_weights"])
def test_cached_unit_weights_follow_parameter_updates(reuse):
    from bcos_plugins.nn import reuse_unit_weights

    model = tiny_bcos(LLAMA_LIKE)
    ids = tokens()
    with reuse_unit_weights(reuse), torch.no_grad():
        first = model(ids)
        model.blocks[0].mlp.W_in.add_(torch.linspace(-0.5, 0.5, 16)[:, None])  # in place: new directions
        model.blocks[1].attn._W_K.add_(0.1)
        second = model(ids)
    fresh = tiny_bcos(LLAMA_LIKE)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(first, second)
        torch.testing.assert_close(second, fresh(ids))
    torch.testing.assert_close(model(ids), second)  # grad mode recomputes: same values


def test_bcos_generate_with_kv_cache_matches_without():
    # exercises the B-cos attention's KV-cache path (rotary offsets, causal mask offset, GQA)
    model = tiny_bcos(LLAMA_LIKE)
    ids = tokens(batch=2, length=5)
    kwargs = dict(max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False)
    cached = model.generate(ids, use_past_kv_cache=True, **kwargs)
    assert torch.equal(cached, model.generate(ids, use_past_kv_cache=False, **kwargs))
    assert cached.shape == (2, 10)


# ---------------------------------------------------------------- completeness


MODELS = {
    "bilinear": lambda: make_explainable(tiny_bilinear()),
    "bcos_gpt2_like": lambda: tiny_bcos(GPT2_LIKE),
    "bcos_llama_like": lambda: tiny_bcos(LLAMA_LIKE),
    "bcos_mlp_and_out_only": lambda: tiny_bcos(GPT2_LIKE, bcos_projections=("W_O", "W_in", "W_out")),
    "plain_gpt2_like": lambda: make_explainable(tiny_plain()),
    # a cap small enough to bite on the tiny model's logits (Gemma 2's final-logit soft-cap)
    "bcos_soft_capped": lambda: tiny_bcos(LLAMA_LIKE, output_logits_soft_cap=0.5),
}


def test_bcos_soft_cap_is_applied_once_in_the_unembedding():
    """A B-cos config takes TransformerLens' output_logits_soft_cap off its inline place in the forward and the
    unembedding applies it as a dynamic scale: the logits are cap * tanh(z / cap) of the uncapped z, capped once."""
    model = tiny_bcos(LLAMA_LIKE, output_logits_soft_cap=0.5)
    assert model.cfg.output_logits_soft_cap == -1.0 and model.cfg.bcos_output_logits_soft_cap == 0.5
    logits, cache = model.run_with_cache(tokens())
    uncapped = cache["unembed.hook_out"]
    assert uncapped.abs().max() > 0.5  # the cap changes the logits
    torch.testing.assert_close(logits, 0.5 * torch.tanh(uncapped / 0.5), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache["unembed.hook_soft_cap"] * uncapped, logits)


@pytest.mark.parametrize("name", list(MODELS))
def test_contributions_at_embeddings_sum_to_the_logit(name):
    model = MODELS[name]()
    ids = tokens()
    with torch.no_grad():
        before = model(ids)
    result = explain_logits(model, ids)
    assert result.completeness_error.max() < 1e-4, result.completeness_error
    assert torch.equal(result.target, before[:, -1].argmax(-1))
    torch.testing.assert_close(result.logits, before[torch.arange(3), -1, result.target])
    expected_hooks = {"hook_embed"} | ({"hook_pos_embed"} if "hook_pos_embed" in model.hook_dict else set())
    assert set(result.hook_contributions) == expected_hooks
    contrastive = explain_logits(model, ids, target=5, foil=7, position=4)
    torch.testing.assert_close(contrastive.logits, before[:, 4, 5] - before[:, 4, 7])
    assert contrastive.completeness_error.max() < 1e-4
    with torch.no_grad(), explanation_mode(model):
        assert torch.equal(model(ids), before)  # forward values unchanged by explanation mode


def test_without_explanation_mode_input_times_gradient_is_not_complete():
    # the bilinear MLP is homogeneous of degree 2: its share is counted twice without a constant branch
    model = tiny_bilinear()
    ids = tokens()
    leaves = {}

    def capture(act, hook):
        leaves[hook.name] = act.detach().requires_grad_(True)
        return leaves[hook.name]

    logit = model.run_with_hooks(ids, fwd_hooks=[("hook_embed", capture)])[:, -1, 3]
    grad = torch.autograd.grad(logit.sum(), leaves["hook_embed"])[0]
    total = (leaves["hook_embed"] * grad).sum((1, 2))
    assert ((total - logit).abs() / logit.abs()).max() > 1e-2


def test_padding_positions_with_attention_mask():
    model = tiny_bcos(GPT2_LIKE)
    ids, mask = padded_batch(batch=3, length=9)
    ids = ids % 40
    result = explain_logits(model, ids, attention_mask=mask)
    assert result.position.tolist() == (mask.sum(1) - 1).tolist()
    assert result.completeness_error.max() < 1e-4
    assert result.contributions[mask == 0].abs().max() == 0  # right padding: nothing after the position


def test_explain_requires_explainable_model_and_token_ids():
    with pytest.raises(TypeError, match="make_explainable"):
        explain_logits(tiny_plain(), tokens())
    with pytest.raises(TypeError, match="to_tokens"):
        explain_logits(tiny_bcos(GPT2_LIKE), tokens().float())
    model = tiny_bcos(GPT2_LIKE)
    with pytest.raises(ValueError, match="target: ids must lie in"):
        explain_logits(model, tokens(), target=model.cfg.d_vocab)
    with pytest.raises(ValueError, match="foil: expected an int or one id per row"):
        explain_logits(model, tokens(), target=1, foil=torch.tensor([1, 2, 3, 4, 5]))


def test_explain_logits_positions_mean_what_explain_means():
    """-1 is each row's last real token (not the last column); positions outside the row raise."""
    model = tiny_bcos(GPT2_LIKE)
    ids = tokens()
    lengths = torch.tensor([ids.shape[1], ids.shape[1] - 2, ids.shape[1] - 4][: ids.shape[0]])
    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
    expl = explain_logits(model, ids, target=1, position=-1, attention_mask=mask)
    assert expl.position.tolist() == (lengths - 1).tolist()
    with pytest.raises(ValueError, match="position: .* is outside"):
        explain_logits(model, ids, target=1, position=100)
    with pytest.raises(ValueError, match="is a padding token"):
        explain_logits(model, ids, target=1, position=ids.shape[1] - 1, attention_mask=mask)


def test_bcos_training_mode_keeps_gradients_through_dynamic_weights():
    model = tiny_bcos(GPT2_LIKE).train()
    ids = tokens()
    model(ids, return_type="loss").backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and g.abs().max() > 0 for n, g in grads.items() if "W_" in n), grads.keys()
    model.zero_grad()
    with explanation_mode(model):
        model(ids, return_type="loss").backward()
    # in explanation mode the dynamic weights are constants: queries and keys get no gradient
    assert model.blocks[0].attn.W_Q.grad is None or model.blocks[0].attn.W_Q.grad.abs().max() == 0


# ---------------------------------------------------------------- transformers -> TransformerLens


def _bilinear_llama(seed: int = 0):
    config = tiny_config("llama")
    config.hidden_act = "linear"
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(config).eval()


def _gemma2():
    """The conformance suite's tiny Gemma 2 (soft-caps that bite, every other layer a window of 4)."""
    from test_conformance import CONFIGS

    torch.manual_seed(0)
    return T.Gemma2ForCausalLM(CONFIGS["Gemma2"]()).eval()


HF_MODELS = {
    "bcos_gpt2": lambda: bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False),
    "bcos_gemma2": lambda: bcosify(_gemma2(), b=1.1, verbose=False),
    "bcos_llama": lambda: bcosify(tiny_model("LlamaForCausalLM"), b=1.1, verbose=False),
    "bilinear_llama": _bilinear_llama,
    "bcos_bilinear_llama": lambda: bcosify(_bilinear_llama(), b=2.0, verbose=False),
    "plain_gpt2": lambda: tiny_model("GPT2LMHeadModel"),
}


def _lens_of(name, hf):
    """The HookedTransformer of ``hf``; None where this transformers is too old for the family's conversion, after
    checking that it is refused naming the version to install (Gemma 2 below GEMMA2_MIN_TRANSFORMERS)."""
    from bcos_plugins.adapters._lens.conversions.gemma2 import GEMMA2_MIN_TRANSFORMERS
    from packaging.version import Version

    if "gemma2" in name and Version(T.__version__) < Version(GEMMA2_MIN_TRANSFORMERS):
        with pytest.raises(BcosValueError, match=rf"needs transformers >= {GEMMA2_MIN_TRANSFORMERS}.*Upgrade"):
            hooked_transformer_from_hf(hf)
        return None
    return hooked_transformer_from_hf(hf)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hf_to_lens_logits_match(name):
    hf = HF_MODELS[name]()
    lens = _lens_of(name, hf)
    if lens is None:
        return
    assert isinstance(lens, BcosHookedTransformer) == name.startswith("bcos")
    ids, mask = padded_batch(batch=3, length=9)
    with torch.no_grad():
        expected = hf(ids).logits
        got = lens(ids)
    assert ((got - expected).abs().max() / expected.abs().max()) <= 1e-4
    with torch.no_grad():  # right padding: the real positions agree with the masked HF forward too
        masked = hf(ids, attention_mask=mask).logits
        got_masked = lens(ids, attention_mask=mask)
    real = mask.bool()
    assert ((got_masked[real] - masked[real]).abs().max() / masked.abs().max()) <= 1e-4


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama", "bcos_bilinear_llama", "bcos_gemma2"])
def test_hf_and_lens_explanations_agree(name):
    # B-cosified HF models only: the core explain() on a stock HF model is plain input x gradient, while
    # the TransformerLens model is made explainable (detached norms, gates, pattern).
    hf = HF_MODELS[name]()
    lens = _lens_of(name, hf)
    if lens is None:
        return
    ids, mask = padded_batch(batch=3, length=9)
    ours = explain_logits(lens, ids, attention_mask=mask)  # default: top prediction at the last real token
    with torch.no_grad():
        top = hf(ids, attention_mask=mask).logits[torch.arange(3), mask.sum(1) - 1].argmax(-1)
    assert torch.equal(ours.target, top)
    reference = explain(hf, ids, mask, target=ours.target)
    torch.testing.assert_close(ours.logits, reference.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.contributions, reference.contributions, rtol=1e-3, atol=1e-5)
    assert ours.completeness_error.max() < 1e-4


def test_hf_to_lens_attaches_an_in_memory_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = T.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    lens = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), verbose=False), tokenizer=tok)
    assert lens.to_tokens("w5 w7", prepend_bos=False).tolist() == [[8, 10]]
    assert lens.to_str_tokens(torch.tensor([8, 10])) == ["w5", "w7"]


def test_hf_to_lens_error_paths():
    with pytest.raises(TypeError, match="supports GPT2LMHeadModel, LlamaForCausalLM"):
        hooked_transformer_from_hf(tiny_model("BertForSequenceClassification"))
    biased = tiny_config("llama")
    biased.attention_bias = True
    with pytest.raises(ValueError, match="attention_bias"):
        hooked_transformer_from_hf(T.LlamaForCausalLM(biased))
    scaled = tiny_config("llama")
    scaled.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope_type='linear'"):
        hooked_transformer_from_hf(T.LlamaForCausalLM(scaled))
    quick = tiny_config("gpt2")
    quick.activation_function = "quick_gelu"
    with pytest.raises(ValueError, match="'quick_gelu' .* no TransformerLens counterpart"):
        hooked_transformer_from_hf(T.GPT2LMHeadModel(quick))


def test_bcos_config_error_paths():
    with pytest.raises(ValueError, match="bcos_max_out=2.*MaxOut"):
        BcosTransformerConfig(**SIZE, **GPT2_LIKE, bcos_max_out=2)
    with pytest.raises(ValueError, match=r"b: must be a finite number in \[1, 10\], got 0.5"):
        BcosTransformerConfig(**SIZE, **GPT2_LIKE, bcos_b=0.5)
    with pytest.raises(ValueError, match=r"\['W_gate'\] are not projections"):
        BcosTransformerConfig(**SIZE, **GPT2_LIKE, bcos_projections=("W_O", "W_gate"))
    with pytest.raises(ValueError, match="positional_embedding_type='alibi'"):
        BcosTransformerConfig(**SIZE, act_fn="gelu", positional_embedding_type="alibi")
    with pytest.raises(ValueError, match="act_fn='solu'"):
        BcosTransformerConfig(**SIZE, act_fn="solu")
    with pytest.raises(ValueError, match="output_logits_soft_cap=30.0 and bcos_output_logits_soft_cap=20.0 disagree"):
        BcosTransformerConfig(**SIZE, **GPT2_LIKE, output_logits_soft_cap=30.0, bcos_output_logits_soft_cap=20.0)
    # TransformerLens' forward caps inline, which a plain model cannot hold constant
    capped = HookedTransformer(HookedTransformerConfig(**SIZE, **GPT2_LIKE, output_logits_soft_cap=30.0))
    with pytest.raises(ValueError, match="output_logits_soft_cap=30.0 applies tanh to the logits inline"):
        make_explainable(capped)
    with pytest.raises(TypeError, match="bcos_output_logits_soft_cap=30.0.*its logits are not capped"):
        make_explainable(HookedTransformer(BcosTransformerConfig(**SIZE, **GPT2_LIKE, output_logits_soft_cap=30.0)))
    with pytest.raises(TypeError, match="needs a BcosTransformerConfig"):
        BcosHookedTransformer(HookedTransformerConfig(**SIZE, **GPT2_LIKE))
    solu = HookedTransformer(HookedTransformerConfig(**SIZE, act_fn="solu_ln", normalization_type="LN"))
    with pytest.raises(ValueError, match="solu_ln"):
        make_explainable(solu)


def test_make_explainable_is_idempotent_and_refuses_hooked_points():
    model = make_explainable(tiny_plain())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert make_explainable(model) is model
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    fresh = tiny_plain()
    fresh.blocks[0].attn.hook_pattern.add_hook(lambda act, hook: act)
    with pytest.raises(RuntimeError, match="before adding hooks"):
        make_explainable(fresh)


# ---------------------------------------------------------------- TransformerLens and sae-lens tools


def test_activation_patching_runs_and_restores_the_clean_run():
    model = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), verbose=False))
    clean = tokens(vocab=VOCAB, batch=1)
    corrupted = clean.clone()
    corrupted[0, 3] = (clean[0, 3] + 1) % VOCAB
    clean_logits, clean_cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[0, -1, 5]

    result = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert result.shape == (model.cfg.n_layers, clean.shape[1])
    # patching the only corrupted position at the first layer restores the clean run exactly
    torch.testing.assert_close(result[0, 3], metric(clean_logits), rtol=1e-5, atol=1e-6)
    corrupted_metric = metric(model(corrupted))
    torch.testing.assert_close(result[0, 5], corrupted_metric, rtol=1e-5, atol=1e-6)
    assert not torch.isclose(corrupted_metric, metric(clean_logits))


@pytest.mark.parametrize("layout", [GPT2_LIKE, LLAMA_LIKE], ids=["gpt2_like", "llama_like"])
def test_hooked_sae_transformer_from_our_config_accepts_an_sae(layout):
    cfg = BcosTransformerConfig(**SIZE, **layout, seed=0, bcos_b=1.5)
    model = bcos_model_class(HookedSAETransformer)(cfg).eval()
    reference = BcosHookedTransformer(cfg).eval()
    reference.load_state_dict(model.state_dict())
    ids = tokens()
    torch.testing.assert_close(model(ids), reference(ids))  # the MLP wrapper sae-lens adds wraps B-cos modules
    sae_cfg = StandardSAEConfig(d_in=16, d_sae=32, device="cpu")
    sae_cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    torch.manual_seed(0)
    sae = StandardSAE(sae_cfg)
    model.add_sae(sae, use_error_term=True)
    assert "blocks.0.hook_resid_post" in model.acts_to_saes
    logits, cache = model.run_with_cache(ids)
    torch.testing.assert_close(logits, reference(ids), rtol=1e-4, atol=1e-5)  # error term: same output
    acts = cache["blocks.0.hook_resid_post.hook_sae_acts_post"]
    assert acts.shape == (3, 9, 32) and acts.abs().max() > 0
    model.reset_saes()
    lens = hooked_transformer_from_hf(bcosify(tiny_model("LlamaForCausalLM"), b=1.1, verbose=False),
                                      model_class=HookedSAETransformer)
    assert isinstance(lens, HookedSAETransformer) and isinstance(lens, BcosHookedTransformer)


@pytest.mark.parametrize("sniffed", ["llama", "Gemma"])
def test_hooked_transformer_from_hf_names_a_temporary_directory_transformer_lens_reads_as_a_model_name(
        sniffed, tmp_path, monkeypatch):
    """TransformerLens' convert_hf_model_config takes the architecture from "llama" / "gemma" in the config folder's
    path; under a temporary directory whose path holds one, the conversion says so and names TMPDIR (was a
    RecursionError: the folder was redrawn without end under the same directory)."""
    import tempfile

    from bcos_plugins.errors import BcosRuntimeError

    parent = tmp_path / f"home_{sniffed}"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    model = tiny_model("GPT2LMHeadModel")
    with pytest.raises(BcosRuntimeError, match=f"contains '{sniffed.lower()}'.*Set TMPDIR"):
        hooked_transformer_from_hf(model)
    monkeypatch.undo()
    hooked_transformer_from_hf(model)  # the same model converts under another directory
