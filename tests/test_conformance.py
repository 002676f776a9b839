"""The conformance suite every entry of the architecture registry (``bcos_plugins.convert.architectures.SPECS``)
must pass: adding an architecture means adding its spec and its tiny config to :data:`CONFIGS` below.

For every registered class, from a tiny random config (2 layers, d_model 32): ``bcosify`` and its report,
``explain`` complete to 1e-4 relative (target, foil, position; no, left and right padding) on the model's own
outputs, ``load_bcos_model`` round trip with bit-identical outputs, Captum's ``BcosAttribution`` through
``EmbeddingForward`` and ``LayerBcos`` (classifiers and causal LMs), inseq's ``load_model(m, "bcos")`` (causal
LMs), TransformerLens' ``hooked_transformer_from_hf`` (classes with a converter, TransformerLens 3.x) and
``transformer_bridge_from_hf`` (classes the registry marks for the bridge).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import MAX_POS, VOCAB, hooked_transformer_from_hf_or_none, padded_batch, tiny_config

from bcos_plugins import UnsupportedModuleError, bcosify, explain, load_bcos_model
from bcos_plugins.attribution import has_dynamic_weights
from bcos_plugins.attribution.text import real_token_position_ids
from bcos_plugins.convert.architectures import REFUSED_ARCHITECTURES, SPECS, specs_where, stock_class
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

RTOL = 1e-4
B = 1.25


def _rotary(config_class, **extra):
    return lambda: config_class(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=MAX_POS,
                                num_labels=3, pad_token_id=0, bos_token_id=2, eos_token_id=2, **extra)


# One tiny config per family, keyed by the class-name prefix of its registry entries.
CONFIGS = {
    "Bert": lambda: tiny_config("bert"),
    "DistilBert": lambda: tiny_config("distilbert"),
    "Roberta": lambda: tiny_config("roberta"),
    "GPT2": lambda: tiny_config("gpt2"),
    "Llama": lambda: tiny_config("llama"),
    # a window shorter than the test sequences, so that the sliding-window mask matters
    "Mistral": _rotary(T.MistralConfig, sliding_window=4),
    "Qwen2": _rotary(T.Qwen2Config),
    "Qwen3": _rotary(T.Qwen3Config, head_dim=8),  # Qwen3Config's head_dim defaults to 128
    # soft-caps small enough to bite on a tiny random model's logits; every other layer a sliding window
    "Gemma2": _rotary(T.Gemma2Config, head_dim=8, sliding_window=4, final_logit_softcapping=0.5,
                      attn_logit_softcapping=0.5, query_pre_attn_scalar=8),
    # every other layer local, with a window shorter than the test sequences; mean pooling (padding matters)
    "ModernBert": lambda: T.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=MAX_POS, local_attention=4, global_attn_every_n_layers=2, num_labels=3,
        pad_token_id=0, bos_token_id=2, eos_token_id=2, cls_token_id=2, sep_token_id=2,
        classifier_pooling="mean"),
}
SIDES = ["none", "left", "right"]
NAMES = sorted(SPECS)


def _family(name: str) -> str:
    matches = [prefix for prefix in CONFIGS if name.startswith(prefix)]
    assert matches, (f"{name} is in the registry (SPECS or REFUSED_ARCHITECTURES) but its family has no tiny config "
                     "in tests/test_conformance.py CONFIGS")
    return max(matches, key=len)


def _stock(name: str, seed: int = 0, **config_overrides):
    """The stock model ``name`` with random weights from its family's tiny config (each of ``config_overrides`` set on
    it) and random non-zero biases, in eval mode: the one builder of such models (test_trust_families,
    test_trust_pass20_convert and test_leftovers_s22 use it with their overrides)."""
    config = CONFIGS[_family(name)]()
    for field, value in config_overrides.items():
        setattr(config, field, value)
    torch.manual_seed(seed)
    model = stock_class(name)(config).eval()
    with torch.no_grad():  # transformers initialises biases at 0: non-zero ones make a lost bias visible
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0, 0.2)
    return model


_CONVERTED: dict[str, torch.nn.Module] = {}


def _converted(name: str):
    """The B-cos model of ``name`` (built once per session; tests must not modify it)."""
    if name not in _CONVERTED:
        _CONVERTED[name] = bcosify(_stock(name), b=B, verbose=False)
    return _CONVERTED[name]


def _batch(side: str, seed: int = 0):
    ids, mask = padded_batch(seed=seed, side="right" if side == "none" else side)
    return (ids, torch.ones_like(mask)) if side == "none" else (ids, mask)


def _reads_first_column(name: str) -> bool:
    """Whether the class's head classifies from the first column (BERT, DistilBERT, RoBERTa; ModernBERT with
    classifier_pooling="cls", not the suite's "mean"): left padding is refused there, since the first column of a
    left-padded row is a padding token's."""
    return SPECS[name].classifies_from_first_column(CONFIGS[_family(name)]())


# the one refusal of left padding (bcos_plugins.attribution.check_first_column_is_real): argument, problem, fix
FIRST_COLUMN_REFUSAL = (r"attention_mask: rows \[1, 2\] start with padding, and \w+ classifies from the first "
                        r"column's hidden state, a padding token's there.*Pad on the right \(tokenizer\.padding_side "
                        r"= 'right'\)")


def _padding_side(name: str) -> str:
    """The padded side a one-side test explains ``name`` on: left (the harder case for decoders), right where
    left padding is refused."""
    return "right" if _reads_first_column(name) else "left"


def _outputs(model, ids, mask):
    """The model's own outputs explain() explains: class logits (batch, classes), else (batch, pos, units), each
    row's as the row alone (positions counted from its first real token where they are absolute or causal)."""
    spec = SPECS[model.config.bcos["architecture"]]
    counted = spec.kind == "decoder" or spec.position_table is not None
    kwargs = {"position_ids": real_token_position_ids(spec, model.config, mask)} if counted else {}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _last_real(mask):
    return mask.shape[1] - 1 - mask.flip(1).argmax(1)


def _assert_complete(expl):
    assert torch.isfinite(expl.input_contributions).all()
    err = expl.completeness_error
    assert (err <= RTOL).all(), f"completeness error {err.tolist()} for values {expl.explained.tolist()}"


def test_every_registry_entry_has_a_tiny_config():
    for name in NAMES:
        _family(name)


@pytest.mark.parametrize("name", sorted(REFUSED_ARCHITECTURES))
def test_refused_classes_are_refused_with_their_reason(name):
    """A family that is not (or not wholly) supported is refused with the reason, never half-converted."""
    assert name not in SPECS
    torch.manual_seed(0)
    model = stock_class(name)(CONFIGS[_family(name)]()).eval()  # the family's tiny config
    with pytest.raises(UnsupportedModuleError) as error:
        bcosify(model, verbose=False)
    assert REFUSED_ARCHITECTURES[name] in str(error.value)
    assert not has_dynamic_weights(model)  # nothing converted


def test_fused_linear_query_key_cannot_be_kept_stock():
    """bcos_query_key=False keeps a fused q|k|v stock through Conv1D's (in, out) layout; ModernBERT's fused
    nn.Linear (out, in) is refused instead of being read transposed."""
    model = _stock("ModernBertForSequenceClassification")
    with pytest.raises(UnsupportedModuleError, match="bcos_query_key"):
        bcosify(model, bcos_query_key=False, verbose=False)
    assert not has_dynamic_weights(model)


@pytest.mark.parametrize("name", NAMES)
def test_bcosify_converts_and_reports_every_change(name):
    stock = _stock(name)
    stock_biases = {n for n, _ in stock.named_parameters() if n.endswith("bias")}
    model = bcosify(stock, b=B, verbose=False)
    report = model.bcos_report
    assert report.architecture == name and model.config.bcos["architecture"] == name
    assert report.bcos_layers and report.constant_outputs
    remaining = {n for n, _ in model.named_parameters() if n.endswith("bias")}
    assert set(report.dropped_biases) <= stock_biases
    assert stock_biases - remaining <= set(report.dropped_biases), "a bias went without being reported"
    for path, module in model.named_modules():
        if type(module) is torch.nn.Linear:
            assert any(path == kept or path.startswith(kept + ".") for kept in report.kept), \
                f"{path} is a plain nn.Linear but neither converted nor reported as kept"


@pytest.mark.parametrize("name", NAMES)
def test_a_stock_models_attribution_point_is_never_a_layer_norms_input(name):
    """Input x gradient before a LayerNorm is identically zero (the norm ignores its input's scale), so a
    conventional model is attributed after its embedding norm, whatever the family calls it."""
    from bcos_plugins.attribution import text_attribution_point

    point = text_attribution_point(_stock(name))
    if isinstance(point.module, torch.nn.LayerNorm):
        assert point.where == "output", point.description


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_explain_is_complete_on_the_models_own_outputs(name, side):
    model = _converted(name)
    spec = SPECS[name]
    ids, mask = _batch(side)
    if side == "left" and _reads_first_column(name):
        with pytest.raises(BcosValueError, match=FIRST_COLUMN_REFUSAL):
            explain(model, ids, mask, target=0)
        return
    out = _outputs(model, ids, mask)
    rows = torch.arange(ids.shape[0])
    last = _last_real(mask)
    default = last if spec.kind == "decoder" else mask.argmax(1)  # encoders: the first real token
    # explained values far from 0 (a relative error of a value near 0 measures nothing): the largest output,
    # and the largest minus the smallest for the contrast
    at_default = out if spec.is_classifier else out[rows, default]
    target = at_default.abs().argmax(-1)
    # a masked LM has no default position (tests/test_masked_lm_position.py): it is given the same one
    given = {"position": default} if spec.head == "masked_lm" else {}
    expl = explain(model, ids, mask, target=target, **given)
    _assert_complete(expl)
    torch.testing.assert_close(expl.explained, at_default[rows, target])
    at_other = out if spec.is_classifier else out[rows, last - 1]
    high, low = at_other.argmax(-1), at_other.argmin(-1)
    position = {} if spec.is_classifier else {"position": -2}
    contrast = explain(model, ids, mask, target=high, foil=low, **position)
    _assert_complete(contrast)
    torch.testing.assert_close(contrast.explained, at_other[rows, high] - at_other[rows, low])


STOCK_QUERY_KEY_NAMES = [n for n in NAMES if not n.startswith("ModernBert")]  # fused nn.Linear: refused


@pytest.mark.parametrize("name", STOCK_QUERY_KEY_NAMES)
def test_stock_query_key_projections_keep_explanations_complete(name, tmp_path):
    """bcosify(bcos_query_key=False): query/key keep their pretrained weights and biases (Qwen2's included),
    their outputs constant in explanation mode; explanations complete and the model reloads bit-identically."""
    model = bcosify(_stock(name), b=B, bcos_query_key=False, verbose=False)
    assert model.bcos_report.constant_outputs and set(model.bcos_report.constant_outputs) <= set(model.bcos_report.kept)
    ids, mask = _batch(_padding_side(name), seed=6)
    out = _outputs(model, ids, mask)
    rows = torch.arange(ids.shape[0])
    spec = SPECS[name]
    at = out if spec.is_classifier else out[rows, _last_real(mask) if spec.kind == "decoder" else mask.argmax(1)]
    target = at.abs().argmax(-1)
    given = {"position": mask.argmax(1)} if spec.head == "masked_lm" else {}  # a masked LM has no default
    expl = explain(model, ids, mask, target=target, **given)
    _assert_complete(expl)
    torch.testing.assert_close(expl.explained, at[rows, target])
    model.save_pretrained(tmp_path)
    assert torch.equal(_outputs(load_bcos_model(tmp_path).eval(), ids, mask), out)


@pytest.mark.parametrize("name", NAMES)
def test_load_bcos_model_round_trip_is_bit_identical(name, tmp_path):
    model = _converted(name)
    ids, mask = _batch("right", seed=2)
    model.save_pretrained(tmp_path)
    loaded = load_bcos_model(tmp_path).eval()
    assert type(loaded) is type(model)
    assert torch.equal(_outputs(loaded, ids, mask), _outputs(model, ids, mask))


CAPTUM_NAMES = [n for n in NAMES if SPECS[n].head in ("classifier", "causal_lm")]


@pytest.mark.parametrize("name", CAPTUM_NAMES)
def test_captum_bcos_attribution_and_layer_bcos_equal_explain(name):
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos

    model = _converted(name)
    target = torch.tensor([2, 0, 1])
    if _reads_first_column(name):
        left_ids, left_mask = _batch("left", seed=4)
        with pytest.raises(BcosValueError, match=FIRST_COLUMN_REFUSAL):
            EmbeddingForward(model).embed(left_ids, left_mask)
        with pytest.raises(BcosValueError, match=FIRST_COLUMN_REFUSAL):
            LayerBcos(model).attribute(left_ids, target=target, additional_forward_args=(left_mask,))
    ids, mask = _batch(_padding_side(name), seed=4)
    reference = explain(model, ids, mask, target=target)
    forward = EmbeddingForward(model)
    embedded = forward.embed(ids, mask)
    attr, delta = BcosAttribution(forward).attribute(embedded, target=target, additional_forward_args=(mask,),
                                                     return_convergence_delta=True)
    torch.testing.assert_close(attr, reference.input_contributions, rtol=1e-5, atol=1e-6)
    assert (delta.abs() <= RTOL * reference.explained.abs()).all()
    layer_attr, layer_delta = LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask,),
                                                         return_convergence_delta=True)
    torch.testing.assert_close(layer_attr, reference.input_contributions, rtol=1e-5, atol=1e-6)
    assert (layer_delta.abs() <= RTOL * reference.explained.abs()).all()


BASE_NAMES = [n for n in NAMES if SPECS[n].head == "base"]


@pytest.mark.parametrize("name", BASE_NAMES)
def test_captum_refuses_a_base_model_naming_explain(name):
    """A base model returns hidden states, no logits: Captum's wrappers refuse it when built, naming explain (which
    explains its hidden units, checked above), instead of an AttributeError in the middle of attribute()."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    model = _converted(name)
    for wrapper in (EmbeddingForward, LayerBcos):
        with pytest.raises(BcosTypeError, match=r"base model.*bcos_plugins\.explain|bcos_plugins\.explain for base"):
            wrapper(model)


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(3, VOCAB)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                     eos_token="<eos>", bos_token="<eos>")


CAUSAL_LM_NAMES = [n for n in NAMES if SPECS[n].head == "causal_lm"]


@pytest.mark.parametrize("name", CAUSAL_LM_NAMES)
def test_layer_bcos_runs_inside_captums_llm_gradient_attribution(name):
    """Captum's LLM workflow explains log p(target tokens); its first row is input x gradient of that
    log-probability at the attribution point, inside explanation mode."""
    from bcos_plugins.adapters.captum import LayerBcos
    from captum.attr import LLMGradientAttribution, TextTokenInput

    from bcos_plugins.attribution import capture_point
    from bcos_plugins.nn import explanation_mode

    model = _converted(name)
    tokenizer = _word_tokenizer()
    result = LLMGradientAttribution(LayerBcos(model), tokenizer).attribute(
        TextTokenInput("w5 w7 w9 w11", tokenizer), target="w3 w4")
    assert result.token_attr.shape == (2, 4) and torch.isfinite(result.token_attr).all()
    point = SPECS[name].embedding_module(model)
    with torch.enable_grad(), explanation_mode(model), capture_point(*point) as captured:
        log_p = model(input_ids=torch.tensor([[5, 7, 9, 11]])).logits[0, -1].log_softmax(-1)[3]
        (grad,) = torch.autograd.grad(log_p, captured[0])
    torch.testing.assert_close(result.token_attr[0], (captured[0] * grad).sum(-1)[0].detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", CAUSAL_LM_NAMES)
def test_inseq_load_model_bcos_is_exact(name):
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq

    model = _converted(name)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=_word_tokenizer())
    out = attribution_model.attribute(["w5 w9 w11 w4", "w7"], generation_args={"max_new_tokens": 2,
                                                                               "do_sample": False},
                                      step_scores=["logit"], show_progress=False)
    for seq in out.sequence_attributions:
        totals = torch.nansum(seq.target_attributions, dim=(0, 2))
        logits = seq.step_scores["logit"]
        assert ((totals - logits).abs() <= RTOL * logits.abs().clamp_min(1.0)).all()
        own = model(input_ids=torch.tensor([[t.id for t in seq.target]])).logits[0].detach()
        for step in range(2):
            pos = seq.attr_pos_start + step
            torch.testing.assert_close(logits[step], own[pos - 1, seq.target[pos].id], rtol=1e-4, atol=1e-5)


CLASSIFIER_NAMES = [n for n in NAMES if SPECS[n].is_classifier]


@pytest.mark.parametrize("name", CLASSIFIER_NAMES)
def test_inseq_load_classifier_scores_sum_to_each_class_logit(name):
    from bcos_plugins.adapters.inseq import load_classifier

    model = _converted(name)
    tokenizer = _word_tokenizer()
    texts = ["w5 w9 w11 w4 w8", "w7 w3"]
    out = load_classifier(model, tokenizer).attribute(texts)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    logits = _outputs(model, encoded["input_ids"], encoded["attention_mask"])
    for row, sequence in enumerate(out.sequence_attributions):
        totals = sequence.source_attributions.sum(dim=(0, 2))
        assert ((totals - logits[row]).abs() <= RTOL * logits[row].abs().max()).all()


def _lens_checks(lens_model, hf_model):
    """Same logits as the HF model; the package's TransformerLens explanation and token x component
    decomposition complete on them."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = hf_model(tokens).logits
        got = lens_model(tokens)
    assert ((got - expected).abs().max() / expected.abs().max()) <= 1e-5
    expl = explain_logits(lens_model, tokens, target=5)
    assert expl.completeness_error.max() <= RTOL
    torch.testing.assert_close(expl.explained, expected[:, -1, 5], rtol=1e-5, atol=1e-6)
    # token x component shares (per head, per MLP, direct) that sum to the logit
    table = token_component_decomposition(lens_model, tokens, target=5)
    assert table.completeness_error.max() <= RTOL
    torch.testing.assert_close(table.explained, expected[:, -1, 5], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(table.token_totals, expl.contributions, rtol=1e-4, atol=1e-5)


LENS_NAMES = [n for n in NAMES if SPECS[n].lens_conversion is not None]


@pytest.mark.parametrize("name", LENS_NAMES)
def test_hooked_transformer_from_hf_has_the_same_logits_and_is_explainable(name):
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4: the bridge test covers the family
        return
    model = _converted(name)
    _lens_checks(hooked_transformer_from_hf(model), model)


def _rel(got, want) -> float:
    got, want = got.detach(), want.detach()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _assert_head_and_neuron_results_sum_to_layer_outputs(cache, cfg) -> None:
    """TransformerLens' per-head and per-neuron results sum to each layer's attention and MLP output."""
    heads = cache.stack_head_results(layer=-1)
    n_heads, d_mlp = cfg.n_heads, cfg.d_mlp
    for layer in range(cfg.n_layers):
        assert _rel(heads[layer * n_heads:(layer + 1) * n_heads].sum(0), cache[f"blocks.{layer}.hook_attn_out"]) \
            <= RTOL
        neurons = cache.stack_neuron_results(layer + 1)[layer * d_mlp:]
        assert _rel(neurons.sum(0), cache[f"blocks.{layer}.hook_mlp_out"]) <= RTOL


@pytest.mark.parametrize("name", LENS_NAMES)
def test_transformer_lens_decompositions_are_exact(name):
    """TransformerLens' own calls on the converted model: logit_attrs of its residual decompositions sum to the
    logit (refused with the exact alternative where the logits are soft-capped), stack_head_results /
    stack_neuron_results sum to each layer's attention / MLP output (through Gemma 2's norms after them too)."""
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    hf_model = _with_trained_norm_gains(name)
    model = hooked_transformer_from_hf(hf_model)
    tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    logits, cache = model.run_with_cache(tokens)
    target = logits.argmax(-1)
    logit = logits.gather(-1, target[..., None])[..., 0]
    for stack in (cache.decompose_resid(), cache.get_full_resid_decomposition(expand_neurons=True)):
        if getattr(hf_model.config, "final_logit_softcapping", None) is None:
            assert _rel(cache.logit_attrs(stack, target).sum(0), logit) <= RTOL
        else:  # the logit is cap * tanh(z / cap): no sum of per-component terms equals it
            with pytest.raises(BcosTypeError, match=r"logit_attrs: .*soft-caps its logits.*"
                                                    r"token_component_decomposition"):
                cache.logit_attrs(stack, target)
    heads = cache.stack_head_results(layer=-1)
    n_heads, d_mlp = model.cfg.n_heads, model.cfg.d_mlp
    for layer in range(model.cfg.n_layers):
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        assert _rel(heads[layer * n_heads:(layer + 1) * n_heads].sum(0), attn_out) <= RTOL
        neurons = cache.stack_neuron_results(layer + 1)[layer * d_mlp:]
        assert _rel(neurons.sum(0), cache[f"blocks.{layer}.hook_mlp_out"]) <= RTOL


@pytest.mark.parametrize("name", LENS_NAMES)
def test_sae_lens_hooked_sae_transformer_with_a_spliced_sae_accounts_for_the_whole_logit(name):
    """sae-lens' HookedSAETransformer built by hooked_transformer_from_hf, a bias-free SAE spliced into the
    residual stream with its error term: the tokens' share plus the error term's reported share is the logit."""
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4 (sae-lens needs TransformerLens 3)
        return
    from bcos_plugins.adapters.sae_lens import sae_error_share
    from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig

    model = hooked_transformer_from_hf(_converted(name), model_class=HookedSAETransformer)
    d_model = model.cfg.d_model
    sae_cfg = StandardSAEConfig(d_in=d_model, d_sae=4 * d_model, device="cpu")
    sae_cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    torch.manual_seed(0)
    sae = StandardSAE(sae_cfg)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn_like(sae.W_enc))
        sae.W_dec.copy_(torch.randn_like(sae.W_dec) / d_model)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    model.add_sae(sae, use_error_term=True)
    tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(9))
    result = sae_error_share(model, tokens, target=4)
    explained = result.explanation.explained
    assert set(result.error_shares) == {"blocks.0.hook_resid_post"}
    assert result.error_fraction.abs().max() > 1e-3  # the error term carries a real share
    total = result.explanation.total + result.error_share
    assert ((total - explained).abs() / explained.abs()).max() <= RTOL


# per converter, a transformers setting its TransformerLens config cannot express, and the refusal's words
INEXPRESSIBLE = {
    "GPT2LMHeadModel": ({"add_cross_attention": True}, "add_cross_attention=True cannot be expressed"),
    "LlamaForCausalLM": ({"mlp_bias": True}, "Llama with mlp_bias=True: TransformerLens' Llama conversion drops"),
    "MistralForCausalLM": ({"head_dim": 16}, "Mistral head_dim=16 with 4 heads != hidden_size=32"),
    "Qwen2ForCausalLM": ({"layer_types": ["full_attention", "sliding_attention"]},
                         "Qwen2 with sliding-window layers .* Qwen2 config has no window"),
    "Qwen3ForCausalLM": ({"attention_bias": True}, "Qwen3 with attention_bias=True: .* Qwen3 conversion drops"),
    "Gemma2ForCausalLM": ({"use_bidirectional_attention": True},
                          "Gemma 2 with use_bidirectional_attention=True: TransformerLens' attention is causal"),
}


def test_every_converter_has_an_inexpressible_setting():
    assert set(INEXPRESSIBLE) == set(LENS_NAMES)


@pytest.mark.parametrize("name", sorted(INEXPRESSIBLE))
def test_hooked_transformer_from_hf_refuses_what_its_converter_cannot_express(name):
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    setting, message = INEXPRESSIBLE[name]
    config = CONFIGS[_family(name)]()
    for key, value in setting.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with pytest.raises(BcosValueError, match=message):
        hooked_transformer_from_hf(stock_class(name)(config).eval())


# the causal LM of a base model's family, which a base model without an LM head is pointed to
_FAMILY_CAUSAL_LM = {"GPT2Model": "GPT2LMHeadModel", "LlamaModel": "LlamaForCausalLM",
                     "MistralModel": "MistralForCausalLM", "Qwen2Model": "Qwen2ForCausalLM",
                     "Qwen3Model": "Qwen3ForCausalLM", "Gemma2Model": "Gemma2ForCausalLM"}


def _refusal_without_converter(name: str, fix: str) -> str:
    converted = ", ".join(specs_where(lambda spec: spec.lens_conversion is not None))
    return (f"hf_model: hooked_transformer_from_hf supports {converted} (plain, B-cosified or bilinear); got {name}. "
            f"{fix}.")


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].lens_conversion is None])
def test_hooked_transformer_from_hf_refuses_a_class_without_a_converter_naming_those_with_one(name):
    """The refusal's list is the registry's: the classes whose spec names a converter module; its fix follows
    from the kind of class (no TransformerLens model is a classifier, a masked LM or a base model)."""
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    with pytest.raises(BcosTypeError) as error:
        hooked_transformer_from_hf(_stock(name))
    transformers_path = f"explain {name} with bcos_plugins.explain (the transformers path)"
    head = SPECS[name].head
    if name in _FAMILY_CAUSAL_LM:
        fix = (f"{name} is a base model (hidden states, no LM head), and a TransformerLens model ends in an LM head: "
               f"use {_FAMILY_CAUSAL_LM[name]} (the base model with its LM head), or {transformers_path}")
    elif head == "base":
        fix = f"{name} is a base model (hidden states, no LM head), and a TransformerLens model is a causal LM: " \
              f"{transformers_path}"
    else:
        kind = {"classifier": "a sequence classifier", "masked_lm": "a masked LM"}[head]
        fix = f"{name} is {kind}, and a TransformerLens model is a causal LM: {transformers_path}"
    assert str(error.value) == _refusal_without_converter(name, fix)


def test_hooked_transformer_from_hf_refuses_a_class_outside_the_registry_pointing_to_the_listed_ones():
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    with pytest.raises(BcosTypeError) as error:
        hooked_transformer_from_hf(torch.nn.Linear(4, 4))
    assert str(error.value) == _refusal_without_converter(
        "Linear", "The architecture registry has no Linear: pass a model of one of those classes")


@pytest.mark.parametrize("bridge", [True, False])
def test_hooked_transformer_from_hf_points_a_causal_lm_without_a_converter_to_the_bridge_where_it_takes_it(
        monkeypatch, bridge):
    """A registered causal LM left without a converter (docs/design.md allows it) is refused pointing to
    transformer_bridge_from_hf where the bridge takes it, else to the transformers path; it was told to load a
    causal-LM class, which it is."""
    import dataclasses

    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    from bcos_plugins.adapters._lens import from_hf

    name = "LlamaForCausalLM"
    monkeypatch.setitem(SPECS, name, dataclasses.replace(SPECS[name], lens_conversion=None, bridge=bridge))
    monkeypatch.setattr(from_hf, "SUPPORTED_HF_ARCHITECTURES",
                        specs_where(lambda spec: spec.lens_conversion is not None))
    with pytest.raises(BcosTypeError) as error:
        hooked_transformer_from_hf(_stock(name))
    fix = (f"Use transformer_bridge_from_hf(hf_model): TransformerLens' TransformerBridge takes {name}" if bridge else
           f"Neither TransformerLens path takes {name}: explain {name} with bcos_plugins.explain (the transformers "
           "path)")
    assert str(error.value) == _refusal_without_converter(name, fix)


BRIDGE_NAMES = [n for n in NAMES if SPECS[n].bridge]


def _with_trained_norm_gains(name: str):
    """The B-cos model of a stock model whose norm gains moved away from their initial values, as a trained
    model's do: a final-norm gain of exactly 1 hides a logit_attrs that leaves the gain out."""
    stock = _stock(name)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in stock.modules():
            if type(module).__name__.endswith(("LayerNorm", "RMSNorm")):
                module.weight.add_(0.3 * torch.randn(module.weight.shape, generator=generator))
    return bcosify(stock, b=B, verbose=False)


@pytest.mark.parametrize("name", BRIDGE_NAMES)
def test_transformer_bridge_from_hf_has_the_same_logits_and_is_explainable(name):
    """The bridge's logits, the package's explanations, TransformerLens' per-head / per-neuron results (summing to
    each layer's attn_out / mlp_out) and its logit_attrs of the bridge's residual decompositions as a
    TransformerLens user writes them (summing to the logit, or logit difference), under TransformerLens 3.x and 4.x."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    model = _with_trained_norm_gains(name)
    bridge = transformer_bridge_from_hf(model)
    _lens_checks(bridge, model)
    tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)
    target, foil = logits.argmax(-1), logits.argmin(-1)
    logit = logits.gather(-1, target[..., None])[..., 0]
    difference = logit - logits.gather(-1, foil[..., None])[..., 0]
    resid, labels = cache.decompose_resid(return_labels=True)
    assert len(labels) == resid.shape[0]
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:  # the logit is cap * tanh(z / cap): no sum of per-component terms equals it
        with pytest.raises(BcosTypeError, match=r"ActivationCache.logit_attrs: .*soft-caps the logits.*"
                                                r"token_component_decomposition"):
            cache.logit_attrs(resid, tokens=target)
        # Gemma 2 normalises each attention and MLP output again: per-head / per-neuron shares of the bridge's
        # projection are not attn_out's / mlp_out's. The refusals name the exact split, and
        # hooked_transformer_from_hf where the family has a converter (its cache's results are exact, checked in
        # test_transformer_lens_decompositions_are_exact)
        refusals = {"attention output is not its output projection's": lambda: cache.stack_head_results(layer=-1),
                    "MLP output is not its output projection's": lambda: cache.stack_neuron_results(1)}
        for reason, call in refusals.items():
            with pytest.raises(BcosTypeError, match=reason) as error:
                call()
            assert "token_component_decomposition" in str(error.value)
            routed = "hooked_transformer_from_hf(hf_model) gives" in str(error.value)
            assert routed == (SPECS[name].lens_conversion is not None)
        return
    # TransformerLens' per-head and per-neuron results sum to each layer's attention and MLP output
    _assert_head_and_neuron_results_sum_to_layer_outputs(cache, bridge.cfg)
    stacks = {"decompose_resid": resid,
              "accumulated_resid": cache.accumulated_resid(layer=-1)[-1:],
              "stack_head_results + stack_neuron_results": cache.get_full_resid_decomposition(expand_neurons=True)}
    for label, stack in stacks.items():
        assert _rel(cache.logit_attrs(stack, tokens=target).sum(0), logit) <= RTOL, label
        assert _rel(cache.logit_attrs(stack, tokens=target, incorrect_tokens=foil).sum(0), difference) <= RTOL, label


GATED_LM_NAMES = [n for n in CAUSAL_LM_NAMES if "mlp" in SPECS[n].module_swaps]


def _bilinear_config(name: str):
    """The family's tiny config with the identity activation in its gated MLP (its bilinear variant)."""
    config = CONFIGS[_family(name)]()
    config.hidden_act = "linear"
    if hasattr(config, "hidden_activation"):  # Gemma names it so
        config.hidden_activation = "linear"
    return config


@pytest.mark.parametrize("name", GATED_LM_NAMES)
def test_bilinear_variant_is_explained_exactly_on_every_path(name):
    """The family's gated MLP with the identity activation is a bilinear MLP (gate branch the dynamic weight):
    B-cosified, its explanations are complete through explain and the TransformerLens paths the family has."""
    from bcos_plugins.adapters import transformer_lens as lens

    torch.manual_seed(0)
    model = bcosify(stock_class(name)(_bilinear_config(name)).eval(), b=B, verbose=False)
    assert type(model.model.layers[0].mlp.act_fn).__name__ == "LinearActivation"
    ids, mask = _batch("left", seed=7)
    out = _outputs(model, ids, mask)
    rows = torch.arange(ids.shape[0])
    at = out[rows, _last_real(mask)]
    _assert_complete(explain(model, ids, mask, target=at.abs().argmax(-1)))
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()  # None: refused under TransformerLens 4
    if SPECS[name].lens_conversion is not None and hooked_transformer_from_hf is not None:
        _lens_checks(hooked_transformer_from_hf(model), model)
    if SPECS[name].bridge:
        _lens_checks(lens.transformer_bridge_from_hf(model), model)


@pytest.mark.parametrize("name", GATED_LM_NAMES)
def test_bilinear_variant_is_analysable_with_the_bilinear_tools(name):
    """The family's bilinear variant, not B-cosified, through the bilinear tools: (W, V, P) read from each layer's
    transformers MLP (and from the HookedTransformer's, where the family has a converter) reproduce the MLP, and
    the interaction matrices give its output, u . mlp(x) = x^T Q(u) x. Its B-cos version is refused there (an
    input-dependent scale is not a bilinear form). A plain model whose logits are soft-capped (Gemma 2) has no
    explainable HookedTransformer (TransformerLens' forward applies the cap inline): it is refused with the reason,
    and the HookedTransformer's MLPs are read from the same model with the final soft-cap off (no MLP reads it)."""
    from bcos_plugins.bilinear import bilinear_weights, interaction_matrix

    config = _bilinear_config(name)
    torch.manual_seed(0)
    model = stock_class(name)(config).eval()
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(5, config.hidden_size, generator=generator)
    directions = torch.randn(3, config.hidden_size, generator=generator)
    hooked = None
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()  # None: refused under TransformerLens 4
    if SPECS[name].lens_conversion is not None and hooked_transformer_from_hf is not None:
        if getattr(config, "final_logit_softcapping", None) is not None:
            with pytest.raises(BcosValueError, match="applies tanh to the logits inline.*bcosify"):
                hooked_transformer_from_hf(model)
            model.config.final_logit_softcapping = None
        hooked = hooked_transformer_from_hf(model)
    for index, layer in enumerate(model.model.layers):
        with torch.no_grad():
            out = layer.mlp(x)
        torch.testing.assert_close(bilinear_weights(layer.mlp).forward(x), out)
        quadratic = torch.einsum("bi,nij,bj->bn", x, interaction_matrix(layer.mlp, directions), x)
        torch.testing.assert_close(quadratic, out @ directions.T, rtol=1e-4, atol=1e-5)
        if hooked is not None:
            torch.testing.assert_close(bilinear_weights(hooked.blocks[index].mlp).forward(x), out)
    bcos = bcosify(model, b=B, verbose=False)
    with pytest.raises(BcosTypeError, match="not bilinear"):
        bilinear_weights(bcos.model.layers[0].mlp)


# ---------------------------------------------------------------------------------- family-specific maths


def test_gemma2_norms_keep_the_one_plus_weight_gain_and_the_soft_cap_stays_in_the_forward():
    """Gemma's RMSNorm gain is 1 + weight (weights start at 0): the B-cos norm computes the stock value; the
    final-logit soft-cap is still applied (|logits| < cap) and equals c * tanh(z / c) of the head's output."""
    from bcos_plugins.convert.gemma import BcosGemmaRMSNorm, BcosSoftCappedLMHead

    stock = _stock("Gemma2ForCausalLM")
    norm = stock.model.layers[0].post_feedforward_layernorm
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
        x = torch.randn(2, 5, 32)
        expected = norm(x)
    model = bcosify(stock, b=B, verbose=False)
    assert isinstance(norm, BcosGemmaRMSNorm)
    torch.testing.assert_close(norm(x), expected, rtol=1e-6, atol=1e-6)
    head = model.lm_head
    assert isinstance(head, BcosSoftCappedLMHead) and head.soft_cap == 0.5
    assert head.weight is model.model.embed_tokens.weight  # still tied
    ids, mask = _batch("none")
    logits = _outputs(model, ids, mask)
    assert logits.abs().max() < 0.5
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    raw = torch.nn.functional.linear(hidden, head.weight)
    torch.testing.assert_close(logits, 0.5 * torch.tanh(raw / 0.5), rtol=1e-5, atol=1e-6)
    assert "lm_head" in model.bcos_report.patched_modules and "<model>" in model.bcos_report.patched_modules


def test_gemma2_plain_hooked_transformers_per_head_and_per_neuron_results_include_its_post_norms():
    """A plain Gemma 2 (final soft-cap off: TransformerLens caps inline) as a HookedTransformer: its cache's per-head
    and per-neuron results go through the norms after the attention and MLP outputs, so they sum to hook_attn_out /
    hook_mlp_out (TransformerLens' own leave the norms out); the logits are the transformers model's."""
    from bcos_plugins.adapters import transformer_lens as lens

    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4
        return
    stock = _stock("Gemma2ForCausalLM")
    stock.config.final_logit_softcapping = None
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # trained-like gains: a post-norm gain of exactly 1 would hide half of the norm
        for module in stock.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.add_(0.3 * torch.randn(module.weight.shape, generator=generator))
    from transformer_lens import HookedTransformer

    model = hooked_transformer_from_hf(stock)
    assert isinstance(model, HookedTransformer) and not isinstance(model, lens.BcosHookedTransformer)
    tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    logits, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        expected = stock(tokens).logits
    assert _rel(logits, expected) <= 1e-5
    _assert_head_and_neuron_results_sum_to_layer_outputs(cache, model.cfg)
