"""Seventh trust pass: the TransformerLens adapter, conversion and visualisation under unusual inputs, each case
checked against a number computed another way (each row alone, the model's own logits, TransformerLens' sums) or
refused naming the argument and the fix. The cases that were silently wrong or crashed unhelpfully, one test each."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import VOCAB, hooked_transformer_from_hf_or_none, tiny_model

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")


def _tokens(batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


def _bcos_gpt2_lens():
    from_hf = hooked_transformer_from_hf_or_none()
    return from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False)) if from_hf else None


# ------------------------------------------------------------------ TransformerLens adapter


@pytest.mark.parametrize("entry", ["explain_logits", "token_component_decomposition"])
def test_a_float_attention_mask_is_read_as_the_checked_mask(entry):
    """A mask of 0.0 / 1.0 floats passed the token check, and then the caller's float mask (not the checked int64
    one) went on to the position parser: IndexError 'tensors used as indices must be long, int, byte or bool'."""
    model = _bcos_gpt2_lens()
    if model is None:
        return
    explain_at = getattr(lens, entry)
    tokens = _tokens()
    mask = torch.ones(2, 6)
    mask[1, :2] = 0.0
    padded = explain_at(model, tokens, target=5, attention_mask=mask)
    alone = explain_at(model, tokens[1:, 2:], target=5)
    assert padded.explained[1].item() == pytest.approx(alone.explained[0].item(), rel=1e-5, abs=1e-7)
    with torch.no_grad():
        assert padded.explained[0].item() == pytest.approx(model(tokens)[0, -1, 5].item(), rel=1e-5, abs=1e-7)


def test_make_explainable_refuses_a_transformers_model_naming_the_converter():
    """make_explainable(GPT2LMHeadModel) failed with AttributeError: 'GPT2LMHeadModel' object has no attribute 'cfg'."""
    if hooked_transformer_from_hf_or_none() is None:
        return
    with pytest.raises(BcosTypeError, match=r"^model: make_explainable takes a TransformerLens HookedTransformer, got "
                                            r"GPT2LMHeadModel\. For a transformers model use hooked_transformer_from_hf"):
        lens.make_explainable(tiny_model("GPT2LMHeadModel"))


def test_norms_replaced_by_fold_ln_make_the_model_unexplainable_until_make_explainable():
    """TransformerLens' process_weights_(fold_ln=True) puts fresh LayerNormPre modules (plain hook_scale) into an
    explainable model; is_explainable looked at the attention patterns only, so explain_logits ran with the norm
    scales in the gradient and its contributions missed most of the logit (completeness error 0.6-1.5), silently."""
    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:
        return
    tokens = _tokens()
    model = from_hf(tiny_model("GPT2LMHeadModel"))
    reference = lens.explain_logits(model, tokens, target=5)
    model.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
    assert not lens.is_explainable(model)
    with pytest.raises(BcosTypeError, match=r"^model: its dynamic weights are not detachable.*make_explainable"):
        lens.explain_logits(model, tokens, target=5)
    with pytest.raises(BcosTypeError, match=r"^model: its dynamic weights are not detachable"):
        lens.token_component_decomposition(model, tokens, target=5)
    lens.make_explainable(model)
    again = lens.explain_logits(model, tokens, target=5)
    assert float(again.completeness_error.max()) < 1e-5
    torch.testing.assert_close(again.contributions, reference.contributions, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("flag", ["fold_ln", "center_writing_weights"])
def test_a_bcos_lens_model_refuses_folding_and_centring(flag):
    """process_weights_ (and from_pretrained, which folds by default) rewrote a B-cos HookedTransformer as if it were
    plain: folding the norm gains into the B-cos rows or centring the rows writing to the residual stream changed its
    logits (0.017 and 0.069 on a tiny B-cos GPT-2), silently."""
    model = _bcos_gpt2_lens()
    if model is None:
        return
    tokens = _tokens()
    with torch.no_grad():
        before = model(tokens)
    flags = {"fold_ln": False, "center_writing_weights": False, "center_unembed": False, flag: True}
    with pytest.raises(BcosValueError, match=rf"^{flag}: {flag}=True would change this B-cos model's outputs.*"
                                             rf"Pass {flag}=False"):
        model.process_weights_(**flags)
    model.process_weights_(fold_ln=False, center_writing_weights=False, center_unembed=False)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), before, rtol=0, atol=0)


# ------------------------------------------------------------------ explain_dataset


def _corpus_setup(padding_side: str = "right"):
    from test_pretrain import corpus, word_tokenizer

    tokenizer = word_tokenizer()
    tokenizer.padding_side = padding_side
    texts, _ = corpus(5)
    texts[2] = texts[2].split()[0]  # a one-token text among longer ones
    return bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False), tokenizer, texts


@pytest.mark.parametrize("one", [lambda t: __import__("numpy").int64(t), lambda t: torch.tensor(t)],
                         ids=["numpy_int", "tensor_0d"])
def test_explain_dataset_takes_one_numpy_or_tensor_id_for_every_text(one):
    """A NumPy int or a 0-d tensor as the one target for all texts failed with TypeError ('numpy.int64' object is not
    iterable / iteration over a 0-d tensor); it explains what an int does."""
    from bcos_plugins import explain_dataset

    model, tokenizer, texts = _corpus_setup()
    expected = explain_dataset(model, tokenizer, texts, target=5, progress=False)
    got = explain_dataset(model, tokenizer, texts, target=one(5), progress=False)
    assert got["target"] == [5] * len(texts)
    assert got["explained"] == expected["explained"]


@pytest.mark.parametrize("target", ["5", 5.0])
def test_explain_dataset_refuses_a_string_or_float_target_naming_it(target):
    """A str was read as a list of characters ('target: 1 values for 5 texts'), a float failed with TypeError ('float'
    object is not iterable)."""
    from bcos_plugins import explain_dataset

    model, tokenizer, texts = _corpus_setup()
    with pytest.raises(BcosTypeError, match=rf"^target: got {type(target).__name__} .*, not a class id\. Pass one int"):
        explain_dataset(model, tokenizer, texts, target=target, progress=False)


def test_explain_dataset_refuses_a_boolean_batch_size():
    """batch_size=True ran with batches of one text."""
    from bcos_plugins import explain_dataset

    model, tokenizer, texts = _corpus_setup()
    with pytest.raises(BcosTypeError, match=r"^batch_size: must be an integer, got bool True"):
        explain_dataset(model, tokenizer, texts, target=5, batch_size=True, progress=False)


def test_explain_dataset_refuses_a_position_per_text_and_reads_a_numpy_position_from_the_first_token():
    """A list of positions went to explain as columns of each padded batch: on a left-padded batch column p is not each
    text's token p, so that column's logit was explained instead, silently where it held a real token (refused as a
    padding token otherwise, naming a column the caller never saw). A NumPy int position took the same column path."""
    from bcos_plugins import explain, explain_dataset

    model, tokenizer, texts = _corpus_setup("left")
    with pytest.raises(BcosTypeError, match=r"^position: must be one int for every text, got list"):
        explain_dataset(model, tokenizer, texts, target=5, position=[0] * len(texts), batch_size=len(texts),
                        progress=False)
    got = explain_dataset(model, tokenizer, texts, target=5, position=__import__("numpy").int64(0), progress=False)
    alone = [explain(model, tokenizer([t], return_tensors="pt")["input_ids"], target=5, position=0).explained.item()
             for t in texts]
    assert got["explained"] == pytest.approx(alone, rel=1e-5, abs=1e-7)


# ------------------------------------------------------------------ Captum visualisation records


def _bert_explanation():
    from test_pretrain import corpus, word_tokenizer

    from bcos_plugins import explain

    tokenizer = word_tokenizer()
    texts, _ = corpus(3)
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    return explain(model, enc["input_ids"], enc["attention_mask"], target=2), tokenizer


def test_visualization_records_refuse_short_label_names_and_logits_of_another_batch():
    """label_names without the explained class failed with IndexError: list index out of range; logits of another
    batch size with IndexError (or, larger, gave each example another example's predicted class)."""
    pytest.importorskip("captum")
    from bcos_plugins.adapters.captum import visualization_records

    explanation, tokenizer = _bert_explanation()
    with pytest.raises(BcosValueError, match=r"^label_names: has 2 names, but class 2 is shown\. Pass one name"):
        visualization_records(explanation, tokenizer, label_names=["neg", "pos"])
    with pytest.raises(BcosValueError, match=r"^logits: must be the class logits of the 3 explained examples"):
        visualization_records(explanation, tokenizer, logits=torch.randn(4, 3))
    records = visualization_records(explanation, tokenizer, label_names=["a", "b", "c"], logits=torch.randn(3, 3))
    assert [r.attr_class for r in records] == ["c"] * 3


def test_visualization_records_refuse_nan_scores():
    """A NaN score went into the record (attr_score NaN) and failed later inside Captum's visualize_text;
    tokens_to_html already refused it."""
    pytest.importorskip("captum")
    from bcos_plugins.adapters.captum import visualization_records

    explanation, tokenizer = _bert_explanation()
    explanation.contributions[1, 0] = float("nan")
    with pytest.raises(BcosValueError, match=r"^scores: example 1 has NaN or infinite scores at token positions \[0\]"):
        visualization_records(explanation, tokenizer)


# ------------------------------------------------------------------ TransformerLens bridge on plain GPT-2


@pytest.mark.parametrize("activation", ["gelu_new", "silu", "gelu_fast"])
def test_a_plain_gpt2_bridge_routes_its_activation_gate_through_a_detachable_module(activation):
    """make_bridge_explainable detached norms, attention patterns and gated MLPs' gate branches, but not the
    activation of a non-gated MLP that the bridge runs natively (GPT-2's act): a plain GPT-2 bridge was reported
    explainable and its contributions missed part of the logit (completeness error 0.038 with gelu_new, 0.024 with
    silu) without a word; hooked_transformer_from_hf on the same weights was exact."""
    import transformers as T
    from conftest import tiny_config

    config = tiny_config("gpt2")
    config.activation_function = activation
    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(config).eval()
    bridge = lens.transformer_bridge_from_hf(hf)
    tokens = _tokens()
    got = lens.explain_logits(bridge, tokens, target=5)
    with torch.no_grad():
        torch.testing.assert_close(got.explained, hf(tokens).logits[:, -1, 5], rtol=1e-5, atol=1e-6)
    assert float(got.completeness_error.max()) < 1e-5
    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is not None:
        torch.testing.assert_close(got.contributions, lens.explain_logits(from_hf(hf), tokens, target=5).contributions,
                                   rtol=1e-4, atol=1e-6)
    assert type(hf.transformer.h[0].mlp.act).__name__ != "DetachableActivation"  # the user's model is untouched


def test_bcosify_converts_the_fast_tanh_gelu_and_explains_it_exactly():
    """gelu_fast (transformers' FastGELUActivation: the tanh GELU with sqrt(2/pi) written as 0.7978845608) was refused
    by bcosify and by the bridge as an activation without a detachable form; it is the tanh GELU to float32 rounding."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins import explain

    config = tiny_config("gpt2")
    config.activation_function = "gelu_fast"
    torch.manual_seed(0)
    stock = T.GPT2LMHeadModel(config).eval()
    assert type(stock.transformer.h[0].mlp.act).__name__ == "FastGELUActivation"
    x = torch.linspace(-8, 8, 1001)
    from bcos_plugins.nn.activation import DetachableActivation
    torch.testing.assert_close(DetachableActivation("gelu_tanh")(x), stock.transformer.h[0].mlp.act(x),
                               rtol=0, atol=5e-7)
    model = bcosify(stock, b=1.5, verbose=False)
    assert type(model.transformer.h[0].mlp.act).__name__ == "DetachableActivation"
    tokens = _tokens()
    got = explain(model, tokens, target=5)
    with torch.no_grad():
        torch.testing.assert_close(got.explained, model(tokens).logits[:, -1, 5])
    assert float(got.completeness_error.max()) < 1e-5


def test_a_bridge_over_an_activation_without_a_detachable_form_is_refused():
    """mish (x * tanh(softplus(x))) has no detachable form in the package: the bridge was built and explained
    with its gate in the gradient (quick_gelu, the example first pinned, has one since e7b7dae), silently."""
    import transformers as T
    from conftest import tiny_config

    config = tiny_config("gpt2")
    config.activation_function = "mish"
    torch.manual_seed(0)
    with pytest.raises(BcosTypeError, match=r"^hf_model: its MLP activation MishActivation \(act\) has no "
                                            r"detachable form.*Supported: AccurateGELUActivation, "
                                            r"ClippedGELUActivation, FastGELUActivation, GELU, "):
        lens.transformer_bridge_from_hf(T.GPT2LMHeadModel(config).eval())


def test_a_gpt2_converted_with_stock_query_key_goes_through_the_bridge():
    """bcosify(gpt2, bcos_query_key=False) keeps c_attn's query/key part stock (weights and biases): the bridge refused
    it ('expected BcosConv1D') while hooked_transformer_from_hf's refusal named the bridge as the way to take it."""
    hf = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, bcos_query_key=False, verbose=False)
    with torch.no_grad():
        hf.transformer.h[0].attn.c_attn.bias.normal_(generator=torch.Generator().manual_seed(0))  # query/key biases count
    bridge = lens.transformer_bridge_from_hf(hf)
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-6)
    from bcos_plugins import explain

    got = lens.explain_logits(bridge, tokens, target=5)
    torch.testing.assert_close(got.contributions, explain(hf, tokens, target=5).contributions, rtol=1e-4, atol=1e-6)
    assert float(got.completeness_error.max()) < 1e-5
    assert float(lens.token_component_decomposition(bridge, tokens, target=5).completeness_error.max()) < 1e-5


@pytest.mark.parametrize("convert", ["transformer_bridge_from_hf", "hooked_transformer_from_hf"])
def test_the_converters_refuse_a_tokenizer_name(convert):
    """tokenizer='gpt2' failed with AttributeError: 'str' object has no attribute 'save_pretrained'."""
    if convert == "hooked_transformer_from_hf" and hooked_transformer_from_hf_or_none() is None:
        return
    with pytest.raises(BcosTypeError, match=r"^tokenizer: expected a transformers tokenizer, got str 'gpt2'\. Pass the "
                                            r"tokenizer object"):
        getattr(lens, convert)(tiny_model("GPT2LMHeadModel"), tokenizer="gpt2")


def test_hooked_transformer_from_hf_refuses_a_model_class_that_is_not_a_hooked_transformer():
    """model_class=nn.Module failed with TypeError: Module.__init__() got an unexpected keyword argument
    'move_to_device'."""
    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:
        return
    with pytest.raises(BcosTypeError, match=r"^model_class: expected HookedTransformer or a subclass"):
        from_hf(tiny_model("GPT2LMHeadModel"), model_class=torch.nn.Module)


@pytest.mark.parametrize("container", ["DatasetDict", "dict", "DataFrame", "IterableDataset"])
def test_explain_dataset_refuses_containers_that_iterate_over_names(container):
    """A DatasetDict iterates over its split names, a dict over its keys, a DataFrame over its column names:
    explain_dataset explained the strings 'train' / 'text' as the corpus and returned one row for them, silently.
    An IterableDataset's dict rows were refused as 'text 0 is dict'."""
    import datasets

    from bcos_plugins import explain_dataset

    model, tokenizer, texts = _corpus_setup()
    table = datasets.Dataset.from_dict({"text": texts})
    data = {"DatasetDict": lambda: datasets.DatasetDict({"train": table}), "dict": lambda: {"text": texts},
            "DataFrame": lambda: table.to_pandas(), "IterableDataset": lambda: table.to_iterable_dataset()}[container]()
    with pytest.raises(BcosTypeError, match=r"^data: is a .*(gives its (keys|column names)|streamed).*\. "
                                            r"(Pass|Materialise)"):
        explain_dataset(model, tokenizer, data, target=5, progress=False)


@pytest.mark.parametrize(("max_length", "kind", "message"), [
    (-1, BcosValueError, r"must be >= 1, got -1"), (2.5, BcosTypeError, r"must be an integer, got float 2\.5"),
    (0, BcosValueError, r"must be >= 1, got 0"), (10_000, BcosValueError, r"is 10000 but GPT2LMHeadModel takes at most")])
def test_explain_dataset_checks_max_length_naming_it(max_length, kind, message):
    """-1 and 2.5 failed inside the tokenizer (OverflowError, TypeError), 0 was reported as texts that tokenise to no
    token, and a length beyond the position table as 'input_ids: has 50 positions' (an argument never passed)."""
    from bcos_plugins import explain_dataset

    model, tokenizer, texts = _corpus_setup()
    with pytest.raises(kind, match=rf"^max_length: {message}"):
        explain_dataset(model, tokenizer, texts, target=5, max_length=max_length, progress=False)


@pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_per_head_and_per_neuron_results_of_a_b1_model_sum_to_the_block_outputs(arch):
    """At B = 1 the B-cos scale is 1 but the projections still use unit-norm rows; BcosActivationCache handed B = 1 to
    TransformerLens' own results (cached z / post times the raw W_O / W_out), so stack_head_results missed attn_out by
    2.0, stack_neuron_results mlp_out by 1.4-2.0, and logit_attrs over the expanded decomposition the logit by
    0.08-0.16, silently."""
    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:
        return
    model = from_hf(bcosify(tiny_model(arch), b=1.0, verbose=False))
    tokens = _tokens()
    logits, cache = model.run_with_cache(tokens)
    layers = range(model.cfg.n_layers)
    heads = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=False)
    torch.testing.assert_close(heads.sum(0), sum(cache[f"blocks.{i}.hook_attn_out"][:, -1] for i in layers),
                               rtol=1e-5, atol=1e-6)
    neurons = cache.stack_neuron_results(layer=-1, pos_slice=-1, apply_ln=False)
    torch.testing.assert_close(neurons.sum(0), sum(cache[f"blocks.{i}.hook_mlp_out"][:, -1] for i in layers),
                               rtol=1e-5, atol=1e-6)
    resid = cache.get_full_resid_decomposition(pos_slice=-1, apply_ln=False, expand_neurons=True)
    attributed = cache.logit_attrs(resid, tokens=torch.tensor([5, 5]), pos_slice=-1)
    torch.testing.assert_close(attributed.sum(0), logits[:, -1, 5], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argument", ["target", "true_labels"])
def test_visualization_records_refuse_a_target_or_label_list_of_another_length(argument):
    """One entry too few failed with IndexError; one too many (the labels of the whole dataset for a batch of it) was
    read from its start, so records showed other examples' classes, silently."""
    pytest.importorskip("captum")
    from bcos_plugins.adapters.captum import visualization_records

    scores, tokens = [torch.tensor([0.5, 1.0]), torch.tensor([0.1, 0.2])], [["a", "b"], ["c", "d"]]
    for values in ([1], [0, 1, 2]):
        with pytest.raises(BcosValueError, match=rf"^{argument}: has {len(values)} entries for 2 explained examples"):
            visualization_records(scores=scores, tokens=tokens, **{argument: values})
    records = visualization_records(scores=scores, tokens=tokens, **{argument: [1, 0]})
    assert [getattr(r, "attr_class" if argument == "target" else "true_class") for r in records] == [1, 0]
