"""Tenth trust pass: the mistakes a newcomer makes from the README and the docs (another model's tokenizer, a
classifier given to inseq's own loader, explanations of the wrong kind handed to the page builders, label names of
another dataset). Each case that was silently wrong or crashed unhelpfully, one test each: refused naming the
argument, the problem and the fix."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify, explain
from bcos_plugins.data import shipped_data
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.visualize import explanation_sections_to_html, explanations_to_html, tokens_to_html


@pytest.fixture(scope="module")
def bert():
    """A tiny B-cos BERT sentiment classifier over the bert-base-uncased vocabulary, its tokenizer, a padded batch."""
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, num_labels=2)
    model = bcosify(T.BertForSequenceClassification(config).eval(), b=1.5, verbose=False)
    batch = tokenizer(["a gorgeous, witty film", "dull"], padding=True, return_tensors="pt")
    return model, tokenizer, batch


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ------------------------------------------------------------------ another model's tokenizer


def test_explain_dataset_refuses_another_models_tokenizer_whose_ids_happen_to_fit(bert, gpt2_tokenizer):
    """GPT-2's tokenizer (50257 tokens) on a BERT (30522 rows): short English texts get ids below 30522, so the
    texts were explained as BERT's tokens of those ids ('¨ Ġhelp ...' beside the scores), silently."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, _, _ = bert
    with pytest.raises(BcosValueError, match=r"^tokenizer: GPT2Tokenizer\(.*\) has 50257 tokens, but "
                                             r"BertForSequenceClassification has 30522 embedding rows: the tokenizer "
                                             r"is another model's\. Pass the tokenizer saved with the model"):
        explain_dataset(model, gpt2_tokenizer, ["a film", "dull"])


def test_explain_dataset_refuses_a_tokenizer_name(bert):
    """A hub name as the tokenizer failed with AttributeError: 'str' object has no attribute 'pad_token'."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, _, _ = bert
    with pytest.raises(BcosTypeError, match=r"^tokenizer: expected a transformers tokenizer, got str "
                                            r"'bert-base-uncased'\. Pass the tokenizer object"):
        explain_dataset(model, "bert-base-uncased", ["a film"])


def test_load_classifier_refuses_another_models_tokenizer(bert, gpt2_tokenizer):
    """load_classifier(bert, gpt2_tokenizer).attribute(['a fine film']) ran and showed GPT-2 tokens' ids read as
    BERT's, silently."""
    inseq_adapter = pytest.importorskip("bcos_plugins.adapters.inseq")
    model, tokenizer, _ = bert
    with pytest.raises(BcosValueError, match=r"^tokenizer: .* has 50257 tokens, but BertForSequenceClassification "
                                             r"has 30522 embedding rows"):
        inseq_adapter.load_classifier(model, gpt2_tokenizer)
    out = inseq_adapter.load_classifier(model, tokenizer).attribute(["a fine film"])  # its own tokenizer still works
    assert out[0].source_attributions.shape[1] == 2


# ------------------------------------------------------------------ inseq's own loader


def test_inseq_load_model_refuses_a_bert_classifier_naming_load_classifier(bert):
    """inseq.load_model(bcos_bert, "bcos") failed inside inseq with TypeError: 'NoneType' object is not iterable
    (inseq reads the tokenizer's BOS token before the "bcos" method sees the model)."""
    inseq = pytest.importorskip("inseq")
    inseq_adapter = pytest.importorskip("bcos_plugins.adapters.inseq")
    model, tokenizer, _ = bert
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


def test_page_builders_refuse_what_is_not_one_token_explanation(bert):
    """A Captum tensor or a list of explanations failed with AttributeError: ... has no attribute 'tokens'; one
    explanation as the sections with TypeError: 'TokenExplanation' object is not iterable; an explanation as
    tokens_to_html's tokens with TypeError: object of type 'TokenExplanation' has no len()."""
    model, tokenizer, batch = bert
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


def test_captum_records_refuse_the_wrong_kinds(bert):
    """visualization_records(captum_tensor, tok) failed with AttributeError; records_to_html(explanation) with
    TypeError: 'TokenExplanation' object is not iterable; (pos, dim) scores were refused without the fix."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model, tokenizer, batch = bert
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


def test_visualization_records_refuse_label_names_of_another_class_count(bert):
    """Three names (a 3-class dataset's) for a 2-class model's logits named class 1 'neg' (the name of class 1 in
    the list, not the model's), silently."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model, tokenizer, batch = bert
    expl = explain(model, batch["input_ids"], batch["attention_mask"])
    logits = model(**batch).logits
    with pytest.raises(BcosValueError, match=r"^label_names: has 3 names, but logits have 2 classes\. Pass one "
                                             r"name per class of the model"):
        captum.visualization_records(expl, tokenizer, logits=logits, label_names=["neutral", "negative", "positive"])
    records = captum.visualization_records(expl, tokenizer, logits=logits, label_names=["negative", "positive"])
    assert [r.pred_class for r in records] == [["negative", "positive"][int(i)] for i in logits.argmax(-1)]
