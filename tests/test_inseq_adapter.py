"""inseq adapter: "bcos" through inseq.load_model / attribute / show / aggregate / save-load on tiny random B-cos
GPT-2 and Llama with the shipped GPT-2 tokenizer (no hub), exactness against the model's own logits, attributed
functions, batched prompts, B-cos classifiers as inseq outputs, registration and error paths."""

from __future__ import annotations

import importlib
import warnings

import bcos_plugins.adapters.inseq as adapter
import inseq
import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import LayerBcos
from inseq.attr.feat import FeatureAttribution
from inseq.data.aggregation_functions import DEFAULT_ATTRIBUTION_AGGREGATE_DICT
from inseq.data.aggregator import Aggregator
from inseq.utils import Registry

from bcos_plugins import bcosify
from bcos_plugins.attribution import has_dynamic_weights
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.errors import BcosTypeError, BcosValueError

TOKENIZER_DIR = SHIPPED_DATA / "gpt2_tokenizer"
PROMPTS = ["The cat sat on the", "Hello"]
NEW_TOKENS = 3


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)


def _tiny_lm(family: str, vocab: int, seed: int = 0, bcos_query_key: bool = True):
    torch.manual_seed(seed)
    if family == "gpt2":
        config = T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64)
        model = T.GPT2LMHeadModel(config)
        with torch.no_grad():  # GPT-2 initialises biases at 0: non-zero ones make a lost query/key bias visible
            for block in model.transformer.h:
                block.attn.c_attn.bias.normal_(0, 0.5)
    else:
        config = T.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                               bos_token_id=vocab - 1, eos_token_id=vocab - 1)
        model = T.LlamaForCausalLM(config)
    return bcosify(model.eval(), b=1.1, bcos_query_key=bcos_query_key, verbose=False)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def generation(request, gpt2_tokenizer):
    """A B-cos LM loaded with "bcos" and one batched attribution of two prompts of different length."""
    model = _tiny_lm(request.param, len(gpt2_tokenizer))
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    out = attribution_model.attribute(PROMPTS, generation_args={"max_new_tokens": NEW_TOKENS, "do_sample": False},
                                      step_scores=["logit"], show_progress=False)
    return request.param, model, attribution_model, out


def _model_logits(model, tokenizer, ids: list[int]) -> torch.Tensor:
    """Next-token logits of the model itself after every prefix of ``ids`` (unpadded, one row)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_generation_is_exact_signed_and_matches_the_models_own_logits(generation, gpt2_tokenizer):
    family, model, attribution_model, out = generation
    assert attribution_model.default_attributed_fn_id == "logit"
    assert len(out.sequence_attributions) == 2
    signs = set()
    for seq in out.sequence_attributions:
        assert isinstance(seq, adapter.BcosSequenceAttribution)
        contributions = seq.target_attributions  # decoder-only: (prefix tokens, generated tokens, d_model)
        assert contributions.shape[1:] == (NEW_TOKENS, 32)
        logits, deltas = seq.step_scores["logit"], seq.step_scores["deltas"]
        totals = torch.nansum(contributions, dim=(0, 2))
        torch.testing.assert_close(totals, logits, rtol=1e-4, atol=1e-5)
        assert deltas.abs().max() <= 1e-4 * logits.abs().max().clamp_min(1.0)
        torch.testing.assert_close(totals - logits, deltas, rtol=0, atol=1e-5)

        # the attributed values are the model's own next-token logits, also for the left-padded short prompt
        ids = [t.id for t in seq.target]
        own = _model_logits(model, gpt2_tokenizer, ids)
        for step in range(NEW_TOKENS):
            pos = seq.attr_pos_start + step
            torch.testing.assert_close(logits[step], own[pos - 1, ids[pos]], rtol=1e-4, atol=1e-5)

        # default aggregation: signed sum over d_model, not normalised -> token scores still sum to the logit
        aggregated = seq.aggregate()
        assert aggregated.target_attributions.ndim == 2
        torch.testing.assert_close(torch.nansum(aggregated.target_attributions, 0), logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(aggregated.target_attributions, contributions.sum(-1), equal_nan=True)
        signs |= set(aggregated.target_attributions.nan_to_num().sign().flatten().tolist())
        # inseq's own default for gradient outputs (vector norm) is still one call away and loses the sign
        assert (seq.aggregate("vnorm").target_attributions.nan_to_num() >= 0).all()
    assert {-1.0, 1.0} <= signs, "signed scores expected: B-cos contributions of a random model have both signs"
    assert "sum" not in str(DEFAULT_ATTRIBUTION_AGGREGATE_DICT["target_attributions"]), \
        "B-cos settings leaked into inseq's shared aggregation defaults"


def test_the_method_holds_a_captum_attribution_at_the_embedding_point(generation):
    family, model, attribution_model, out = generation
    method = attribution_model.attribution_method
    assert isinstance(method, adapter.BcosInseqAttribution) and isinstance(method.method, LayerBcos)
    embedding_point = model.transformer.drop if family == "gpt2" else model.model.embed_tokens
    assert method.method.layer is embedding_point


def test_inseq_quirks_worked_around_are_still_there():
    # fails when inseq changes one of them: then revisit adapters/inseq.py's _Inseq071
    quirks = adapter._Inseq071.quirks_present()
    assert quirks == dict.fromkeys(quirks, True), quirks


def test_batched_prompt_scores_equal_the_prompt_alone(generation):
    family, model, attribution_model, out = generation
    short = out.sequence_attributions[1]
    alone = attribution_model.attribute(PROMPTS[1], out.info["generated_texts"][1], step_scores=["logit"],
                                        show_progress=False).sequence_attributions[0]
    torch.testing.assert_close(alone.step_scores["logit"], short.step_scores["logit"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(alone.aggregate().target_attributions, short.aggregate().target_attributions,
                               rtol=1e-4, atol=1e-5, equal_nan=True)


def test_show_returns_html_and_save_load_round_trips(generation, tmp_path):
    family, model, attribution_model, out = generation
    html = out.show(display=False, return_html=True)
    assert isinstance(html, str) and "<table" in html
    first = out.sequence_attributions[0]
    assert all(t.token.replace("Ġ", " ").strip() in html for t in first.source if t.token.strip("Ġ"))

    path = tmp_path / "bcos.json"
    out.save(path)
    loaded = inseq.FeatureAttributionOutput.load(path)
    assert loaded.info["attribution_method"] == "bcos"
    for before, after in zip(out.sequence_attributions, loaded.sequence_attributions, strict=True):
        assert isinstance(after, adapter.BcosSequenceAttribution)
        torch.testing.assert_close(after.target_attributions, before.target_attributions, equal_nan=True)
        torch.testing.assert_close(after.step_scores["deltas"], before.step_scores["deltas"])
        torch.testing.assert_close(torch.nansum(after.aggregate().target_attributions, 0), before.step_scores["logit"],
                                   rtol=1e-4, atol=1e-5)


def test_inseq_targets_raise_no_layer_completeness_warning(gpt2_tokenizer):
    # inseq's attributed function is not the output LayerBcos would compare with: its "deltas" report the gap
    model = _tiny_lm("gpt2", len(gpt2_tokenizer), seed=1)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attribution_model.attribute("The cat", "The cat sat down", attributed_fn="probability", show_progress=False)
        attribution_model.attribute("The cat", "The cat sat down", attributed_fn="contrast_logits_diff",
                                    contrast_targets="The cat ran away", show_progress=False)
    assert not [w for w in caught if "LayerBcos" in str(w.message)], [str(w.message) for w in caught]


def test_contrastive_and_probability_targets(gpt2_tokenizer):
    model = _tiny_lm("gpt2", len(gpt2_tokenizer), seed=1)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    prompt, target, contrast = "The cat", "The cat sat down", "The cat ran away"
    with pytest.warns(UserWarning, match="Contrastive inputs"):
        contrastive = attribution_model.attribute(
            prompt, target, attributed_fn="contrast_logits_diff", contrast_targets=contrast,
            show_progress=False).sequence_attributions[0]
    totals = torch.nansum(contrastive.target_attributions, dim=(0, 2))
    assert contrastive.step_scores["deltas"].abs().max() < 1e-4
    # As an attributed function (contrast_force_inputs=False) inseq takes both logits from the original prefix:
    # logit(target token) - logit(contrast token). (Its step score of the same name uses the contrast prefix.)
    target_ids = gpt2_tokenizer(target)["input_ids"]  # contrastive outputs name tokens "sat → ran"
    contrast_ids = gpt2_tokenizer(contrast)["input_ids"]
    own = _model_logits(model, gpt2_tokenizer, target_ids)
    assert len(totals) == 2
    for step in range(len(totals)):
        pos = contrastive.attr_pos_start + step
        torch.testing.assert_close(totals[step], own[pos - 1, target_ids[pos]] - own[pos - 1, contrast_ids[pos]],
                                   rtol=1e-4, atol=1e-5)

    # probability: contributions sum to sum_j z_j dp/dz_j = p (z_t - E_p[z]); deltas = that - p
    prob = attribution_model.attribute(prompt, target, attributed_fn="probability", step_scores=["probability"],
                                       show_progress=False).sequence_attributions[0]
    for step in range(len(prob.step_scores["probability"])):
        pos = prob.attr_pos_start + step
        z = own[pos - 1].double()
        p = z.softmax(-1)
        first_order = p[target_ids[pos]] * (z[target_ids[pos]] - (p * z).sum())
        total = torch.nansum(prob.target_attributions[:, step]).double()
        torch.testing.assert_close(total, first_order, rtol=1e-3, atol=1e-9)
        torch.testing.assert_close(prob.step_scores["deltas"][step].double(),
                                   first_order - prob.step_scores["probability"][step].double(), rtol=1e-3, atol=1e-9)


def test_contrastive_attribution_on_llama_is_exact(gpt2_tokenizer):
    # regression: inseq embeds the contrast targets with the embedding layer, which is Llama's attribution point
    model = _tiny_lm("llama", len(gpt2_tokenizer), seed=1)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    target, contrast = "The cat sat down", "The cat ran away"
    with pytest.warns(UserWarning, match="Contrastive inputs"):
        seq = attribution_model.attribute("The cat", target, attributed_fn="contrast_logits_diff",
                                          contrast_targets=contrast, show_progress=False).sequence_attributions[0]
    target_ids, contrast_ids = gpt2_tokenizer(target)["input_ids"], gpt2_tokenizer(contrast)["input_ids"]
    own = _model_logits(model, gpt2_tokenizer, target_ids)
    totals = torch.nansum(seq.target_attributions, dim=(0, 2))
    assert len(totals) == 2 and seq.step_scores["deltas"].abs().max() < 1e-4
    for step in range(len(totals)):
        pos = seq.attr_pos_start + step
        torch.testing.assert_close(totals[step], own[pos - 1, target_ids[pos]] - own[pos - 1, contrast_ids[pos]],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bcos_query_key", [True, False])
def test_load_model_from_a_saved_bcos_folder(gpt2_tokenizer, tmp_path, bcos_query_key):
    model = _tiny_lm("gpt2", len(gpt2_tokenizer), seed=2, bcos_query_key=bcos_query_key)
    model.transformer.h[1].mlp.c_fc.b = 1.4  # a per-layer B (as mid-way through a B warm-up) must come back
    model.save_pretrained(tmp_path)
    gpt2_tokenizer.save_pretrained(tmp_path)
    from_folder = inseq.load_model(str(tmp_path), "bcos")
    assert has_dynamic_weights(from_folder.model)
    assert from_folder.model.transformer.h[1].mlp.c_fc.b == 1.4
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(from_folder.model(ids).logits, model(ids).logits)
    kwargs = {"step_scores": ["logit"], "show_progress": False}
    a = from_folder.attribute("The cat", "The cat sat", **kwargs).sequence_attributions[0]
    b = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer).attribute("The cat", "The cat sat", **kwargs)
    torch.testing.assert_close(a.target_attributions, b.sequence_attributions[0].target_attributions,
                               rtol=1e-4, atol=1e-6, equal_nan=True)


# ------------------------------------------------------------------------------------------- classifiers


WORDS = ["the", "film", "was", "great", "awful", "plot", "acting", "not", "a", "bad", "good", "story"]


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_vocab")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    # transformers 5 ignores BertTokenizer(vocab_file=...) (it wants vocab=); loading the folder reads vocab.txt
    return T.BertTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification"])
def test_classifier_per_class_scores_sum_to_each_class_logit(name, bert_tokenizer, tmp_path):
    vocab = len(bert_tokenizer)
    config = (T.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, num_labels=3)
              if name.startswith("Bert") else
              T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_ctx=32, num_labels=3,
                           pad_token_id=bert_tokenizer.pad_token_id, bos_token_id=bert_tokenizer.cls_token_id,
                           eos_token_id=bert_tokenizer.sep_token_id))
    torch.manual_seed(0)
    model = bcosify(getattr(T, name)(config).eval(), b=1.25, verbose=False)
    labels = ["negative", "neutral", "positive"]
    classifier = adapter.load_classifier(model, bert_tokenizer, label_names=labels)
    texts = ["the film was great", "not a good story the acting was bad"]
    out = classifier.attribute(texts)
    assert isinstance(out, inseq.FeatureAttributionOutput) and len(out.sequence_attributions) == 2
    enc = bert_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        if name.startswith("GPT2"):
            enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        own = model(**enc).logits
    for row, seq in enumerate(out.sequence_attributions):
        assert [t.token for t in seq.target] == labels
        assert [t.id for t in seq.source] == enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
        assert seq.source_attributions.shape == (len(seq.source), 3, 32)
        torch.testing.assert_close(seq.source_attributions.sum(dim=(0, 2)), own[row], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(seq.step_scores["logit"], own[row], rtol=1e-4, atol=1e-5)
        assert seq.step_scores["deltas"].abs().max() < 1e-4
        torch.testing.assert_close(seq.step_scores["probability"].sum(), torch.tensor(1.0))
        tokens = seq.aggregate().source_attributions  # (tokens, classes), signed
        torch.testing.assert_close(tokens.sum(0), own[row], rtol=1e-4, atol=1e-5)
    assert out.info["generated_texts"] == [labels[int(i)] for i in own.argmax(-1)]

    html = out.show(display=False, return_html=True)
    assert all(label in html for label in labels) and "great" in html
    out.save(tmp_path / "clf.json")
    loaded = inseq.FeatureAttributionOutput.load(tmp_path / "clf.json")
    torch.testing.assert_close(loaded.sequence_attributions[1].source_attributions,
                               out.sequence_attributions[1].source_attributions)

    one = classifier.attribute("the plot was awful", target=[2]).sequence_attributions[0]
    assert [t.token for t in one.target] == ["positive"] and "probability" not in one.step_scores
    with pytest.raises(BcosValueError, match=r"target: must be class ids in \[0, 3\)"):
        classifier.attribute("the film", target=[3])
    # the 0.1 keyword is refused by name, pointing at the new one
    with pytest.raises(BcosTypeError, match=r"target_classes: .*calls it target since 0.2.*Pass target= instead"):
        classifier.attribute("the film", target_classes=[2])
    with pytest.raises(BcosTypeError, match="unexpected keyword argument 'classes'"):
        classifier.attribute("the film", classes=[2])


def test_gpt2_classifier_padded_with_another_id_gives_each_text_its_own_logits(bert_tokenizer):
    # the tokenizer pads with [PAD] (id 0) but the model's config names another pad id: explain (the core)
    # rewrites padding so that the classifier still reads each row's last real token
    vocab = len(bert_tokenizer)
    torch.manual_seed(1)
    config = T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_ctx=32, num_labels=2,
                          pad_token_id=bert_tokenizer.convert_tokens_to_ids("[MASK]"),
                          bos_token_id=bert_tokenizer.cls_token_id, eos_token_id=bert_tokenizer.sep_token_id)
    model = bcosify(T.GPT2ForSequenceClassification(config).eval(), b=1.25, verbose=False)
    classifier = adapter.load_classifier(model, bert_tokenizer)
    texts = ["the film was great and the acting good", "bad"]
    batched = classifier.attribute(texts).sequence_attributions
    for text, seq in zip(texts, batched, strict=True):
        alone = classifier.attribute(text).sequence_attributions[0]
        ids = bert_tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            own = model(**ids).logits[0]
        torch.testing.assert_close(seq.step_scores["logit"], own, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(seq.source_attributions, alone.source_attributions, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "DistilBertForSequenceClassification",
                                  "RobertaForSequenceClassification"])
def test_classifier_reading_the_first_column_refuses_a_left_padding_tokenizer(name, bert_tokenizer):
    """BERT, DistilBERT and RoBERTa classify from the first column's hidden state, a padding token's on a left-padded
    row: load_classifier explained a logit that changed with the batch (complete, silently). A tokenizer that pads on
    the left is refused with explain's message (argument, problem, fix); padded on the right, each text's
    attributions are those it gets alone."""
    import copy

    config_class = getattr(T, name.replace("ForSequenceClassification", "Config"))
    sizes = (dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64) if name.startswith("Distil") else
             dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    torch.manual_seed(2)
    model = bcosify(getattr(T, name)(config_class(vocab_size=len(bert_tokenizer), max_position_embeddings=40,
                                                  num_labels=2, pad_token_id=0, **sizes)).eval(),
                    b=1.25, verbose=False)
    tokenizer = copy.deepcopy(bert_tokenizer)
    if name.startswith("Distil"):  # DistilBERT has no token types (its own tokenizer gives none)
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    texts = ["the film was great and the acting good", "bad"]
    batched = adapter.load_classifier(model, tokenizer).attribute(texts).sequence_attributions
    for text, seq in zip(texts, batched, strict=True):
        alone = adapter.load_classifier(model, tokenizer).attribute(text).sequence_attributions[0]
        torch.testing.assert_close(seq.source_attributions, alone.source_attributions, rtol=1e-5, atol=1e-6)
    tokenizer.padding_side = "left"
    with pytest.raises(BcosValueError, match=rf"^tokenizer: pads on the left \(tokenizer\.padding_side='left'\), so "
                       rf"row \[1\] starts with padding, and {name} classifies "
                       r"from the first column.*Pad on the right \(tokenizer\.padding_side"):
        adapter.load_classifier(model, tokenizer).attribute(texts)


# ------------------------------------------------------------------------------------------- error paths


def test_unsupported_models_get_clear_errors(gpt2_tokenizer, bert_tokenizer):
    torch.manual_seed(0)
    t5 = T.T5ForConditionalGeneration(T.T5Config(vocab_size=len(gpt2_tokenizer), d_model=16, d_kv=4, d_ff=32,
                                                 num_layers=1, num_heads=2, decoder_start_token_id=0))
    with pytest.raises(adapter.UnsupportedModelError, match="encoder-decoder.*GPT2LMHeadModel, LlamaForCausalLM"):
        inseq.load_model(t5, "bcos", tokenizer=gpt2_tokenizer)

    stock = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(gpt2_tokenizer), n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(adapter.UnsupportedModelError, match="no B-cos.*bcosify"):
        inseq.load_model(stock, "bcos", tokenizer=gpt2_tokenizer)
    # the refusal does not stop other inseq methods on the same stock model
    assert inseq.load_model(stock, "input_x_gradient", tokenizer=gpt2_tokenizer).attribution_method is not None

    # (a BERT-family model does not get this far: inseq 0.7.1's loader needs a bos_token_id, which BERT lacks)
    gpt2_classifier = bcosify(T.GPT2ForSequenceClassification(T.GPT2Config(
        vocab_size=len(gpt2_tokenizer), n_embd=16, n_layer=1, n_head=2, num_labels=2)).eval(), verbose=False)
    with pytest.raises(adapter.UnsupportedModelError, match="sequence classifier.*load_classifier"):
        inseq.load_model(gpt2_classifier, "bcos", tokenizer=gpt2_tokenizer)
    with pytest.raises(adapter.UnsupportedModelError, match="load_classifier needs a sequence classifier"):
        adapter.load_classifier(_tiny_lm("gpt2", len(gpt2_tokenizer)), gpt2_tokenizer)
    with pytest.raises(adapter.UnsupportedModelError, match="no B-cos"):
        adapter.load_classifier(T.BertForSequenceClassification(T.BertConfig(
            vocab_size=len(bert_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32)), bert_tokenizer)


# ------------------------------------------------------------------------------------------- registration


def test_bcos_is_registered_once_and_reimport_registers_nothing_new():
    assert inseq.list_feature_attribution_methods().count("bcos") == 1
    assert inseq.list_aggregators().count("signed_sum") == 1
    method_cls = FeatureAttribution.available_classes()["bcos"]
    # last in the file: reloading redefines the module's other classes
    reloaded = importlib.reload(adapter)
    assert inseq.list_feature_attribution_methods().count("bcos") == 1
    assert inseq.list_aggregators().count("signed_sum") == 1
    assert reloaded.BcosInseqAttribution is method_cls is FeatureAttribution.available_classes()["bcos"]


def test_a_name_held_by_another_package_is_refused():
    class Methods(Registry):
        registry_attr = "method_name"

    class Foreign(Methods):
        method_name = "bcos"

    with pytest.raises(ImportError, match="will not replace it"):
        adapter._reuse_or_refuse(Methods, "bcos")
    assert adapter._reuse_or_refuse(Methods, "other") is None
    assert adapter._reuse_or_refuse(Aggregator, "signed_sum") is adapter.SignedSumAggregator


def test_a_batched_prompt_generates_what_it_generates_alone(gpt2_tokenizer):
    """inseq 0.7.1's generate drops the padding mask: a left-padded prompt used to generate from its padding."""
    for family in ("gpt2", "llama"):
        attribution_model = inseq.load_model(_tiny_lm(family, len(gpt2_tokenizer)), "bcos", tokenizer=gpt2_tokenizer)
        generation_args = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
        batched = attribution_model.attribute(PROMPTS, generation_args=generation_args, show_progress=False)
        for i, prompt in enumerate(PROMPTS):
            alone = attribution_model.attribute(prompt, generation_args=generation_args, show_progress=False)
            assert batched.info["generated_texts"][i] == alone.info["generated_texts"][0], family
        split = attribution_model.attribute(PROMPTS, generation_args=generation_args, batch_size=1,
                                            show_progress=False)
        assert split.info["generated_texts"] == batched.info["generated_texts"]
        assert attribution_model.generate(PROMPTS, max_new_tokens=NEW_TOKENS, do_sample=False) == \
            batched.info["generated_texts"]


def test_inseq_own_methods_warn_that_a_padded_prompt_generates_other_tokens_than_alone(gpt2_tokenizer):
    """inseq's own methods on a model not loaded with "bcos" keep inseq 0.7.1's generate, which drops the padding
    mask: left as inseq has it, but a padded batch now warns instead of generating other tokens silently."""
    generation_args = {"max_new_tokens": NEW_TOKENS, "do_sample": False}
    own = inseq.load_model(_tiny_lm("gpt2", len(gpt2_tokenizer)), "input_x_gradient", tokenizer=gpt2_tokenizer)
    with pytest.warns(UserWarning, match=r"^inseq 0\.7\.1 generates without the padding mask: .* rows \[1\] "
                                         r"generate other tokens than they would alone.*load_model\(model, \"bcos\"\)"):
        own.attribute(PROMPTS, generation_args=generation_args, show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        own.attribute(PROMPTS[1], generation_args=generation_args, show_progress=False)  # one prompt: no padding
        # a model loaded with "bcos" generates with the mask (every method it runs): nothing to warn about
        bcos = inseq.load_model(_tiny_lm("gpt2", len(gpt2_tokenizer)), "bcos", tokenizer=gpt2_tokenizer)
        bcos.attribute(PROMPTS, generation_args=generation_args, show_progress=False)
        bcos.attribute(PROMPTS, generation_args=generation_args, method="input_x_gradient", show_progress=False)


def test_merging_a_word_across_the_prompt_generation_boundary_keeps_the_prompt_subwords_share(gpt2_tokenizer):
    model = _tiny_lm("gpt2", len(gpt2_tokenizer))
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    # "zxqvbn" is four subwords: the prompt ends inside the word, the generation finishes it
    out = attribution_model.attribute("Hello zxq", "Hello zxqvbn good", step_scores=["logit"], show_progress=False)
    seq = out.sequence_attributions[0]
    logits = seq.step_scores["logit"]
    first_generated = seq.target[seq.attr_pos_start].token
    assert not first_generated.startswith("Ġ"), "the first generated token must continue the prompt's last word"
    merged = seq.aggregate("subwords", special_chars=("Ġ",)).aggregate()
    assert len(merged.target) < len(seq.target)
    # every step's column still sums to its logit (the prompt subwords of the split word keep their share)
    torch.testing.assert_close(torch.nansum(merged.target_attributions, 0), logits, rtol=1e-4, atol=1e-5)
    word = next(i for i, t in enumerate(merged.target) if "zxq" in t.token)
    assert torch.isfinite(merged.target_attributions[word, 0])
    # a span with no entry at a step (not generated yet) stays NaN, not 0
    assert merged.target_attributions[-1].isnan().all()
