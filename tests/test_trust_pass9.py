"""Ninth trust pass: legal but unusual transformers configurations (GQA, head_dim, rotary scaling, biases, windows,
soft-caps, activations, eps extremes, one layer, position limits, pad ids, resized vocabularies, classification
heads, refused families) through bcosify, explain, load_bcos_model and the TransformerLens and sae-lens paths, each
checked against a number computed another way (the transformers model's own logits, the stock model's outputs where
the report says nothing changed). The cases that were silently wrong or crashed unhelpfully, one test each."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import MAX_POS, VOCAB, tiny_config

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")


def _tokens(batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


def _gemma2(**extra):
    config = T.Gemma2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=MAX_POS,
                            sliding_window=4, query_pre_attn_scalar=8, pad_token_id=0, bos_token_id=2,
                            eos_token_id=2, **extra)
    torch.manual_seed(0)
    return T.Gemma2ForCausalLM(config).eval()


def _rel(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("trained_gains", [False, True])
def test_a_plain_gemma2_bridge_computes_the_models_logits(trained_gains):
    """make_bridge_explainable replaced a plain Gemma 2's RMSNorms (gain 1 + weight) by DetachableRMSNorm (gain
    weight): every norm of the bridge multiplied by its weight alone, so at initialisation (weights 0) every logit
    was exactly 0, and with trained gains the logits were another model's, without an error."""
    model = _gemma2(final_logit_softcapping=None)
    if trained_gains:
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for module in model.modules():
                if type(module).__name__.endswith("RMSNorm"):
                    module.weight.add_(0.3 * torch.randn(module.weight.shape, generator=generator))
    tokens = _tokens()
    bridge = lens.transformer_bridge_from_hf(model)
    with torch.no_grad():
        want = model(tokens).logits
        got = bridge(tokens)
    assert _rel(got, want) <= 1e-5
    # bias-free, no soft-cap: with the norms' scales, the attention pattern and the GeGLU gate held constant the
    # bridge is linear in its embeddings, so the plain model's explanation is complete too
    explanation = lens.explain_logits(bridge, tokens, target=5)
    torch.testing.assert_close(explanation.explained, want[:, -1, 5], rtol=1e-5, atol=1e-6)
    assert explanation.completeness_error.max() <= 1e-4


def test_a_soft_capped_plain_gemma2_bridge_computes_the_models_logits():
    model = _gemma2(final_logit_softcapping=0.5, attn_logit_softcapping=0.5)
    tokens = _tokens()
    with torch.no_grad():
        assert _rel(lens.transformer_bridge_from_hf(model)(tokens), model(tokens).logits) <= 1e-5


@pytest.mark.parametrize("converted", [False, True])
def test_the_bridge_refuses_a_gpt2_without_attention_scaling(converted):
    """GPT2Config(scale_attn_weights=False): the bridge splits c_attn and recomputes attention with scores scaled by
    1/sqrt(d_head) whatever the setting, so its logits were 47 % off the model's, silently. It is refused naming the
    setting and hooked_transformer_from_hf, which takes it (same logits)."""
    config = T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POS,
                          scale_attn_weights=False, bos_token_id=2, eos_token_id=2)
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(config).eval()
    if converted:
        model = bcosify(model, b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match=r"scale_attn_weights=False.*hooked_transformer_from_hf"):
        lens.transformer_bridge_from_hf(model)
    if lens.HAS_HOOKED_TRANSFORMER:
        tokens = _tokens()
        with torch.no_grad():
            assert _rel(lens.hooked_transformer_from_hf(model)(tokens), model(tokens).logits) <= 1e-5


def test_resizing_an_untied_bcos_gemma2_keeps_its_soft_capped_head(tmp_path):
    """resize_token_embeddings after bcosify put a plain nn.Linear LM head into an untied Gemma 2, whose forward
    leaves the cap to the head: the logits came out uncapped (16 % off), and load_bcos_model rebuilt the capped
    model from the saved one, so the reloaded logits differed too; nothing said so."""
    from bcos_plugins import explain, load_bcos_model

    model = bcosify(_gemma2(tie_word_embeddings=False, final_logit_softcapping=0.5), b=1.25, verbose=False)
    model.resize_token_embeddings(VOCAB + 5)
    tokens = _tokens()
    with torch.no_grad():
        logits = model(tokens).logits
        hidden = model.model(tokens).last_hidden_state
        uncapped = hidden @ model.lm_head.weight.T
    torch.testing.assert_close(logits, 0.5 * torch.tanh(uncapped / 0.5), rtol=1e-5, atol=1e-6)
    explanation = explain(model, tokens, target=VOCAB + 2)
    torch.testing.assert_close(explanation.explained, logits[:, -1, VOCAB + 2])
    assert explanation.completeness_error.max() <= 1e-4
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(load_bcos_model(tmp_path).eval()(tokens).logits, logits)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_model_without_blocks_is_converted_and_explained(family):
    """num_hidden_layers=0 (embeddings, final norm, head) was refused by bcosify as an unknown leaf module: the empty
    ModuleList of blocks was "neither a linear layer, a norm, nor a supported activation", a reason no fix could
    meet. The TransformerLens model of it was refused right after make_explainable as "not detachable, call
    make_explainable", and token_component_decomposition asked for the hook point 'blocks.-1.hook_resid_post'."""
    from bcos_plugins import explain

    config = tiny_config(family)
    config.num_hidden_layers = 0
    name = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "bert": "BertForSequenceClassification"}[family]
    torch.manual_seed(0)
    model = bcosify(getattr(T, name)(config).eval(), b=1.25, verbose=False)
    tokens = _tokens()
    with torch.no_grad():
        logits = model(tokens).logits
    classifier = logits.dim() == 2
    explanation = explain(model, tokens, target=1 if classifier else 5)
    torch.testing.assert_close(explanation.explained, logits[:, 1] if classifier else logits[:, -1, 5])
    assert explanation.completeness_error.max() <= 1e-4
    if classifier or not lens.HAS_HOOKED_TRANSFORMER:
        return
    lens_model = lens.hooked_transformer_from_hf(model)
    lens_explanation = lens.explain_logits(lens_model, tokens, target=5)
    torch.testing.assert_close(lens_explanation.explained, logits[:, -1, 5], rtol=1e-5, atol=1e-6)
    assert lens_explanation.completeness_error.max() <= 1e-4
    with pytest.raises(BcosValueError, match=r"no blocks \(cfg.n_layers=0\).*explain_logits"):
        lens.token_component_decomposition(lens_model, tokens, target=5)


def _length_scaled_llama(rope_type: str):
    import copy

    head = 8  # hidden 32 / 4 heads
    rope = {"rope_type": rope_type, "rope_theta": 10000.0}
    rope.update({"factor": 2.0} if rope_type == "dynamic" else
                {"short_factor": [1.0] * (head // 2), "long_factor": [3.0] * (head // 2),
                 "original_max_position_embeddings": 8})
    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=8, pad_token_id=0,
                           rope_parameters=rope)
    torch.manual_seed(0)
    model = bcosify(T.LlamaForCausalLM(config).eval(), b=1.25, verbose=False)
    return model, copy.deepcopy(model)  # a fresh copy: transformers' dynamic rotary embedding keeps state across calls


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_a_padded_batch_is_refused_where_the_rotary_frequencies_follow_the_longest_row(rope_type):
    """"dynamic" rotary scaling recomputes its frequencies from the longest position past max_position_embeddings,
    "longrope" switches to its long factors past original_max_position_embeddings: in a left-padded batch of rows of
    14 and 6 tokens the short row got the long row's frequencies, and explain (and the bridge's explain_logits /
    token_component_decomposition) explained a value 0.6 % (dynamic) / 1.5 % (longrope) off the row's own logit,
    complete to it and without an error. Rows of equal length are explained as before."""
    from bcos_plugins import explain

    model, fresh = _length_scaled_llama(rope_type)
    ids = torch.randint(3, VOCAB, (2, 14), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, :8] = 0
    with torch.no_grad():
        alone = fresh(ids[1:, 8:]).logits[0, -1]
    target = int(alone.abs().argmax())
    refusal = rf"attention_mask: row \[1\] is shorter than the batch's longest row \(14 tokens\).*{rope_type}.*one row"
    with pytest.raises(BcosValueError, match=refusal):
        explain(model, ids, mask, target=target)
    bridge = lens.transformer_bridge_from_hf(model)
    for entry in (lens.explain_logits, lens.token_component_decomposition):
        with pytest.raises(BcosValueError, match=refusal):
            entry(bridge, ids, target=target, attention_mask=mask)
    explanation = explain(model, ids[1:, 8:], target=target)  # the row alone
    torch.testing.assert_close(explanation.explained[0], alone[target], rtol=1e-5, atol=1e-6)
    assert explanation.completeness_error.max() <= 1e-4


@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_a_decoder_classifier_without_a_pad_id_names_the_fix_for_a_batch(name):
    """pad_token_id=None: an unpadded batch of two rows failed inside transformers with "Cannot handle batch sizes > 1
    if no padding token is defined" (no fix named; the padded batch was already refused naming it); one row is
    explained as before."""
    from bcos_plugins import explain

    config = tiny_config("gpt2" if name.startswith("GPT2") else "llama")
    config.pad_token_id = None
    torch.manual_seed(0)
    model = bcosify(getattr(T, name)(config).eval(), b=1.25, verbose=False)
    tokens = _tokens()
    with pytest.raises(BcosValueError, match=r"input_ids: a batch of 2 rows.*no config.pad_token_id.*"
                                             r"model.config.pad_token_id = tokenizer.pad_token_id"):
        explain(model, tokens, target=1)
    explanation = explain(model, tokens[:1], target=1)
    with torch.no_grad():
        torch.testing.assert_close(explanation.explained, model(tokens[:1]).logits[:, 1])
    assert explanation.completeness_error.max() <= 1e-4
