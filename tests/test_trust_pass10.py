"""Tenth trust pass: the mistakes a newcomer makes from the README and the docs (another model's tokenizer, a
classifier given to inseq's own loader, explanations of the wrong kind handed to the page builders, label names of
another dataset). Each case that was silently wrong or crashed unhelpfully, one test each: refused naming the
argument, the problem and the fix."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import hooked_transformer_from_hf_or_none

from bcos_plugins import bcosify, explain
from bcos_plugins.data import shipped_data
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.visualize import explanation_sections_to_html, explanations_to_html, tokens_to_html


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ------------------------------------------------------------------ another model's tokenizer


def test_explain_dataset_refuses_another_models_tokenizer_whose_ids_happen_to_fit(minilm_bcos_bert, gpt2_tokenizer):
    """GPT-2's tokenizer (50257 tokens) on a BERT (30522 rows): short English texts get ids below 30522, so the
    texts were explained as BERT's tokens of those ids ('¨ Ġhelp ...' beside the scores), silently."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, _, _ = minilm_bcos_bert
    with pytest.raises(BcosValueError, match=r"^tokenizer: GPT2Tokenizer\(.*\) has 50257 tokens, but "
                                             r"BertForSequenceClassification has 30522 embedding rows: the tokenizer "
                                             r"is another model's\. Pass the tokenizer saved with the model"):
        explain_dataset(model, gpt2_tokenizer, ["a film", "dull"])


def test_explain_dataset_refuses_a_tokenizer_name(minilm_bcos_bert):
    """A hub name as the tokenizer failed with AttributeError: 'str' object has no attribute 'pad_token'."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, _, _ = minilm_bcos_bert
    with pytest.raises(BcosTypeError, match=r"^tokenizer: expected a transformers tokenizer, got str "
                                            r"'bert-base-uncased'\. Pass the tokenizer object"):
        explain_dataset(model, "bert-base-uncased", ["a film"])


def test_load_classifier_refuses_another_models_tokenizer(minilm_bcos_bert, gpt2_tokenizer):
    """load_classifier(bert, gpt2_tokenizer).attribute(['a fine film']) ran and showed GPT-2 tokens' ids read as
    BERT's, silently."""
    inseq_adapter = pytest.importorskip("bcos_plugins.adapters.inseq")
    model, tokenizer, _ = minilm_bcos_bert
    with pytest.raises(BcosValueError, match=r"^tokenizer: .* has 50257 tokens, but BertForSequenceClassification "
                                             r"has 30522 embedding rows"):
        inseq_adapter.load_classifier(model, gpt2_tokenizer)
    out = inseq_adapter.load_classifier(model, tokenizer).attribute(["a fine film"])  # its own tokenizer still works
    assert out[0].source_attributions.shape[1] == 2


# ------------------------------------------------------------------ inseq's own loader


def test_inseq_load_model_refuses_a_bert_classifier_naming_load_classifier(minilm_bcos_bert):
    """inseq.load_model(bcos_bert, "bcos") failed inside inseq with TypeError: 'NoneType' object is not iterable
    (inseq reads the tokenizer's BOS token before the "bcos" method sees the model)."""
    inseq = pytest.importorskip("inseq")
    inseq_adapter = pytest.importorskip("bcos_plugins.adapters.inseq")
    model, tokenizer, _ = minilm_bcos_bert
    with pytest.raises(inseq_adapter.UnsupportedModelError,
                       match=r"^BertForSequenceClassification is a sequence classifier; inseq attributes generation "
                             r"models only\. Use bcos_plugins\.adapters\.inseq\.load_classifier"):
        inseq.load_model(model, "bcos", tokenizer=tokenizer)
    from inseq.models.huggingface_model import HuggingfaceModel

    load = HuggingfaceModel.load
    import importlib

    importlib.reload(inseq_adapter)  # importing again wraps inseq's loader once
    assert HuggingfaceModel.load is load


# ------------------------------------------------------------------ explanations of the wrong kind


def _captum_attributions(model, batch):
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    fwd = captum.EmbeddingForward(model)
    return captum.BcosAttribution(fwd).attribute(fwd.embed(batch["input_ids"], batch["attention_mask"]), target=1,
                                                 additional_forward_args=(batch["attention_mask"],))


def test_page_builders_refuse_what_is_not_one_token_explanation(minilm_bcos_bert):
    """A Captum tensor or a list of explanations failed with AttributeError: ... has no attribute 'tokens'; one
    explanation as the sections with TypeError: 'TokenExplanation' object is not iterable; an explanation as
    tokens_to_html's tokens with TypeError: object of type 'TokenExplanation' has no len()."""
    model, tokenizer, batch = minilm_bcos_bert
    expl = explain(model, batch["input_ids"], batch["attention_mask"])
    attributions = _captum_attributions(model, batch)
    with pytest.raises(BcosTypeError, match=r"^explanation: expected a token explanation \(from explain / "
                                            r"explain_logits\), got Tensor\. .*summed over the last dimension"):
        explanations_to_html(attributions, tokenizer)
    with pytest.raises(BcosTypeError, match=r"^explanation: .*got list\. Pass one explanation per call"):
        explanations_to_html([expl, expl], tokenizer)
    with pytest.raises(BcosTypeError, match=r"^sections: got one TokenExplanation, not a list of sections"):
        explanation_sections_to_html(expl, tokenizer)
    with pytest.raises(BcosTypeError, match=r"^sections\[0\]'s explanation: expected a token explanation"):
        explanation_sections_to_html([("class 1", attributions)], tokenizer)
    with pytest.raises(BcosTypeError, match=r"^tokens: got a TokenExplanation; tokens_to_html draws one row"):
        tokens_to_html(expl, expl.scores()[0])
    assert "<!doctype html>" in explanations_to_html(expl, tokenizer)  # the right kind still renders


def test_captum_records_refuse_the_wrong_kinds(minilm_bcos_bert):
    """visualization_records(captum_tensor, tok) failed with AttributeError; records_to_html(explanation) with
    TypeError: 'TokenExplanation' object is not iterable; (pos, dim) scores were refused without the fix."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model, tokenizer, batch = minilm_bcos_bert
    expl = explain(model, batch["input_ids"], batch["attention_mask"])
    attributions = _captum_attributions(model, batch)
    with pytest.raises(BcosTypeError, match=r"^explanation: expected a token explanation .* got Tensor"):
        captum.visualization_records(attributions, tokenizer)
    with pytest.raises(BcosTypeError, match=r"^records: must be Captum VisualizationDataRecords, got a "
                                            r"TokenExplanation\. Build them with visualization_records"):
        captum.records_to_html(expl)
    tokens = [tokenizer.convert_ids_to_tokens(row) for row in batch["input_ids"]]
    with pytest.raises(BcosValueError, match=r"^scores: example 0 has 7 tokens but scores of shape \(7, 32\)\. Sum "
                                             r"attributions over the embedding dimension first .*attr\.sum\(-1\)"):
        captum.visualization_records(scores=list(attributions), tokens=tokens)
    records = captum.visualization_records(scores=list(attributions.sum(-1)), tokens=tokens)
    assert "<table" in captum.records_to_html(iter(records))  # any iterable of records, as Captum's visualize_text


def test_image_explanations_are_refused_by_the_token_pages_naming_the_figure(tiny_vits, vit_images):
    """explain_image's result in a token page failed with AttributeError: 'ImageExplanation' has no 'tokens'."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    from bcos_plugins import explain_image

    images, targets = vit_images
    expl = explain_image(tiny_vits["bcos"], images, target=targets)
    for build in (explanations_to_html, captum.visualization_records):
        with pytest.raises(BcosTypeError, match=r"got ImageExplanation\. Draw image explanations with "
                                                r"bcos_plugins\.vision\.visualize\.save_explanation_figure"):
            build(expl, None)


def test_visualization_records_refuse_label_names_of_another_class_count(minilm_bcos_bert):
    """Three names (a 3-class dataset's) for a 2-class model's logits named class 1 'neg' (the name of class 1 in
    the list, not the model's), silently."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model, tokenizer, batch = minilm_bcos_bert
    expl = explain(model, batch["input_ids"], batch["attention_mask"])
    logits = model(**batch).logits
    with pytest.raises(BcosValueError, match=r"^label_names: has 3 names, but logits have 2 classes\. Pass one "
                                             r"name per class of the model"):
        captum.visualization_records(expl, tokenizer, logits=logits, label_names=["neutral", "negative", "positive"])
    records = captum.visualization_records(expl, tokenizer, logits=logits, label_names=["negative", "positive"])
    assert [r.pred_class for r in records] == [["negative", "positive"][int(i)] for i in logits.argmax(-1)]


# ------------------------------------------------------------------ the support statements of the host pages


def test_the_inseq_pages_name_exactly_the_registry_causal_lms():
    """The inseq pages said "Supported: B-cos GPT2LMHeadModel and LlamaForCausalLM" while the conformance suite runs
    load_model(m, "bcos") on every causal LM of the registry (Mistral, Qwen2, Qwen3, Gemma 2 too): the page lists
    what is tested, no more and no less."""
    import re
    from pathlib import Path

    from bcos_plugins.convert.architectures import specs_where

    causal_lms = set(specs_where(lambda spec: spec.head == "causal_lm"))
    docs = Path(__file__).resolve().parents[1] / "docs"
    for page, marker in (("hosts/inseq.md", "- **Supported**:"), ("in-depth.md", "- Supported:")):
        text = (docs / page).read_text(encoding="utf-8")
        item = text.split(marker, 1)[1].split("\n- ", 1)[0]
        named = set(re.findall(r"`(\w+ForCausalLM|\w+LMHeadModel)`", item))
        assert named == causal_lms, f"{page}: names {sorted(named)}, the registry's causal LMs are {sorted(causal_lms)}"


@pytest.mark.parametrize("name", ["BertForMaskedLM", "GPT2Model"])
def test_inseq_load_model_refuses_masked_lms_and_base_models(name, gpt2_tokenizer):
    """The inseq page's refused cells beyond the tested ones: a B-cos masked LM (it failed inside inseq's loader on
    the missing BOS token, TypeError: 'NoneType' object is not iterable) and a base model, each named."""
    inseq = pytest.importorskip("inseq")
    inseq_adapter = pytest.importorskip("bcos_plugins.adapters.inseq")
    torch.manual_seed(0)
    if name == "BertForMaskedLM":
        tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
        model = T.BertForMaskedLM(T.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=4, intermediate_size=64))
        reason = r"a masked LM, which predicts tokens in place and cannot generate"
    else:
        tokenizer = gpt2_tokenizer
        model = T.GPT2Model(T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=4))
        reason = r"a base model: it returns hidden states and has no LM head to generate with"
    model = bcosify(model.eval(), b=1.1, verbose=False)
    with pytest.raises(inseq_adapter.UnsupportedModelError, match=rf"^{name} is {reason}\. Supported: causal LMs "):
        inseq.load_model(model, "bcos", tokenizer=tokenizer)




@pytest.mark.parametrize("option, message", [
    (dict(clip_qkv=1.0), r"^clip_qkv=1\.0 clamps the values, which is not dynamic-weight; set clip_qkv=None\."),
    (dict(num_experts=2, experts_per_token=1, gated_mlp=True),
     r"^mixture-of-experts MLPs \(num_experts\) are not supported; use a dense MLP\."),
])
def test_the_transformer_lens_limits_clipped_qkv_and_experts_are_refused_plain_and_bcos(option, message):
    """Two refused cells of the TransformerLens page's limits that no test exercised (clipped QKV, mixtures of
    experts): refused for a B-cos config and by make_explainable on a plain HookedTransformer."""
    lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    if hooked_transformer_from_hf_or_none() is None:  # TransformerLens 4: no HookedTransformer (refusal checked)
        return
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    fields = dict(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=50, n_ctx=16, act_fn="silu",
                  **option)

    with pytest.raises(BcosValueError, match=message):
        lens.BcosHookedTransformer(lens.BcosTransformerConfig(**fields))
    with pytest.raises(BcosValueError, match=message):
        lens.make_explainable(HookedTransformer(HookedTransformerConfig(**fields)))


@pytest.mark.parametrize("rope_type", ["linear", "dynamic"])
def test_the_transformer_lens_limit_on_rope_types_is_refused(rope_type):
    """The page's "rope types other than the default (and Llama 3's)" cell, untested until now."""
    pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:  # TransformerLens 4: no HookedTransformer (its refusal is checked there)
        return
    torch.manual_seed(0)
    llama = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64,
                                             rope_scaling={"rope_type": rope_type, "factor": 2.0})).eval()
    with pytest.raises(BcosValueError, match=rf"^rope_type='{rope_type}' is not expressed by TransformerLens' Llama "
                                             r"config \(default and llama3 are\)"):
        from_hf(bcosify(llama, b=1.1, verbose=False))


# ------------------------------------------------------------------ a B-cos checkpoint loaded with plain transformers


@pytest.fixture(scope="module")
def plain_loaded(minilm_bcos_bert, gpt2_tokenizer, tmp_path_factory):
    """The B-cos BERT and a B-cos GPT-2, saved with save_pretrained and loaded back with plain AutoModel (stock
    modules, config.bcos kept: what a newcomer gets from transformers' own loader)."""
    folder = tmp_path_factory.mktemp("saved")
    model, _, _ = minilm_bcos_bert
    model.save_pretrained(folder / "bert")
    torch.manual_seed(0)
    gpt2 = bcosify(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(gpt2_tokenizer), n_embd=32, n_layer=2, n_head=4,
                                                  n_positions=64)).eval(), b=1.1, verbose=False)
    gpt2.save_pretrained(folder / "gpt2")
    return (T.AutoModelForSequenceClassification.from_pretrained(folder / "bert").eval(),
            T.AutoModelForCausalLM.from_pretrained(folder / "gpt2").eval())


STOCK_LOADED = (r"^{argument}: {name} has B-cos settings in its config \(config\.bcos\) but no B-cos modules: it was "
                r"saved from a B-cos model and loaded with plain transformers, so it runs the stock model\. Load it with "
                r"bcos_plugins\.load_bcos_model\(path\)")


def test_predict_and_the_metrics_refuse_a_b_cos_checkpoint_loaded_as_a_stock_model(minilm_bcos_bert, plain_loaded):
    """predict gave the stock model's logits (0.26 off the B-cos model's) and perplexity / perturbation_curves scored
    the stock model, silently (explain refused it already)."""
    from bcos_plugins.metrics import perplexity
    from bcos_plugins.prediction import predict

    bert_model, tokenizer, batch = minilm_bcos_bert
    stock_bert, stock_gpt2 = plain_loaded
    with pytest.raises(BcosTypeError, match=STOCK_LOADED.format(argument="model", name="BertForSequenceClassification")):
        predict(stock_bert, tokenizer, ["a film"])
    with pytest.raises(BcosTypeError, match=STOCK_LOADED.format(argument="model", name="GPT2LMHeadModel")):
        perplexity(stock_gpt2, [[3, 9, 5, 7]])
    pytest.importorskip("captum")
    from bcos_plugins.metrics import perturbation_curves

    expl = explain(bert_model, batch["input_ids"], batch["attention_mask"])
    with pytest.raises(BcosTypeError, match=STOCK_LOADED.format(argument="model", name="BertForSequenceClassification")):
        perturbation_curves(stock_bert, batch["input_ids"], batch["attention_mask"], expl, tokenizer=tokenizer)
    torch.testing.assert_close(predict(bert_model, tokenizer, ["a film"]),  # the B-cos model itself still predicts
                               bert_model(**tokenizer(["a film"], return_tensors="pt")).logits.detach())


def test_transformer_bridge_from_hf_refuses_a_b_cos_checkpoint_loaded_as_a_stock_model(plain_loaded, gpt2_tokenizer):
    """The bridge wrapped the stock GPT-2 (logits 0.79 off the saved B-cos model's) and explain_logits called it
    complete, silently; hooked_transformer_from_hf reads config.bcos and builds the B-cos model."""
    lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    _, stock_gpt2 = plain_loaded
    with pytest.raises(BcosTypeError, match=STOCK_LOADED.format(argument="hf_model", name="GPT2LMHeadModel")):
        lens.transformer_bridge_from_hf(stock_gpt2, tokenizer=gpt2_tokenizer)


# ------------------------------------------------------------------ smaller traps


def test_a_tokenizer_without_the_explained_ids_is_named_by_the_page_builders(minilm_bcos_bert, gpt2_tokenizer):
    """A GPT-2's explanation rendered with BERT's tokenizer: ids past BERT's 30522 tokens became None tokens, on which
    explanations_to_html failed (AttributeError: 'NoneType' object has no attribute 'replace') and
    visualization_records built records whose page failed later."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    _, bert_tokenizer, _ = minilm_bcos_bert
    torch.manual_seed(0)
    gpt2 = bcosify(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(gpt2_tokenizer), n_embd=32, n_layer=1, n_head=4,
                                                  n_positions=64)).eval(), b=1.1, verbose=False)
    expl = explain(gpt2, torch.tensor([[464, 40000, 45000, 318]]), target=5)
    for build in (explanations_to_html, captum.visualization_records):
        with pytest.raises(BcosValueError, match=r"^tokenizer: BertTokenizer(Fast)? has no token for id 40000 \(row 0, "
                                                 r"position 1; 2 such tokens\): it is not the tokenizer of the "
                                                 r"explained model\. Pass the tokenizer the explained ids came from"):
            build(expl, bert_tokenizer)
    assert "<!doctype html>" in explanations_to_html(expl, gpt2_tokenizer)


def test_completeness_error_of_an_explanation_needs_no_second_argument(minilm_bcos_bert):
    """metrics.completeness_error(explanation) failed with TypeError: missing 1 required positional argument:
    'explained' (the explanation holds it); a tensor without it is refused naming explained."""
    from bcos_plugins.metrics import completeness_error

    model, _, batch = minilm_bcos_bert
    expl = explain(model, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(completeness_error(expl), expl.completeness_error)
    torch.testing.assert_close(completeness_error(expl, expl.explained), expl.completeness_error)
    with pytest.raises(BcosTypeError, match=r"^explained: is missing: the attributions are a tensor"):
        completeness_error(expl.input_contributions)


def test_integrated_gradients_at_a_b_cos_berts_attribution_point_sums_to_about_zero_as_the_captum_page_says(minilm_bcos_bert):
    """The Captum page's warning, pinned: the combined embedding of a B-cos BERT feeds the embedding LayerNorm
    (scale-invariant), so IG from the zero baseline there sees a constant function along its path."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    from captum.attr import IntegratedGradients

    model, _, batch = minilm_bcos_bert
    fwd = captum.EmbeddingForward(model)
    emb = fwd.embed(batch["input_ids"], batch["attention_mask"])
    attributions, delta = IntegratedGradients(fwd).attribute(emb, target=1, n_steps=16, return_convergence_delta=True,
                                                             additional_forward_args=(batch["attention_mask"],))
    logits = model(**batch).logits[:, 1].detach()
    assert (attributions.sum(dim=(1, 2)).abs() < 1e-3 * logits.abs()).all()
    torch.testing.assert_close(delta.abs().float(), logits.abs(), rtol=1e-3, atol=1e-6)
    b_cos = captum.BcosAttribution(fwd).attribute(emb, target=1, additional_forward_args=(batch["attention_mask"],))
    torch.testing.assert_close(b_cos.sum(dim=(1, 2)), logits, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ segment ids


@pytest.mark.parametrize("bad, named", [(2, "holds 2, outside the model's 2 segment types"),
                                        (-1, "holds -1, outside the model's 2 segment types")])
def test_explain_refuses_segment_ids_outside_the_type_table(minilm_bcos_bert, bad, named):
    """token_type_ids=2 on a two-type BERT failed inside the embedding lookup with a bare 'IndexError: index out of
    range in self', naming neither the argument nor the limit."""
    model, _, batch = minilm_bcos_bert
    types = torch.zeros_like(batch["input_ids"])
    types[0, 1] = bad
    with pytest.raises(BcosValueError, match=rf"^token_type_ids: {named} \(config\.type_vocab_size\), 0 to 1\. "):
        explain(model, batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types, target=1)


def test_explain_refuses_float_segment_ids(minilm_bcos_bert):
    model, _, batch = minilm_bcos_bert
    with pytest.raises(BcosValueError, match=r"^token_type_ids: is a torch\.float32 tensor; segment ids are integers"):
        explain(model, batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=torch.zeros(batch["input_ids"].shape), target=1)


def test_explain_takes_segment_ids_inside_the_table(minilm_bcos_bert):
    """A pair's second segment (type 1) is explained, complete, and differs from the all-zero segments."""
    model, _, batch = minilm_bcos_bert
    types = torch.zeros_like(batch["input_ids"])
    types[:, 2:] = 1
    paired = explain(model, batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types, target=1)
    single = explain(model, batch["input_ids"], attention_mask=batch["attention_mask"], target=1)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types).logits[:, 1]
    torch.testing.assert_close(paired.explained, logits.detach())
    assert not torch.allclose(paired.explained, single.explained)
