"""Host-library behaviour bcos-plugins works around, refuses or documents, each pinned on a tiny model built from a
config (no downloads). Every test asserts the host's *current* behaviour with the host alone (no bcos_plugins code
in the reproduction), so it fails on the day the host changes it, with a message naming the workaround to revisit.
The page docs/hosts/upstream-issues.md describes each item (versions, reproduction, our workaround, a draft issue
title); the section names below are its anchors. Versions pinned: transformers 5.24, TransformerLens 3.9, inseq
0.7.1, Captum 0.9, sae-lens 6.54 (the .venv's)."""

from __future__ import annotations

import copy
import inspect
import re
import warnings
from pathlib import Path

import inseq
import pytest
import torch
import transformers as T
from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTemplateInput, TextTokenInput
from inseq.data.attribution import FeatureAttributionSequenceOutput
from sae_lens import SAETransformerBridge
from safetensors.torch import load_file
from transformer_lens.model_bridge import TransformerBridge

from bcos_plugins.data import SHIPPED_DATA

PAGE = "docs/hosts/upstream-issues.md"


def _revisit(section: str, host: str, workaround: str) -> str:
    """The failure message: the host changed the behaviour a workaround of ours rests on (``section``: the page's
    anchor, which test_every_item_names_a_section_of_the_page checks)."""
    return (f"{host} no longer behaves as pinned here: revisit {workaround} (and {PAGE}#{section}): the workaround may "
            "be unneeded now, or wrong")


@pytest.fixture(scope="module")
def tokenizer():
    """The GPT-2 tokenizer shipped with the package (a local folder, which TransformerLens can reload by name)."""
    return T.AutoTokenizer.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")


def _tiny(kind: str, vocab: int, **config) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        # GPT-2's end of text (its BOS and EOS) is its last id: 50256 over the shipped tokenizer's 50257 tokens
        config = {"bos_token_id": vocab - 1, "eos_token_id": vocab - 1, **config}
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                               **config))
    else:
        model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, **config))
    return model.eval()


def _greedy(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """The model's greedy continuation, one full forward per token (no cache)."""
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


# ------------------------------------------------------------- 1. TransformerLens: a bridge's cached generate


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_transformer_lens_bridge_generates_other_tokens_with_its_kv_cache(kind, tokenizer):
    """TransformerLens 3.9: ``TransformerBridge.generate(use_past_kv_cache=True)`` (the default) on a bridge booted
    over a plain transformers model leaves the model's greedy tokens from the second new token on; without the cache
    it gives the model's tokens. The booted model's attention bridges leave transformers' ``DynamicCache`` empty, so
    each cached step attends to itself alone."""
    hf = _tiny(kind, len(tokenizer))
    bridge = TransformerBridge.boot_transformers(kind, hf_model=copy.deepcopy(hf), tokenizer=tokenizer, device="cpu")
    ids = torch.tensor([[464, 3797, 3332]])
    reference = _greedy(hf, ids, 8)
    options = dict(max_new_tokens=8, do_sample=False, verbose=False, stop_at_eos=False)
    message = _revisit("transformerlens-cached-generate", "TransformerLens",
                       "adapters/_lens/bridge._without_kv_cache (bridges generate without the cache, "
                       "use_past_kv_cache=True refused)")
    assert bridge.generate(ids, use_past_kv_cache=False, **options).tolist() == reference.tolist()
    cached = bridge.generate(ids, use_past_kv_cache=True, **options)
    assert cached[0, :4].tolist() == reference[0, :4].tolist(), message  # the first new token is right
    assert cached.tolist() != reference.tolist(), message
    with torch.no_grad():  # the cause: the booted model's cache holds nothing after a prompt
        assert hf(ids, use_cache=True).past_key_values.get_seq_length() == 3
        assert bridge.original_model(ids, use_cache=True).past_key_values.get_seq_length() == 0, message


# ------------------------------------------------------------- 2. inseq: save(use_primitives=True)


def test_inseq_output_saved_with_use_primitives_cannot_be_loaded(tokenizer, tmp_path):
    """inseq 0.7.1: ``FeatureAttributionOutput.save(path, use_primitives=True)`` writes a file that
    ``FeatureAttributionOutput.load`` fails on with a bare AttributeError (its docstring says such a file cannot be
    loaded; the error does not)."""
    model = inseq.load_model(_tiny("gpt2", len(tokenizer)), "saliency", tokenizer=tokenizer)
    out = model.attribute("The cat sat", generation_args={"max_new_tokens": 2, "do_sample": False},
                          show_progress=False)
    out.save(tmp_path / "plain.json")
    assert inseq.FeatureAttributionOutput.load(tmp_path / "plain.json")[0].target_attributions.shape == \
        out[0].target_attributions.shape
    out.save(tmp_path / "primitives.json", use_primitives=True)
    message = _revisit("inseq-save-use-primitives", "inseq", "docs/hosts/inseq.md's note on save(use_primitives=True)")
    with pytest.raises(AttributeError, match="OrderedDict' object has no attribute 'sequence_attributions'"):
        inseq.FeatureAttributionOutput.load(tmp_path / "primitives.json")
        pytest.fail(message)


# ------------------------------------------------------------- 3. Captum: LLMGradientAttribution and templates


def test_captum_llm_gradient_attribution_refuses_a_text_template_input(tokenizer):
    """Captum 0.9: ``LLMGradientAttribution`` takes ``TextTokenInput`` only (``SUPPORTED_INPUTS``); a
    ``TextTemplateInput`` fails with a bare AssertionError naming another class (``LLMAttribution``)."""
    model = _tiny("gpt2", len(tokenizer))
    llm = LLMGradientAttribution(LayerGradientXActivation(model, model.transformer.wte), tokenizer)
    result = llm.attribute(TextTokenInput("The cat sat on the", tokenizer), target=" mat")
    assert result.token_attr.shape == (1, 5)
    message = _revisit("captum-llm-gradient-attribution-template-input", "Captum",
                       "docs/hosts/captum.md (LayerBcos in Captum's LLM workflow: TextTokenInput only)")
    assert LLMGradientAttribution.SUPPORTED_INPUTS == (TextTokenInput,), message
    with pytest.raises(AssertionError, match=r"^LLMAttribution does not support input type .*TextTemplateInput"):
        llm.attribute(TextTemplateInput("{} sat on the", values=["The cat"]), target=" mat")
        pytest.fail(message)


# ------------------------------------------------------------- 4. inseq: weight_attributions at float32


def test_inseq_weight_attributions_rounds_float64_scores_to_float32(tokenizer):
    """inseq 0.7.1: ``FeatureAttributionSequenceOutput.weight_attributions`` casts the aggregated scores to float32
    before multiplying them by the step score: float64 scores come back as float64 holding float32-rounded values."""
    model = inseq.load_model(_tiny("gpt2", len(tokenizer)), "saliency", tokenizer=tokenizer)
    sequence = model.attribute("The cat sat", generation_args={"max_new_tokens": 2, "do_sample": False},
                               show_progress=False)[0]
    generator = torch.Generator().manual_seed(0)
    rows, columns = sequence.target_attributions.shape[:2]
    scores = torch.rand(rows, columns, dtype=torch.float64, generator=generator)
    weights = torch.rand(columns, dtype=torch.float64, generator=generator)
    sequence.target_attributions, sequence.step_scores, sequence._aggregator = scores, {"w": weights}, []
    weighted = FeatureAttributionSequenceOutput.weight_attributions(sequence, "w").target_attributions
    message = _revisit("inseq-weight-attributions-float32", "inseq",
                       "adapters/inseq._Inseq071.weight_at_float64 (quirk 7) and BcosSequenceAttribution"
                       ".weight_attributions")
    assert weighted.dtype == torch.float64
    assert torch.equal(weighted, scores.float().double() * weights), message
    assert (weighted - scores * weights).abs().max() > 1e-10, message


def test_bcos_weight_attributions_keeps_a_float64_output_at_float64(tokenizer):
    """Our side of item 4: the "bcos" method's outputs went through inseq's ``weight_attributions``, so a float64
    model's weighted scores were rounded to float32 (3e-13 off scores of 1e-5, relative 5e-8), silently. They are now
    the float64 product of the aggregated scores and the step score; a float32 output is weighted by inseq as before."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")

    from bcos_plugins import bcosify

    results = {}
    for dtype in (torch.float64, torch.float32):
        llama = bcosify(_tiny("llama", len(tokenizer)), b=1.1, verbose=False).to(dtype)
        out = inseq.load_model(llama, "bcos", tokenizer=tokenizer).attribute(
            ["The cat sat on the"], generation_args={"max_new_tokens": 3, "do_sample": False},
            step_scores=["probability"], show_progress=False)
        sequence = out[0]
        expected = sequence.aggregate().target_attributions * sequence.step_scores["probability"]
        with pytest.warns(UserWarning, match=r"weight_attributions\('probability'\).*'deltas'.*dropped"):
            out.weight_attributions("probability")  # the deltas go, as before
        results[dtype] = (out[0].target_attributions, expected)
    weighted, expected = results[torch.float64]
    assert weighted.dtype == torch.float64
    torch.testing.assert_close(weighted, expected, rtol=0, atol=0, equal_nan=True)
    weighted, expected = results[torch.float32]  # inseq's own computation, unchanged
    assert weighted.dtype == torch.float32
    torch.testing.assert_close(weighted, expected, rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------- 5. transformers: num_items_in_batch ignored


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForMaskedLM",
                                  "LlamaForSequenceClassification", "ModernBertForSequenceClassification"])
def test_transformers_classifiers_and_masked_lms_ignore_num_items_in_batch(name):
    """transformers 5.24: these heads' ``forward`` takes ``**kwargs`` and sets no ``accepts_loss_kwargs``, which the
    ``Trainer`` reads as "normalises over num_items_in_batch" (so it skips dividing by the accumulation steps), but
    their loss ignores ``num_items_in_batch``: with gradient accumulation the loss is k times too large. A causal LM
    honours it."""
    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                 num_labels=3, pad_token_id=0)
    config_class = {"Bert": T.BertConfig, "Llama": T.LlamaConfig, "ModernBert": T.ModernBertConfig}
    # ModernBERT's special ids default to 50281-50283, outside this vocabulary
    special = dict(bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2) if name.startswith("Modern") else {}
    torch.manual_seed(0)
    model = getattr(T, name)(config_class[name.split("For")[0]](**small, **special)).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    labels = ids.clone() if name.endswith("MaskedLM") else torch.tensor([1, 2])
    counted = labels.numel()
    message = _revisit("transformers-num-items-in-batch", "transformers",
                       "bcos_plugins.fine_tuning.fine_tune_classifier and bcos_plugins.pretrain.pretrain_masked_lm "
                       "(compute_loss_func=losses.cross_entropy_loss), vision.model / space.modeling "
                       "(accepts_loss_kwargs = False)")
    forward = inspect.signature(model.forward).parameters.values()
    assert any(p.kind is p.VAR_KEYWORD for p in forward) and not hasattr(model, "accepts_loss_kwargs"), message
    with torch.no_grad():
        mean = model(input_ids=ids, labels=labels).loss
        over_two_batches = model(input_ids=ids, labels=labels, num_items_in_batch=2 * counted).loss
    assert torch.equal(over_two_batches, mean), message
    with torch.no_grad():  # the contrast: a causal LM divides its summed loss by the count it is given
        lm = _tiny("llama", 64)
        shifted = ids[:, 1:].numel()
        assert torch.allclose(lm(input_ids=ids, labels=ids, num_items_in_batch=2 * shifted).loss,
                              lm(input_ids=ids, labels=ids).loss / 2)


# ------------------------------------------------------------- 6. transformers: a head tied by hand


def test_transformers_from_pretrained_initialises_a_head_tied_by_hand_at_random(tmp_path):
    """transformers 5.24: a head tied to the input embeddings by hand under ``tie_word_embeddings=False``
    (``lm_head.weight = embed_tokens.weight``) is saved once, under the embeddings' name, without a warning;
    ``from_pretrained`` then initialises the head at random, reporting it in a log table only (no warning, no
    error): another model, silently for anyone not reading the log."""
    model = _tiny("llama", 64, tie_word_embeddings=False)
    model.lm_head.weight = model.model.embed_tokens.weight
    message = _revisit("transformers-head-tied-by-hand", "transformers",
                       "bcos_plugins.persistence._check_head_tying (load_bcos_model refuses such a save, naming "
                       "tie_word_embeddings=True)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path)
        loaded, info = T.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors"), message
    assert info["missing_keys"] == {"lm_head.weight"}, message
    assert not [w for w in caught if "lm_head" in str(w.message)], message
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert (loaded(ids).logits - model(ids).logits).abs().max() > 0.1, message


# ------------------------------------------------------------- 7. transformers: config.return_dict = False


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_transformers_heads_fail_when_their_config_says_return_dict_false(kind):
    """transformers 5.24: with ``config.return_dict = False`` the decoder heads (GPT-2, Llama, and likewise Mistral,
    Qwen2, Qwen3, Gemma 2 and ModernBERT's classifier) fail inside their forward: the inner model returns a tuple and
    the head reads ``.last_hidden_state`` of it. ``return_dict=False`` passed in the call works."""
    model = _tiny(kind, 64)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert isinstance(model(ids, return_dict=False), tuple)
        model.config.return_dict = False
        message = _revisit("transformers-return-dict-false", "transformers",
                           "bcos_plugins.attribution.text.with_output_object (every path calls the model with "
                           "return_dict=True)")
        with pytest.raises(AttributeError, match="'tuple' object has no attribute 'last_hidden_state'"):
            model(ids)
            pytest.fail(message)


# ------------------------------------------------------------- 8. inseq: show() of bfloat16 step scores


def test_inseq_show_fails_on_a_bfloat16_models_step_scores(tokenizer):
    """inseq 0.7.1: a bfloat16 model's step scores (``probability``, ``logit``) keep its dtype (the attributions are
    cast to float32), and ``show()`` converts them to NumPy, which has no bfloat16: TypeError."""
    model = inseq.load_model(_tiny("gpt2", len(tokenizer)).to(torch.bfloat16), "saliency", tokenizer=tokenizer)
    out = model.attribute("The cat sat", generation_args={"max_new_tokens": 2, "do_sample": False},
                          step_scores=["probability"], show_progress=False)
    message = _revisit("inseq-show-bfloat16", "inseq",
                       "adapters/inseq.BcosSequenceAttribution.__post_init__ (widens step scores to float32)")
    assert out[0].target_attributions.dtype == torch.float32
    assert out[0].step_scores["probability"].dtype == torch.bfloat16, message
    with pytest.raises(TypeError, match="Got unsupported ScalarType BFloat16"):
        out.show(display=False, return_html=True)
        pytest.fail(message)


# ------------------------------------------------------------- 9. sae-lens: SAETransformerBridge.hook_dict


def test_sae_lens_bridge_hook_dict_lacks_transformer_lens_hook_aliases(tokenizer):
    """sae-lens 6.54: ``SAETransformerBridge.hook_dict`` (which adds the attached SAEs' hooks) rebuilds the dict from
    the bridge's registry without TransformerLens' hook aliases, so ``hook_embed``, ``blocks.0.hook_resid_pre``, ...
    are in a TransformerBridge's hook_dict and not in the SAETransformerBridge's of the same model."""
    hf = _tiny("gpt2", len(tokenizer))
    plain = TransformerBridge.boot_transformers("gpt2", hf_model=copy.deepcopy(hf), tokenizer=tokenizer, device="cpu")
    with_saes = SAETransformerBridge.boot_transformers("gpt2", hf_model=copy.deepcopy(hf), tokenizer=tokenizer,
                                                       device="cpu")
    message = _revisit("sae-lens-bridge-hook-aliases", "sae-lens",
                       "adapters/_lens/explain._refuse_sae_bridge (explaining an SAETransformerBridge is refused)")
    assert {"hook_embed", "blocks.0.hook_resid_pre"} <= set(plain.hook_dict)
    missing = set(plain.hook_dict) - set(with_saes.hook_dict)
    assert {"hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"} <= missing, message
    assert "embed.hook_out" in with_saes.hook_dict


def test_every_item_names_a_section_of_the_page():
    """Each failure message points at an existing section of the page, one section per item."""
    root = Path(__file__).resolve().parents[1]
    cited = re.findall(r'_revisit\("([\w-]+)"', Path(__file__).read_text(encoding="utf-8"))
    sections = re.findall(r"^## .*\{#([\w-]+)\}$", (root / PAGE).read_text(encoding="utf-8"), flags=re.M)
    assert len(sections) == 9 and sorted(set(cited)) == sorted(sections), (cited, sections)
