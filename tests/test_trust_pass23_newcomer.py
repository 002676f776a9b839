"""Trust pass 23, what a newcomer trips on (second look): keywords written the way other libraries spell them
(``labels=`` / ``targets=`` / ``class_idx=`` for ``target=``, ``mask=`` for ``attention_mask=``), arguments in the wrong
order (the tokenizer or the ids where the model goes, the model where the tokenizer goes), a transformers pipeline or a
PEFT model passed as the model, a model on the meta device. Each test fails on the behaviour before its fix, which
explained another class than the one given without a word, or raised an error whose fix was wrong or missing."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import padded_batch

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError


@pytest.fixture(scope="module")
def tokenizer():
    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


def _config(vocab_size: int) -> T.BertConfig:
    return T.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)


@pytest.fixture(scope="module")
def bert(tokenizer):
    torch.manual_seed(0)
    return bcosify(T.BertForSequenceClassification(_config(tokenizer.vocab_size)), b=1.5, verbose=False).eval()


@pytest.fixture(scope="module")
def encoded(tokenizer):
    enc = tokenizer(["a gorgeous, witty film", "dull"], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


# ------------------------------------------------ labels= for target=: another class explained without a word


def test_explain_given_labels_without_a_target_names_target_instead_of_explaining_the_predicted_class(bert, encoded):
    """``labels=`` is a keyword of every transformers head (its loss target), so the forward's keyword check let it
    through: ``explain(model, ids, mask, labels=y)`` explained the predicted class of each row, not ``y``, and the
    result's ``target`` was the only sign. Next to a ``target=`` it is still passed on (the loss nothing reads)."""
    ids, mask = encoded
    predicted = bert(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    labels = 1 - predicted  # the other class in every row, so explaining the predicted one cannot pass for it
    with pytest.raises(BcosTypeError, match=r"^labels: is the model's loss target, which no explanation reads: "
                                            r"without target= a classifier's predicted class would be explained\. "
                                            r"Pass target="):
        explain(bert, ids, mask, labels=labels)
    given = explain(bert, ids, mask, target=labels, labels=labels)
    assert torch.equal(given.target, labels)
    torch.testing.assert_close(given.explained, explain(bert, ids, mask, target=labels).explained, rtol=0, atol=0)


@pytest.mark.parametrize(("written", "meant"), [
    ("label", "target"),  # before: "Pass labels= if that is what you meant", which was then taken silently
    ("targets", "target"),
    ("class_idx", "target"),  # before: "Pass seq_idx= if that is what you meant"
    ("foils", "foil"),
    ("positions", "position"),  # before: "Pass position_ids= if that is what you meant"
    ("mask", "attention_mask"),  # before: a list of seventeen forward keywords
    ("targte", "target"),
])
def test_explain_names_its_own_keyword_for_the_ways_a_newcomer_writes_it(bert, encoded, written, meant):
    ids, mask = encoded
    with pytest.raises(BcosTypeError, match=rf"^{written}: is not a keyword of this call nor of the model's forward\. "
                                            rf"Pass {meant}= \(explain\(model, input_ids, attention_mask, target="):
        explain(bert, ids, mask, **{written: 1 if meant != "attention_mask" else mask})


def test_explain_keeps_the_forwards_own_hint_for_a_misspelt_forward_keyword(bert, encoded):
    """The names explain redirects are its own: a misspelt keyword of the forward keeps the forward check's hint."""
    ids, mask = encoded
    with pytest.raises(BcosTypeError, match=r"^token_type_id: is not an argument of .*Pass token_type_ids= if"):
        explain(bert, ids, mask, token_type_id=torch.zeros_like(ids))


def test_context_attribution_given_labels_without_a_target_names_target(tokenizer):
    """The Space model's forward reads ``labels`` too: ``context_attribution(model, ids, mask, labels=y)`` explained
    the predicted class. The same check as explain's, with context_attribution's own keywords."""
    from bcos_plugins import context_attribution
    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    encoder = T.BertModel(_config(tokenizer.vocab_size))
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=3).eval()
    ids, mask = padded_batch()
    predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    labels = (predicted + 1) % 3
    with pytest.raises(BcosTypeError, match=r"^labels: is the model's loss target.*Pass target= "
                                            r"\(context_attribution\(model, input_ids, attention_mask, target=\.\.\., "
                                            r"foil=\.\.\.\)\)"):
        context_attribution(model, ids, mask, labels=labels)
    with pytest.raises(BcosTypeError, match=r"^targets: is not a keyword of this call.*Pass target= "):
        context_attribution(model, ids, mask, targets=labels)
    assert torch.equal(context_attribution(model, ids, mask, target=labels, labels=labels).target, labels)


# ------------------------------------------------ arguments in the wrong place


def test_a_tokenizer_the_ids_or_a_pipeline_where_the_model_goes_are_named_with_the_fix(bert, tokenizer, encoded):
    """Each was refused as "model: <module.Class> is not supported by bcosify. Pass one of the transformers classes
    BertForMaskedLM, ..." (some thirty names), which named neither the swap nor the fix."""
    from bcos_plugins.convert import UnsupportedModuleError

    ids, mask = encoded
    with pytest.raises(UnsupportedModuleError, match=r"^model: is a tokenizer \(BertTokenizer\), not a model: the "
                                                     r"arguments may be swapped\. Pass the model first"):
        explain(tokenizer, ids, mask)
    with pytest.raises(UnsupportedModuleError, match=r"^model: is a tensor \(shape \(2, 7\)\), not a model.*Pass the "
                                                     r"model first"):
        explain(ids, bert, mask)
    pipe = T.pipeline("text-classification", model=bert, tokenizer=tokenizer)
    with pytest.raises(UnsupportedModuleError, match=r"^model: is a transformers pipeline \(TextClassificationPipeline"
                                                     r"\), not a model\. Pass its model: pipe\.model"):
        explain(pipe, ids, mask)
    assert explain(pipe.model, ids, mask).completeness_error.max() < 1e-4  # the fix it names works


def test_the_trainer_fine_tune_classifier_returns_is_named_where_the_model_goes(bert, tokenizer, encoded):
    """``model = fine_tune_classifier(...)`` keeps the Trainer it returns (it trains the model in place): explaining it
    was refused as "transformers.trainer.Trainer is not supported by bcosify" and thirty class names."""
    import copy

    from bcos_plugins import fine_tune_classifier
    from bcos_plugins.convert import UnsupportedModuleError

    model = copy.deepcopy(bert)
    trainer = fine_tune_classifier(model, tokenizer, ["a film", "dull"], [1, 0], epochs=0.5, progress=False)
    ids, mask = encoded
    with pytest.raises(UnsupportedModuleError, match=r"^model: is a transformers Trainer \(Trainer\), not a model "
                                                     r"\(fine_tune_classifier and train_causal_lm return the Trainer.*"
                                                     r"Pass the model: trainer\.model"):
        explain(trainer, ids, mask)
    assert explain(trainer.model, ids, mask).completeness_error.max() < 1e-4  # the fix it names works


def test_a_peft_model_is_refused_naming_the_merge():
    """A PEFT wrapper (``PeftModel``: ``merge_and_unload``) was refused as an unsupported class among thirty names;
    its LoRA layers are no B-cos layers, so the fix is to merge them (a stand-in class: peft is not a dependency)."""
    from bcos_plugins.convert import UnsupportedModuleError

    class PeftModelForSequenceClassification(torch.nn.Module):
        def merge_and_unload(self):
            return self

    with pytest.raises(UnsupportedModuleError, match=r"^model: is a PEFT model \(PeftModelForSequenceClassification\)"
                                                     r".*model = model\.merge_and_unload\(\)"):
        explain(PeftModelForSequenceClassification(), torch.ones(1, 3, dtype=torch.long))


def test_a_model_where_the_tokenizer_goes_is_named_without_printing_the_model(bert):
    """``explain_dataset(tokenizer, model, texts)``'s tokenizer check printed the model's repr (its module tree),
    cut at 200 characters in the middle of a layer, before its fix."""
    from bcos_plugins import explain_dataset

    with pytest.raises(BcosTypeError) as caught:
        explain_dataset(bert, bert, ["a film"], progress=False)
    assert str(caught.value) == ("tokenizer: expected a transformers tokenizer, got a model "
                                 "(BertForSequenceClassification): the arguments may be swapped. Pass the model first "
                                 "and its tokenizer second, e.g. explain_dataset(model, tokenizer, texts).")


def test_predict_accuracy_and_fine_tuning_name_a_swapped_model_and_tokenizer(bert, tokenizer):
    """``predict(tokenizer, model, texts)`` failed with "AttributeError: BertTokenizer has no attribute parameters", and
    ``predict(model, model, texts)`` / ``fine_tune_classifier(model, model, ...)`` called the model on the texts
    ("'list' object has no attribute 'size'"); accuracy and fine-tuning named the tokenizer "not a sequence
    classifier". One check each way (_checks.require_model_object, _checks.refuse_a_model_as_the_tokenizer)."""
    from bcos_plugins import fine_tune_classifier
    from bcos_plugins.prediction import accuracy, predict

    texts, labels = ["a film", "dull"], [1, 0]
    swapped = r"^model: is a tokenizer \(BertTokenizer\), not a model: the arguments may be swapped"
    for call in (lambda: predict(tokenizer, bert, texts), lambda: accuracy(tokenizer, bert, texts, labels),
                 lambda: fine_tune_classifier(tokenizer, bert, texts, labels, progress=False)):
        with pytest.raises(BcosTypeError, match=swapped):
            call()
    twice = r"^tokenizer: expected a transformers tokenizer, got a model \(BertForSequenceClassification\).*e\.g\. "
    with pytest.raises(BcosTypeError, match=twice + r"predict\(model, tokenizer, texts\)"):
        predict(bert, bert, texts)
    with pytest.raises(BcosTypeError, match=twice + r"fine_tune_classifier\(model, tokenizer, texts, labels\)"):
        fine_tune_classifier(bert, bert, texts, labels, progress=False)
    assert predict(bert, tokenizer, texts).shape == (2, 2)  # the order it names works


def test_explain_dataset_with_the_texts_and_the_tokenizer_swapped_names_the_order(bert, tokenizer):
    """``explain_dataset(model, texts, tokenizer)`` failed reading the data: "'BertTokenizer' object is not iterable"."""
    from bcos_plugins import explain_dataset

    with pytest.raises(BcosTypeError, match=r"^tokenizer: expected a transformers tokenizer, got a list of 2 text\(s\): "
                                            r"the arguments may be swapped\. Pass the model, its tokenizer, then the "
                                            r"texts"):
        explain_dataset(bert, ["a film", "dull"], tokenizer, progress=False)


def test_bcosify_with_b_first_names_the_swap_without_printing_the_model():
    """``bcosify(1.5, model)``: check_b refused b as "must be a real number, got BertForSequenceClassification" followed
    by the model's whole module tree (hundreds of lines)."""
    from bcos_plugins import BcosTypeError as PackageTypeError

    stock = T.BertForSequenceClassification(_config(64))
    with pytest.raises(PackageTypeError) as caught:
        bcosify(1.5, stock)
    assert str(caught.value) == ("b: is a model (BertForSequenceClassification) and model is float 1.5: the arguments "
                                 "are swapped. Pass the model first: bcosify(model, b=1.5).")


def test_ids_with_a_third_dimension_are_refused_with_the_fix_for_that_shape(bert, tokenizer):
    """Texts tokenised one at a time and stacked give (batch, 1, pos): the refusal told the user to "Add a batch
    dimension with input_ids[None]", which makes it worse. The 1-d case keeps that fix."""
    stacked = torch.stack([tokenizer(text, return_tensors="pt")["input_ids"] for text in ("a film", "a play")])
    with pytest.raises(BcosValueError, match=r"^input_ids: expected shape \(batch, pos\), got \(2, 1, 4\)\. Tokenise "
                                             r"the texts in one call.*input_ids\.squeeze\(1\)"):
        explain(bert, stacked)
    assert explain(bert, stacked.squeeze(1)).completeness_error.max() < 1e-4  # the fix it names works
    with pytest.raises(BcosValueError, match=r"got \(4,\)\. Add a batch dimension with input_ids\[None\]"):
        explain(bert, stacked[0, 0])


# ------------------------------------------------ a model on the meta device


def test_the_paths_that_tokenise_texts_refuse_a_model_on_the_meta_device(tokenizer):
    """``explain_dataset`` and ``predict`` moved the ids to the model's device and failed in the tokenizer check with
    torch's "Tensor.item() cannot be called on meta tensors", naming neither the model nor the fix."""
    from bcos_plugins import explain_dataset
    from bcos_plugins.prediction import predict

    meta = bcosify(T.BertForSequenceClassification(_config(tokenizer.vocab_size)), b=1.5, verbose=False).to("meta")
    for call in (lambda: explain_dataset(meta, tokenizer, ["a film"], progress=False),
                 lambda: predict(meta, tokenizer, ["a film"])):
        with pytest.raises(BcosValueError, match=r"^model: its parameters are on the meta device \(shapes without "
                                                 r"values, e\.g\. bert\.embeddings\.word_embeddings\.weight\).*Load the "
                                                 r"weights first"):
            call()


def test_explain_of_a_model_on_the_meta_device_says_its_weights_were_never_loaded(tokenizer, encoded):
    """The device check told the user to move the ids to the model's device, meta, where the token check then refused
    them as values-less: the message now says the weights are missing (the move stays named, for a real device)."""
    ids, mask = encoded
    meta = bcosify(T.BertForSequenceClassification(_config(tokenizer.vocab_size)), b=1.5, verbose=False).to("meta")
    with pytest.raises(BcosValueError, match=r"^input_ids: is on cpu, but the model's input embeddings are on meta "
                                             r"\(shapes without values: the model's weights were never loaded; load "
                                             r"them first"):
        explain(meta, ids, mask)


# ------------------------------------------------ what make demo's terminal output shows


def test_the_demos_token_lines_carry_their_signed_shares_where_the_console_has_no_colours():
    """``make demo | tee demo.log`` (or NO_COLOR): rich drops the colours, and the token lines of step 5 came out as
    the bare tokens, without a sign or a size, under no legend; now each token carries its signed share, and a legend
    says what the lines show in either case."""
    from io import StringIO

    from rich.console import Console

    from examples.demo_sst2 import colour_tokens, token_legend

    plain = Console(file=StringIO(), no_color=True, width=200)
    plain.print(colour_tokens(["a", "film"], torch.tensor([-0.125, 0.5]), colour=False))
    assert plain.file.getvalue().strip() == "a(-0.125) film(+0.500)"
    assert "signed share follows it" in token_legend(False) and "green supports" in token_legend(True)
    coloured = Console(file=StringIO(), color_system="truecolor", force_terminal=True, width=200)
    coloured.print(colour_tokens(["a", "film"], torch.tensor([-0.125, 0.5])))
    assert "\x1b[" in coloured.file.getvalue() and "(" not in coloured.file.getvalue()  # colours, no numbers


# ------------------------------------------------ help() of the curated public names says what comes back


@pytest.mark.parametrize("name", ["context_attribution", "explain_image", "rationale_alignment", "bcos_loss"])
def test_help_of_the_public_functions_says_what_they_return(name):
    """``help(context_attribution)`` said neither what it returns nor that the classifier bias is left out of the
    tokens' shares; ``explain_image``, ``rationale_alignment`` and ``bcos_loss`` named no return value either."""
    import inspect

    import bcos_plugins

    doc = inspect.getdoc(getattr(bcos_plugins, name))
    assert "\nReturns:\n" in doc
    returns = doc.split("\nReturns:\n", 1)[1]
    expected = {"context_attribution": ["SpaceExplanation", "(batch, pos)", "bias"],
                "explain_image": ["ImageExplanation", "(batch, H, W)", "(batch, 2C, H, W)"],
                "rationale_alignment": ["RationaleAlignment", "iou_per_row", "(batch,)"],
                "bcos_loss": ["0-d tensor", "float32"]}[name]
    assert all(word in returns for word in expected), returns


# ------------------------------------------------ make help


def test_make_help_names_every_target_of_the_makefile():
    """``make help`` answered "No rule to make target 'help'" (and a bare ``make`` builds .venv for minutes): it lists
    every rule of the Makefile, the examples' targets included, and names no target the Makefile lacks."""
    import re
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.fail("make is not installed: the Makefile is the documented entry point (make setup, make test)")
    root = Path(__file__).resolve().parents[1]
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    rules = set(re.findall(r"^([a-z][\w-]*):(?!=)", makefile, flags=re.M)) - {"help"}
    examples = re.search(r"^EXAMPLES := (.+)$", makefile, flags=re.M).group(1).split()
    shown = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True, check=True).stdout
    named = set(re.findall(r"^make ([\w-]+) ", shown, flags=re.M))
    assert rules == named, f"missing from make help: {sorted(rules - named)}; not a rule: {sorted(named - rules)}"
    assert len(rules) >= 18 and all(name in shown.splitlines()[-1].split() for name in examples)
    phony = re.search(r"^\.PHONY: (.+)$", makefile, flags=re.M).group(1).split()
    assert rules | {"help"} <= set(phony), f"targets not declared .PHONY: {sorted(rules - set(phony))}"
