"""Trust pass 24, the hosts a third time (Captum and inseq) and the explanation core's newest entry points, with a model
whose ``config.return_dict`` is False: transformers 5.24's decoder heads (GPT-2, Llama, Mistral, Qwen2/3, Gemma 2) and
ModernBERT's classifier call their base model without ``return_dict``, which then follows the config and returns a
tuple the head reads an output field of. The package's ``return_dict=True`` in the call does not reach the base model
(the head's decorator takes it), so every entry point (explain, explain_dataset, predict / accuracy, Captum's
wrappers, inseq, fine_tune_classifier, train_causal_lm, perplexity, next_token_contrast) failed with "'tuple' object
has no attribute 'last_hidden_state'" from inside transformers, or, for train_causal_lm, at the first training step.
Now refused by name where the head cannot run with it (attribution.text.require_head_output_object); BERT, DistilBERT
and RoBERTa, whose heads pass return_dict on, are explained as with True. Each test fails before its fix."""

from __future__ import annotations

import copy
import warnings

import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
import inseq
import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
from conftest import VOCAB
from test_conformance import _stock, _word_tokenizer
from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm
from test_trust_pass22_core import _bcos

from bcos_plugins import explain, fine_tune_classifier, train_causal_lm
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics.decoder import next_token_contrast, perplexity
from bcos_plugins.prediction import accuracy, predict

warnings.filterwarnings("ignore", category=DeprecationWarning)

HEADS = [name for name, spec in SPECS.items() if spec.head != "base"]
REFUSAL = (r"^model: \w+'s config\.return_dict is False, and its forward calls its \w+ without return_dict, so that "
           r"returns a tuple .* Set model\.config\.return_dict = True")


def _tuple_config(name: str) -> torch.nn.Module:
    """A copy of the family's B-cos model ``name`` whose config says ``return_dict = False``."""
    model = copy.deepcopy(_bcos(name))
    model.config.return_dict = False
    return model


def _runs_with_its_config(model: torch.nn.Module, **inputs) -> bool:
    """Whether the model's own forward runs on ``inputs`` (False: the AttributeError a head that reads an output
    field of its base model's tuple raises inside transformers)."""
    try:
        with torch.no_grad():
            model(**inputs)
    except AttributeError:
        return False
    return True


def _explain_kwargs(name: str) -> dict:
    spec = SPECS[name]
    return {} if spec.is_classifier else {"target": 5, **({"position": 2} if spec.head == "masked_lm" else {})}


@pytest.mark.parametrize("name", HEADS)
def test_a_return_dict_false_config_is_explained_as_true_or_refused_where_the_head_cannot_run_with_it(name):
    """Where the model's own call fails on its config (an AttributeError inside transformers), explain refuses naming
    the config and the fix; where it runs (BERT, DistilBERT, RoBERTa), explain gives the numbers of the same model with
    ``return_dict = True``. Before: every decoder family's explain failed with the AttributeError."""
    model = _tuple_config(name)
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    head_runs = _runs_with_its_config(model, input_ids=ids, attention_mask=mask)
    kwargs = _explain_kwargs(name)
    if head_runs:
        expected = explain(_bcos(name), ids, attention_mask=mask, **kwargs)
        got = explain(model, ids, attention_mask=mask, **kwargs)
        assert torch.equal(got.contributions, expected.contributions)
        assert torch.equal(got.explained, expected.explained)
    else:
        assert SPECS[name].kind == "decoder" or name.startswith("ModernBert")
        with pytest.raises(BcosValueError, match=REFUSAL):
            explain(model, ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForCausalLM"])
def test_captums_wrappers_refuse_a_head_that_cannot_run_with_its_return_dict_false_config(name):
    """EmbeddingForward (embed and forward), BcosAttribution and LayerBcos call the model through the same kwargs:
    each failed with "'tuple' object has no attribute 'last_hidden_state'"."""
    model = _tuple_config(name)
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    target = 1 if SPECS[name].is_classifier else 5
    with pytest.raises(BcosValueError, match=REFUSAL):
        EmbeddingForward(model).embed(ids, mask)
    model.config.return_dict = True
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    model.config.return_dict = False  # set after embedding: the forward's own call is refused too
    with pytest.raises(BcosValueError, match=REFUSAL):
        BcosAttribution(fwd).attribute(embeddings, target=target, additional_forward_args=(mask,))
    with pytest.raises(BcosValueError, match=REFUSAL):
        LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask,))


def test_captums_llm_workflow_over_layer_bcos_refuses_a_head_that_cannot_run_with_its_return_dict_false_config():
    """LLMGradientAttribution calls the model itself (not through LayerBcos's kwargs): it failed with the
    AttributeError inside transformers; LayerBcos refuses such a model when built."""
    from captum.attr import LLMGradientAttribution, TextTokenInput

    model, tokenizer = _tuple_config("LlamaForCausalLM"), _word_tokenizer()
    with pytest.raises(BcosValueError, match=REFUSAL):
        LLMGradientAttribution(LayerBcos(model), tokenizer).attribute(TextTokenInput("w3 w4 w5", tokenizer),
                                                                      target="w6")


def test_predict_and_accuracy_refuse_a_decoder_classifier_whose_config_says_return_dict_false():
    model, tokenizer = _tuple_config("LlamaForSequenceClassification"), _word_tokenizer()
    for call in (lambda: predict(model, tokenizer, ["w3 w4 w5", "w6 w7"]),
                 lambda: accuracy(model, tokenizer, ["w3 w4 w5", "w6 w7"], [0, 1])):
        with pytest.raises(BcosValueError, match=REFUSAL):
            call()


def test_predict_of_a_bert_classifier_with_return_dict_false_is_the_same_as_with_true():
    """BERT's head passes return_dict on: its config's False is called with return_dict=True and gives the logits."""
    model, tokenizer = _tuple_config("BertForSequenceClassification"), _word_tokenizer()
    expected = predict(_bcos("BertForSequenceClassification"), tokenizer, ["w3 w4 w5", "w6 w7"])
    assert torch.equal(predict(model, tokenizer, ["w3 w4 w5", "w6 w7"]), expected)


def test_training_refuses_a_head_that_cannot_run_with_its_return_dict_false_config_before_training(tmp_path):
    """fine_tune_classifier (its check batch) and train_causal_lm refuse before the first step; train_causal_lm failed
    at the first training step inside the Trainer."""
    model = _tuple_config("GPT2ForSequenceClassification")
    with pytest.raises(BcosValueError, match=REFUSAL):
        fine_tune_classifier(model, _word_tokenizer(), ["w3 w4 w5", "w6 w7"], [0, 1], batch_size=2,
                             output_dir=tmp_path / "c", progress=False)
    lm = _tuple_config("GPT2LMHeadModel")
    before = copy.deepcopy(lm.state_dict())
    with pytest.raises(BcosValueError, match=REFUSAL):
        train_causal_lm(lm, [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}], str(tmp_path / "lm"),
                        pad_token_id=0, max_steps=1)
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())  # refused before any step


def test_inseq_refuses_a_head_that_cannot_run_with_its_return_dict_false_config_at_load(gpt2_tokenizer):
    """inseq.load_model(model, "bcos") failed at the first attribute call, inside transformers."""
    model = _tiny_lm("gpt2", len(gpt2_tokenizer))
    model.config.return_dict = False
    with pytest.raises(BcosValueError, match=REFUSAL):
        inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)


def test_perplexity_of_a_causal_lm_whose_config_says_return_dict_false():
    """perplexity called the model without return_dict: a causal LM outside the registry whose head runs with the
    config's False (BertLMHeadModel) was refused as "returns tuple ... a classifier or base model has no next-token
    distribution"; now its perplexity is the one with True. A decoder head that cannot run with it is refused (was the
    AttributeError), and so is next_token_contrast."""
    config = T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, is_decoder=True)
    torch.manual_seed(0)
    model = T.BertLMHeadModel(config).eval()
    tokenizer = _word_tokenizer()
    texts = ["w3 w4 w5 w6", "w7 w8 w9"]
    expected = perplexity(model, texts, tokenizer).perplexity
    model.config.return_dict = False
    assert perplexity(model, texts, tokenizer).perplexity == expected
    lm = _tuple_config("GPT2LMHeadModel")
    with pytest.raises(BcosValueError, match=REFUSAL):
        perplexity(lm, texts, tokenizer)
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    with pytest.raises(BcosValueError, match=REFUSAL):
        next_token_contrast(lm, ids, torch.ones_like(ids), target=[3, 4], foil=[5, 6])


def test_the_stock_heads_the_refusal_names_fail_on_their_own_and_those_it_lets_through_run():
    """The refusal reads the head's code (whether it passes return_dict to its base model): pinned against what each
    stock class does with its config's False, so a transformers release that changes a head is noticed here."""
    from bcos_plugins.attribution.text import require_head_output_object

    ids = torch.tensor([[3, 4, 5]])
    for name in HEADS:
        model = _stock(name)
        model.config.return_dict = False
        runs = _runs_with_its_config(model, input_ids=ids, return_dict=True)
        refused = False
        try:
            require_head_output_object(model)
        except BcosValueError:
            refused = True
        assert refused == (not runs), name


# ------------------------------------------------ Captum: a wrapper built before the model's embeddings were replaced


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Gemma2ForSequenceClassification"])
def test_captum_wrappers_built_before_set_input_embeddings_follow_the_models_new_embedding(name):
    """Where the attribution point is the token embedding's output (Llama, Mistral, Qwen, Gemma 2), an
    EmbeddingForward built before ``model.set_input_embeddings(new)`` hooked the old module, which no longer ran:
    ``embed`` failed with an IndexError, and ``forward`` ignored the embeddings it was given (the logits of its
    placeholder ids: 0.16 off the model's, every BcosAttribution / FeatureAblation score 0 or another function's),
    silently; a LayerBcos at its default point refused, naming a layer the caller never passed. Both follow the
    model's module now, as explain does."""
    from captum.attr import FeatureAblation

    model = copy.deepcopy(_bcos(name))
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    target = 1 if SPECS[name].is_classifier else 7
    fwd, layer_bcos = EmbeddingForward(model), LayerBcos(model)
    new = copy.deepcopy(model.get_input_embeddings())
    with torch.no_grad():
        new.weight.mul_(1.5)
    model.set_input_embeddings(new)
    expected = explain(model, ids, attention_mask=mask, target=target)
    fresh = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    assert torch.equal(embeddings, fresh.embed(ids, mask))
    with torch.no_grad():
        torch.testing.assert_close(fwd(embeddings, mask)[:, target], expected.explained)
        assert not torch.equal(fwd(embeddings, mask), fwd(2 * embeddings, mask))  # the embeddings given are used
    attributions = BcosAttribution(fwd).attribute(embeddings, target=target, additional_forward_args=(mask,))
    torch.testing.assert_close(attributions, expected.input_contributions)
    ablation = FeatureAblation(fwd).attribute(embeddings, target=target, additional_forward_args=(mask,),
                                              feature_mask=torch.arange(6)[None, :, None].expand_as(embeddings))
    assert torch.equal(ablation, FeatureAblation(fresh).attribute(
        embeddings, target=target, additional_forward_args=(mask,),
        feature_mask=torch.arange(6)[None, :, None].expand_as(embeddings)))
    torch.testing.assert_close(layer_bcos.attribute(ids, target=target, additional_forward_args=(mask,)),
                               expected.input_contributions)


# ------------------------------------------------ class names given as the config's dicts


def test_label_names_given_as_label2id_or_id2label_name_each_class_by_its_id():
    """``label_names=model.config.label2id`` was read as its keys in insertion order: {"pos": 2, "neu": 1, "neg": 0}
    named class 0 "pos" in Captum's records and inseq's classifier columns, silently; ``id2label`` was refused as
    "must be strings, got int 0". Both are read in class-id order now (_checks.require_label_names, the one check of
    visualize, Captum and inseq)."""
    from bcos_plugins.adapters.captum import visualization_records
    from bcos_plugins.adapters.inseq import load_classifier

    model, tokenizer = _bcos("BertForSequenceClassification"), _word_tokenizer()
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    explanation = explain(model, ids, attention_mask=torch.ones_like(ids), target=0)
    for names in ({"pos": 2, "neu": 1, "neg": 0}, {2: "pos", 0: "neg", 1: "neu"}):
        assert [r.attr_class for r in visualization_records(explanation, tokenizer, label_names=names)] == ["neg"] * 2
        out = load_classifier(model, tokenizer, label_names=names).attribute(["w3 w4 w5"])
        assert [t.token for t in out.sequence_attributions[0].target] == ["neg", "neu", "pos"]


@pytest.mark.parametrize(("names", "problem"), [
    ({0: "neg", 2: "pos", 3: "neu"}, r"the class ids of the dict are \[0, 2, 3\], not 0 to 2 each once"),
    ({"neg": 0, "pos": 0, "neu": 1}, r"maps two names to one class id"),
    ({"neg": "pos"}, r"a dict must map class ids to names \(config\.id2label\) or names to ids"),
])
def test_label_names_as_a_dict_without_one_name_per_class_id_are_refused_naming_them(names, problem):
    from bcos_plugins.adapters.captum import visualization_records

    model, tokenizer = _bcos("BertForSequenceClassification"), _word_tokenizer()
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    explanation = explain(model, ids, target=0)
    with pytest.raises((BcosValueError, TypeError), match=r"^label_names: " + problem):
        visualization_records(explanation, tokenizer, label_names=names)


# ------------------------------------------------ Captum's records: class ids through the package's id parser


@pytest.mark.parametrize(("argument", "value", "problem"), [
    ("true_labels", [0.0, 1.7, 2.0], r"got a float \(torch\.float32\); ids must be integers"),
    ("true_labels", [True, False, True], r"got a boolean; ids must be integers"),
    ("true_labels", ["a", "b", "c"], r"got names \(\['a', 'b', 'c'\]\), not ids\. Map a class name to its id"),
    ("true_labels", [0, 1, 5], r"ids must lie in \[0, 3\), got \[5\] at row \[2\]"),
    ("target", [1, 1, -1], r"ids must lie in \[0, 3\), got \[-1\] at row \[2\]"),
])
def test_visualization_records_read_class_ids_as_ids_or_refuse_them_naming_the_argument(argument, value, problem):
    """``true_labels=[0.0, 1.7, 2.0]`` showed class 1 ("b") for 1.7 and ``[True, False, True]`` classes 1, 0, 1, as
    Python's int() truncates, silently; names failed with "invalid literal for int() with base 10"; an id outside the
    classes (or a negative target of the scores form) was blamed on label_names."""
    from bcos_plugins.adapters.captum import visualization_records

    model, tokenizer = _bcos("BertForSequenceClassification"), _word_tokenizer()
    ids = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(5))
    explanation = explain(model, ids, attention_mask=torch.ones_like(ids))
    source = ({"scores": explanation.scores(), "tokens": explanation.tokens(tokenizer)} if argument == "target"
              else {"explanation": explanation, "tokenizer": tokenizer})
    with pytest.raises((BcosValueError, TypeError), match=rf"^{argument}: {problem}"):
        visualization_records(**source, **{argument: value}, label_names=["a", "b", "c"])
    records = visualization_records(explanation, tokenizer, true_labels=torch.tensor([2, 0, 1]),
                                    label_names=["a", "b", "c"])
    assert [r.true_class for r in records] == ["c", "a", "b"]


# ------------------------------------------------ inseq's classifier: max_length and texts past the model's positions


def test_inseq_classifier_warns_of_the_texts_max_length_cuts_and_names_its_arguments_for_longer_texts():
    """``load_classifier(..., max_length=3)`` explained a six-token text as its first three tokens without a word (its
    source showed only those), where explain_dataset and predict warn; ``max_length`` past the model's position table
    and, without it, a text longer than the table were refused at attribute naming input_ids and a tokenizer call
    the caller never made."""
    from bcos_plugins.adapters.inseq import load_classifier

    model, tokenizer = _bcos("BertForSequenceClassification"), _word_tokenizer()
    with pytest.warns(UserWarning, match=r"^BcosClassifier\.attribute: 1 text\(s\) \[1\] have more than max_length=4 "
                                         r"tokens: each is explained as the first tokens"):
        out = load_classifier(model, tokenizer, max_length=4).attribute(["w3 w4", "w3 w4 w5 w6 w7 w8"],
                                                                        batch_size=1)
    assert [len(s.source) for s in out.sequence_attributions] == [2, 4]
    with pytest.raises(BcosValueError, match=r"^max_length: is 100 but BertForSequenceClassification takes at most "
                                             r"40 positions"):
        load_classifier(model, tokenizer, max_length=100)
    long_text = " ".join(f"w{3 + i % 50}" for i in range(60))
    with pytest.raises(BcosValueError, match=r"^texts: text\(s\) \[2\] have more tokens than the 40 positions "
                                             r"BertForSequenceClassification reads\. Build it with load_classifier\("
                                             r"model, tokenizer, max_length=40\)"):
        load_classifier(model, tokenizer).attribute(["w3", "w4", long_text], batch_size=2)


def test_make_seqpg_examples_scores_a_classifier_whose_config_says_return_dict_false_as_with_true():
    """SeqPG's segment scoring called the model without return_dict: a BERT classifier whose config says False gave a
    tuple, which failed with "'tuple' object has no attribute 'float'"; now called through the same kwargs as every
    path, it scores the segments as the model with True does (a tiny random BERT is confident of one class only, so
    both are refused alike, naming the class found)."""
    from test_metrics_faithfulness import _word_tokenizer as seqpg_tokenizer

    from bcos_plugins.metrics import make_seqpg_examples

    tokenizer, _ = seqpg_tokenizer([f"{c}{i}" for c in "abc" for i in range(10)] + ["x"])
    texts = ["a1 a2 x x", "a3 a4 x x", "b1 b2 b3 x", "c1 c2 x x", "b4 b5 x x", "c3 c4 c5 x"]
    labels = [0, 0, 1, 2, 1, 2]
    messages = []
    for model in (_bcos("BertForSequenceClassification"), _tuple_config("BertForSequenceClassification")):
        with pytest.raises(BcosValueError, match=r"^min_confidence: fewer than two classes") as refusal:
            make_seqpg_examples(model, tokenizer, texts, labels, segment_length=3, n_examples=2, min_confidence=0.0)
        messages.append(str(refusal.value))
    assert messages[0] == messages[1]


# ------------------------------------------------ Captum: a forward function that returns the model's output object


def test_a_forward_function_returning_the_models_output_object_is_refused_naming_its_logits():
    """``BcosAttribution(lambda e: model(inputs_embeds=e), model=model)`` (the ``.logits`` forgotten) and a LayerBcos
    over such a function failed inside Captum's target selection with "'SequenceClassifierOutputWithPast' object has
    no attribute 'shape'"; a softmax of the logits warns naming a non-linear function of the outputs, not only
    positions missing from the inputs."""
    model = _bcos("LlamaForSequenceClassification")
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    embeddings = EmbeddingForward(model).embed(ids, mask)
    fix = r"Return the tensor to explain, e\.g\. lambda e: model\(inputs_embeds=e\)\.logits"
    with pytest.raises(TypeError, match=r"^forward_func: returned a SequenceClassifierOutputWithPast, not a tensor \(a "
                                        r"transformers model's output: its \.logits\), so BcosAttribution .*" + fix):
        BcosAttribution(lambda e: model(inputs_embeds=e), model=model).attribute(embeddings, target=1)
    with pytest.raises(TypeError, match=r"^forward_func: returned a tuple, not a tensor"):
        BcosAttribution(lambda e: model(inputs_embeds=e, return_dict=False), model=model).attribute(embeddings,
                                                                                                   target=1)
    with pytest.raises(TypeError, match=r"^forward_func: returned a SequenceClassifierOutputWithPast.*LayerBcos"):
        LayerBcos(lambda i, a: model(input_ids=i, attention_mask=a), layer=model.model.embed_tokens,
                  model=model).attribute(ids, target=1, additional_forward_args=(mask,))
    with pytest.warns(UserWarning, match=r"applies a non-linear function to the model's outputs \(softmax"):
        BcosAttribution(lambda e: model(inputs_embeds=e).logits.softmax(-1), model=model).attribute(embeddings,
                                                                                                    target=1)


def test_inseq_bcos_after_set_input_embeddings_names_the_replaced_module_and_the_fix(gpt2_tokenizer):
    """inseq's "bcos" holds a LayerBcos at the attribution point found when the model was loaded; after
    ``model.set_input_embeddings(new)`` (Llama: the point is the token embedding) its refusal said "did not run in
    forward_func's forward (a layer of another model?). Pass a layer of the model", to a caller who passed none."""
    model = _tiny_lm("llama", len(gpt2_tokenizer))
    attribution_model = inseq.load_model(model, "bcos", tokenizer=gpt2_tokenizer)
    model.set_input_embeddings(copy.deepcopy(model.get_input_embeddings()))
    with pytest.raises(BcosValueError, match=r"^layer: Embedding is no longer a module of LlamaForCausalLM: the "
                                             r"model's module there was replaced after this LayerBcos was built .* "
                                             r"inseq\.load_model\(model, 'bcos'\) again"):
        attribution_model.attribute("The cat sat", "The cat sat on the mat", show_progress=False)
