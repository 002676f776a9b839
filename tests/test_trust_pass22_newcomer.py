"""Trust pass 22, what a newcomer trips on: the most common mistakes of a first session (the tokenizer's output passed
where ids or texts are expected, a model on another device than its inputs), called the way the README and the host
pages write the calls. Each test fails on the behaviour before its fix, which returned a wrong number without a word
or raised an error that named neither the argument nor the fix."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError


@pytest.fixture(scope="module")
def tokenizer():
    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


def _tiny_bcos_bert(vocab_size: int):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, num_labels=2)
    return bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False).eval()


@pytest.fixture(scope="module")
def bert(tokenizer):
    return _tiny_bcos_bert(tokenizer.vocab_size)


TEXTS = ["a gorgeous, witty film", "dull"]


# ------------------------------------------------ the tokenizer's output where the texts are expected


def _batch_encoding(tokenizer):
    return tokenizer(TEXTS, return_tensors="pt", padding=True)


def test_predict_refuses_the_tokenizers_output_instead_of_predicting_its_key_names(bert, tokenizer):
    """A BatchEncoding iterates over its keys: predict returned the logits of the texts "input_ids",
    "token_type_ids" and "attention_mask", three rows for two texts, without a word."""
    from bcos_plugins.prediction import predict

    with pytest.raises(BcosTypeError, match=r"texts: .*BatchEncoding.*keys.*input_ids.*Pass the texts"):
        predict(bert, tokenizer, _batch_encoding(tokenizer))


@pytest.mark.parametrize("given", ["dict", "data_frame"])
def test_the_texts_check_refuses_containers_that_iterate_over_names(given):
    """A dict iterates over its keys, a pandas DataFrame over its column names: both were read as the texts (the one
    texts check of predict, accuracy, fine_tune_classifier, make_seqpg_examples and the pretraining helpers)."""
    from bcos_plugins._checks import require_texts

    if given == "dict":
        data = {"text": ["a film", "another"], "label": [1, 0]}
    else:
        import pandas
        data = pandas.DataFrame({"text": ["a film", "another"], "label": [1, 0]})
    with pytest.raises(BcosTypeError, match=r"texts: is a (dict|DataFrame).*'text', 'label'.*not texts.*Pass"):
        require_texts(data)
    assert require_texts(("a film", "another")) == ["a film", "another"]  # a tuple of strings is still read


def test_inseq_classifier_attribute_refuses_the_tokenizers_output_instead_of_attributing_its_key_names(
        bert, tokenizer):
    """``load_classifier(...).attribute(enc)``: the three key names were attributed as texts, three sequences for two
    texts, each column summing to a logit of the text "input_ids"."""
    from bcos_plugins.adapters.inseq import load_classifier

    classifier = load_classifier(bert, tokenizer, label_names=["negative", "positive"])
    with pytest.raises(BcosTypeError, match=r"texts: .*BatchEncoding.*input_ids.*Pass the texts"):
        classifier.attribute(_batch_encoding(tokenizer))
    assert len(classifier.attribute(TEXTS).sequence_attributions) == 2  # the texts themselves still attribute


# ------------------------------------------------ the tokenizer's output where the ids are expected


@pytest.mark.parametrize("as_dict", [False, True])
def test_explain_given_the_tokenizers_output_names_the_unpacking(bert, tokenizer, as_dict):
    """``explain(model, enc)``: the message told a user who had tokenised to tokenise (``tokenizer(texts,
    return_tensors='pt')``, which they had just done); it names the unpacking now."""
    enc = _batch_encoding(tokenizer)
    with pytest.raises(BcosTypeError, match=r"input_ids: .*(BatchEncoding|dict).*explain\(model, \*\*enc\)"):
        explain(bert, dict(enc) if as_dict else enc)
    # the named fix runs as written
    unpacked = explain(bert, **enc)
    assert float(unpacked.completeness_error.max()) < 1e-4


# ------------------------------------------------ a model on another device than its inputs


def test_explain_refuses_ids_on_another_device_than_the_model_naming_the_move(bert, tokenizer):
    """The model's parameters on one device, the ids on another: the call failed deep inside (torch's "Expected all
    tensors to be on the same device", or on a model without weights "unknown device type for autocast"), naming
    neither the argument nor the fix. The meta device stands in for an accelerator on a CPU-only machine: the check
    compares devices, whatever they are."""
    enc = _batch_encoding(tokenizer)
    elsewhere = _tiny_bcos_bert(tokenizer.vocab_size).to("meta")
    with pytest.raises(BcosValueError, match=r"input_ids: is on cpu, but the model's input embeddings are on "
                                             r"meta.*input_ids\.to\(model\.device\)"):
        explain(elsewhere, enc["input_ids"], enc["attention_mask"])


def test_captum_embedding_forward_refuses_ids_on_another_device_than_the_model(bert, tokenizer):
    from bcos_plugins.adapters.captum import EmbeddingForward

    enc = _batch_encoding(tokenizer)
    elsewhere = _tiny_bcos_bert(tokenizer.vocab_size).to("meta")
    with pytest.raises(BcosValueError, match=r"input_ids: is on cpu, but the model's input embeddings are on meta"):
        EmbeddingForward(elsewhere).embed(enc["input_ids"], enc["attention_mask"])


# ------------------------------------------------ forgetting .eval(): Captum's own methods through EmbeddingForward


@pytest.mark.parametrize("method", ["InputXGradient", "IntegratedGradients", "Saliency"])
def test_captums_own_methods_through_embedding_forward_of_a_model_left_in_training_mode_are_its_eval_mode_ones(
        tokenizer, method):
    """The Captum page's way to run every Captum method at the attribution point: ``EmbeddingForward(model)``.
    ``BcosAttribution`` and ``LayerBcos`` explain a model left in training mode (after fine-tuning) in eval mode, but
    Captum's own methods through the same wrapper ran it with dropout on: random attributions (0.09 off on a tiny
    BERT's input x gradient), without a word. The model's training flags are back afterwards."""
    import captum.attr
    from bcos_plugins.adapters.captum import EmbeddingForward

    model = _tiny_bcos_bert(tokenizer.vocab_size)  # dropout 0.1, the config default
    enc = _batch_encoding(tokenizer)
    forward = EmbeddingForward(model)
    embeddings = forward.embed(enc["input_ids"], enc["attention_mask"])

    def attribute():
        return getattr(captum.attr, method)(forward).attribute(
            embeddings.clone().requires_grad_(), target=1, additional_forward_args=(enc["attention_mask"],))

    model.eval()
    expected = attribute()
    model.train()
    model.bert.encoder.layer[0].eval()  # a module a training loop keeps in eval mode stays so
    torch.testing.assert_close(attribute(), expected, rtol=0, atol=0)
    assert model.training and model.classifier.training and not model.bert.encoder.layer[0].training


# ------------------------------------------------ the public API reads in help()


def _public_functions_and_classes():
    import importlib
    import inspect
    import pkgutil

    import bcos_plugins

    names = ["bcos_plugins"] + [m.name for m in pkgutil.walk_packages(bcos_plugins.__path__, "bcos_plugins.")
                                if not any(part.startswith("_") for part in m.name.split("."))]
    found = {}
    for module_name in names:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_public_function_and_class_has_its_own_docstring():
    """``help(supported_architectures)`` (named in the README's first table) showed only its signature, and the API
    reference an empty entry; so did ``check_guidance``'s. Every name a public module lists in ``__all__`` says
    what it does."""
    public = _public_functions_and_classes()
    assert len(public) > 200  # the walk reached the subpackages (bcos_plugins.attribution, .metrics, .nn, ...)
    undocumented = sorted(name for name, value in public.items() if not (value.__doc__ or "").strip())
    assert not undocumented, f"add a docstring to: {undocumented}"


# ------------------------------------------------ a label name (or a token) where an id is expected


def test_a_label_name_as_target_or_label_names_the_mapping_to_its_id(bert, tokenizer):
    """``explain(..., target="positive")``, ``accuracy(..., labels=["positive", ...])``: refused with "cannot read
    'positive' as ids. Pass an int ...", which named neither what was passed (a class name) nor how to get its id."""
    from bcos_plugins.prediction import accuracy

    enc = _batch_encoding(tokenizer)
    with pytest.raises(BcosTypeError, match=r"target: got a name \('positive'\), not an id.*"
                                            r"model\.config\.label2id\['positive'\].*convert_tokens_to_ids"):
        explain(bert, **enc, target="positive")
    with pytest.raises(BcosTypeError, match=r"labels: got names \(\['positive', 'negative'\]\), not ids.*"
                                            r"model\.config\.label2id\['positive'\]"):
        accuracy(bert, tokenizer, TEXTS, ["positive", "negative"])
    # a position given as a string is no class name: no label2id hint there
    from bcos_plugins._checks import require_row_ids

    with pytest.raises(BcosTypeError, match=r"^position: cannot read 'last' as ids\.") as refused:
        require_row_ids("position", "last", 2)
    assert "label2id" not in str(refused.value)


# ------------------------------------------------ the per-class support matrix is the tests' own


def _per_class_table() -> dict[str, dict[str, str]]:
    """docs/getting-started.md's "What works per model class" table: head row -> column -> cell."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = text.split("{#per-class}", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    header, *body = rows
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_the_per_class_support_matrix_states_what_the_conformance_tests_run():
    """Each "yes" cell of the per-class table is a test parametrised over every class of its row, and each "no" a
    class no such test runs: a class added to the registry, or a path that stops covering a head, shows here."""
    import test_conformance as conformance
    import test_masked_lm_position
    from test_doc_registry_lists import _family, _spelled

    from bcos_plugins.convert.architectures import SPECS

    heads = {"causal LMs": "causal_lm", "sequence classifiers": "classifier", "masked LM": "masked_lm",
             "base models": "base"}
    # the classes each column's tests run on (by the parametrisation of tests/test_conformance.py; the masked LM's
    # Captum path is tests/test_masked_lm_position.py's LayerBcos test)
    tested = {
        "`explain`": set(conformance.NAMES),
        "Captum": set(conformance.CAPTUM_NAMES) | {"BertForMaskedLM"},  # the LayerBcos test below
        "inseq": set(conformance.CAUSAL_LM_NAMES) | set(conformance.CLASSIFIER_NAMES),
        "TransformerLens `HookedTransformer`": set(conformance.LENS_NAMES),
        "`TransformerBridge`": set(conformance.BRIDGE_NAMES),
        "sae-lens": set(conformance.LENS_NAMES),
    }
    assert callable(test_masked_lm_position.test_explain_and_captum_layer_bcos_explain_the_same_masked_lm_position)
    table = _per_class_table()
    assert len(table) == len(heads)
    covered = set()
    for row, cells in table.items():
        head = heads[next(h for h in heads if row.startswith(h))]
        classes = {name for name, spec in SPECS.items() if spec.head == head}
        covered |= classes
        # the families the row names are those of its head's classes
        assert _spelled(row.split("(")[0]) == {_family(name) for name in classes}, row
        for column, cell in cells.items():
            claims = not cell.startswith(("no", "refused"))
            if claims:
                assert classes <= tested[column], f"{row} / {column}: untested {sorted(classes - tested[column])}"
            else:
                assert not classes & tested[column], f"{row} / {column} says no, but tests run it"
        assert cells["Captum"].startswith("refused") == (head == "base")
    assert covered == set(SPECS)  # every class of the registry is in a row
    assert set(conformance.BASE_NAMES) == {n for n, s in SPECS.items() if s.head == "base"}  # the refusal's test


# ------------------------------------------------ `python examples/x.py --help`


class _RunStarted(Exception):
    """Raised in place of an example's first step: the run would have started."""


def _example_started_by(name: str, monkeypatch):
    """The example (or benchmark) module with its first step (reading its settings) replaced by a _RunStarted."""
    import importlib
    import types

    module = importlib.import_module(name)

    def started(*args, **kwargs):
        raise _RunStarted

    first_step = {"examples.demo_sst2": "demo_settings", "examples.blimp_mrr": "blimp_settings",
                  "examples.vit_digits": "vit_digits_settings", "benchmarks.bench_core": "env_int"}
    if name == "examples.ioi_circuit":
        monkeypatch.setattr(module, "ioi_recipe", types.SimpleNamespace(Settings=types.SimpleNamespace(
            from_env=started)))
    elif name == "benchmarks.bench_decoders":
        monkeypatch.setattr(module, "Settings", types.SimpleNamespace(from_env=started))
    elif name == "benchmarks.bench_vision":
        monkeypatch.setattr(module, "Config", types.SimpleNamespace(from_env=started))
    else:
        monkeypatch.setattr(module, first_step[name], started)
    return module


@pytest.mark.parametrize("name", ["examples.demo_sst2", "examples.blimp_mrr", "examples.vit_digits",
                                  "examples.ioi_circuit", "benchmarks.bench_core", "benchmarks.bench_decoders",
                                  "benchmarks.bench_vision"])
def test_an_example_configured_by_the_environment_answers_help_and_refuses_other_arguments(
        name, monkeypatch, capsys):
    """``python examples/demo_sst2.py --help`` started the whole run (minutes of training, outputs/ overwritten): the
    four examples and three benchmarks configured by environment variables alone read no command line, so
    ``--help`` and ``--epochs 1`` were ignored. ``--help`` prints the docstring, which lists the variables; any other
    argument is refused naming them."""
    module = _example_started_by(name, monkeypatch)
    name = name.split(".")[1]
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == module.__doc__.strip()
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--epochs", "1"])
    with pytest.raises(SystemExit, match=rf"^{name}\.py: unknown arguments \['--epochs', '1'\]: it takes its settings "
                                         r"from environment variables only\. .*--help lists them"):
        module.main()
    monkeypatch.setattr("sys.argv", [f"{name}.py"])  # as the Makefile runs it: the run starts
    with pytest.raises(_RunStarted):
        module.main()


def test_the_tokenizers_output_as_tokens_names_the_keyword_the_path_takes(tokenizer):
    """TransformerLens paths take ``tokens=``: the refusal names that keyword, not ``explain``'s unpacking."""
    from bcos_plugins._checks import require_token_batch

    enc = _batch_encoding(tokenizer)
    with pytest.raises(BcosTypeError, match=r"^tokens: .*BatchEncoding.*Pass its ids and mask: tokens=enc\['input_ids'\], "
                                            r"attention_mask=enc\['attention_mask'\]\.$"):
        require_token_batch(enc, name="tokens")


def test_captum_layer_bcos_given_the_tokenizers_output_names_the_ids_and_the_mask(bert, tokenizer):
    """``LayerBcos(model).attribute(enc, target=1)``: Captum's bare AssertionError ("`inputs` must be a
    torch.Tensor or a tuple[torch.Tensor] but found: BatchEncoding") named neither the ids nor where the mask goes."""
    from bcos_plugins.adapters.captum import LayerBcos

    enc = _batch_encoding(tokenizer)
    with pytest.raises(BcosTypeError, match=r"^inputs: got the tokenizer's output \(a BatchEncoding.*\)\. Pass its ids as "
                                            r"inputs and its mask in additional_forward_args: .*attribute\(enc\['input_ids'\], "
                                            r"target=\.\.\., additional_forward_args=\(enc\['attention_mask'\],\)\)"):
        LayerBcos(bert).attribute(enc, target=1)
    attributions = LayerBcos(bert).attribute(enc["input_ids"], target=1, additional_forward_args=(enc["attention_mask"],))
    want = explain(bert, **enc, target=1).explained
    torch.testing.assert_close(attributions.sum(dim=(1, 2)), want, rtol=1e-5, atol=1e-6)


def test_captum_target_given_a_label_name_names_the_mapping(bert, tokenizer):
    from bcos_plugins.adapters.captum import LayerBcos

    enc = _batch_encoding(tokenizer)
    with pytest.raises(BcosTypeError, match=r"^target: got a name \('LABEL_1'\), not a class index\. Map a class name to "
                                            r"its id with model\.config\.label2id\['LABEL_1'\]"):
        LayerBcos(bert).attribute(enc["input_ids"], target="LABEL_1", additional_forward_args=(enc["attention_mask"],))


@pytest.mark.parametrize("given", ["batch_encoding", "ids"])
def test_inseq_bcos_attribute_given_token_ids_asks_for_the_texts(given):
    """``inseq.load_model(model, "bcos").attribute(tokenizer(...))`` failed inside inseq with "IndexError: list index
    out of range" (ids: "Boolean value of Tensor with more than one value is ambiguous")."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    from test_conformance import _stock, _word_tokenizer

    tokenizer = _word_tokenizer()
    model = inseq.load_model(bcosify(_stock("GPT2LMHeadModel"), b=1.1, verbose=False), "bcos", tokenizer=tokenizer)
    enc = tokenizer(["w3 w7 w5"], return_tensors="pt")
    with pytest.raises(BcosTypeError, match=r"^input_texts: got (the tokenizer's output|a tensor of token ids).*"
                                            r"batch_decode"):
        model.attribute(enc if given == "batch_encoding" else enc["input_ids"], generation_args={"max_new_tokens": 1})
    out = model.attribute(["w3 w7 w5"], generation_args={"max_new_tokens": 1})  # the texts themselves still run
    assert len(out.sequence_attributions) == 1


def test_explain_dataset_given_class_names_names_the_mapping_to_their_ids(bert, tokenizer):
    """A datasets column of class names (``target_column="label"`` holding "positive") was refused with "Pass one int
    per text (fill or drop the texts without one)", a fix for missing values, not for names."""
    import datasets

    from bcos_plugins import explain_dataset

    data = datasets.Dataset.from_dict({"text": TEXTS, "label": ["positive", "negative"]})
    for kwargs in ({"target_column": "label"}, {"target": ["positive", "negative"]}):
        with pytest.raises(BcosTypeError, match=r"the value for text 0 is str 'positive', not an integer id\. Map class "
                                                r"names to their ids first with model\.config\.label2id"):
            explain_dataset(bert, tokenizer, data, **kwargs)
