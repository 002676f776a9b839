"""Trust pass 22 follow-ups (helper-145): small defects of the first reports. Each test fails on the behaviour before
its fix: a result printed as whole tensors, an error that named neither the argument nor the fix, a docstring help()
could not reach from the function."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import with_nan_embedding_row

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError, BcosValueError


def _tiny_bcos_bert(vocab_size: int = 100):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, num_labels=2, pad_token_id=0)
    return bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False).eval()


@pytest.fixture(scope="module")
def bert():
    return _tiny_bcos_bert()


IDS = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])


# ------------------------------------------------ repr of the result types


def test_repr_of_an_explanation_is_one_short_line_naming_what_was_explained(bert):
    """print(explanation) dumped the whole (batch, pos, d_model) tensors (dataclass repr): thousands of lines for a
    real model, and the completeness error nowhere."""
    explanation = explain(bert, IDS, MASK, target=torch.tensor([1, 0]))
    text = repr(explanation)
    assert "\n" not in text and len(text) < 200
    assert text.startswith("TokenExplanation(batch=2, positions=4, target=[1, 0], ")
    error = float(explanation.completeness_error.max())
    assert f"completeness_error max={error:.2g}" in text
    assert "tensor(" not in text and str(explanation) == text


def test_repr_names_the_foil_the_positions_and_a_direction_and_shortens_long_targets():
    from bcos_plugins import Direction, TokenExplanation

    scores = torch.ones(10, 3)
    made = TokenExplanation(contributions=scores, input_contributions=scores[..., None], explained=scores.sum(1),
                            target=torch.arange(10), foil=Direction(torch.ones(7)), position=torch.full((10,), 2))
    text = repr(made)
    assert "target=[0, 1, 2, 3, 4, 5, 6, 7, ...]" in text
    assert "foil=Direction(vector of shape (7,))" in text
    assert "position=[2, 2, 2, 2, 2, 2, 2, 2, ...]" in text
    assert "completeness_error max=0" in text


def test_every_result_type_gets_the_short_repr():
    """The subclasses are dataclasses too: each decorator wrote its own field-by-field repr over the base's."""
    from adapters._lens.explain import LensExplanation
    from bcos_plugins.space.attribution import SpaceExplanation
    from bcos_plugins.vision.explain import ImageExplanation

    scores = torch.ones(2, 3)
    for cls in (SpaceExplanation, LensExplanation):
        made = cls(contributions=scores, input_contributions=scores[..., None], explained=scores.sum(1), target=1)
        assert repr(made).startswith(f"{cls.__name__}(batch=2, positions=3, target=1, completeness_error")
    pixels = torch.ones(2, 4, 4)
    image = ImageExplanation(contributions=pixels, input_contributions=pixels[:, None], explained=pixels.sum((1, 2)),
                             target=torch.tensor([3, 4]))
    assert repr(image) == "ImageExplanation(batch=2, shape=(4, 4), target=[3, 4], completeness_error max=0)"


# ------------------------------------------------ tokens(tokenizer)


class _Tokenizer:
    """A duck-typed tokenizer of ``size`` tokens."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" if i < self.size else None for i in ids]


def test_tokens_of_none_names_the_argument_and_the_fix(bert):
    """tokens(None) raised "AttributeError: 'NoneType' object has no attribute 'convert_ids_to_tokens'"."""
    explanation = explain(bert, IDS, MASK)
    with pytest.raises(BcosTypeError, match=r"tokenizer: expected the explained model's tokenizer .*got NoneType"
                                            r".*Pass the tokenizer object"):
        explanation.tokens(None)


def test_tokens_refuses_a_tokenizer_too_small_for_the_ids(bert):
    """An id outside the tokenizer's vocabulary proves it is another model's: transformers gave None for it."""
    explanation = explain(bert, IDS, MASK)
    assert explanation.tokens(_Tokenizer(10))[0] == ["w5", "w6", "w7"]
    with pytest.raises(BcosValueError, match=r"^tokenizer: _Tokenizer has no token for id 9 \(row 1, position 3; 1 "
                                             r"such tokens\): it is not the tokenizer of the explained model\. Pass "
                                             r"the tokenizer the explained ids"):
        explanation.tokens(_Tokenizer(9))


# ------------------------------------------------ help(bcos_plugins.explain)


def test_help_of_explain_carries_what_a_user_needs():
    """``help(bcos_plugins.explain)`` said "(module docstring)", which help() of the function cannot reach (the
    package's name ``explain`` is the function): what is explained per kind of model, what is returned and an
    example were nowhere in it."""
    import inspect

    import bcos_plugins

    doc = inspect.getdoc(bcos_plugins.explain)
    assert "module docstring" not in doc
    for needed in ("classifiers:", "causal LMs:", "masked LMs:", "base models:", "Args:", "Returns:",
                   "TokenExplanation", "completeness_error", "Examples:", ">>> explanation = explain(", "docs/in-depth.md"):
        assert needed in doc, needed


# ------------------------------------------------ a padding token whose embedding is NaN


def test_explain_names_the_padding_tokens_nan_embedding(bert):
    """A NaN padding embedding makes every padded row NaN (a masked key's weight 0 times NaN): the refusal said
    "check those rows' inputs and the embedding rows of their tokens", where the one broken row is the padding's."""
    with pytest.raises(BcosValueError, match=r"row\(s\) \[0\].*The padding token's input embedding "
                                             r"\(model\.get_input_embeddings\(\)\.weight\[0\]\) is NaN or infinite.*"
                                             r"weight\.data\[0\] = 0"):
        explain(with_nan_embedding_row(bert, 0), IDS, MASK)
    # a real token's broken row keeps the message that points at the rows' tokens, not the padding
    with pytest.raises(BcosValueError, match=r"nothing finite to explain \(an input or an embedding row") as caught:
        explain(with_nan_embedding_row(bert, 7), IDS, MASK)
    assert "padding" not in str(caught.value)


def test_predict_names_the_padding_tokens_nan_embedding():
    from bcos_plugins.prediction import predict
    from bcos_plugins.pretrained import minilm_path

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    model = with_nan_embedding_row(_tiny_bcos_bert(len(tokenizer)), tokenizer.pad_token_id)
    with pytest.raises(BcosValueError, match=rf"predict: .*texts \[1\].*The padding token's input embedding "
                                             rf"\(model\.get_input_embeddings\(\)\.weight\[{tokenizer.pad_token_id}\]"):
        predict(model, tokenizer, ["a gorgeous, witty film", "dull"], batch_size=2)


# ------------------------------------------------ train_causal_lm(model, tokenizer(texts))


@pytest.fixture(scope="module")
def gpt2_and_tokenizer():
    from bcos_plugins.data import shipped_data

    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=4, n_positions=64)
    return bcosify(T.GPT2LMHeadModel(config), b=1.5, verbose=False), tokenizer


@pytest.mark.parametrize("where", ["train_dataset", "eval_dataset"])
def test_train_causal_lm_names_the_tokenizers_output_and_the_fix(gpt2_and_tokenizer, tmp_path, where):
    """``train_causal_lm(model, tokenizer(texts))`` said "feature 0 has no 'input_ids' (keys: Encoding). Tokenise
    first": the examples were tokenised, but given as the tokenizer's one output (a list per key)."""
    from bcos_plugins import train_causal_lm

    model, tokenizer = gpt2_and_tokenizer
    texts = ["a gorgeous, witty film", "dull and long"]
    examples = [{"input_ids": tokenizer(text)["input_ids"]} for text in texts]
    data = {"train_dataset": examples, "eval_dataset": None, where: tokenizer(texts)}
    with pytest.raises(BcosTypeError, match=rf"{where}: is the tokenizer's output, a BatchEncoding \(keys "
                                            r"\['input_ids', 'attention_mask'\]\): iterating it gives its keys, not "
                                            r"examples.*Dataset\.from_dict\(dict\(enc\)\)"):
        train_causal_lm(model, data["train_dataset"], str(tmp_path), pad_token_id=tokenizer.eos_token_id,
                        eval_dataset=data["eval_dataset"], max_steps=1)


def test_train_causal_lm_names_a_dataset_dict_by_its_splits(gpt2_and_tokenizer, tmp_path):
    from bcos_plugins import train_causal_lm

    model, tokenizer = gpt2_and_tokenizer
    splits = {"train": [{"input_ids": [1, 2, 3]}], "test": [{"input_ids": [4, 5, 6]}]}
    with pytest.raises(BcosTypeError, match=r"train_dataset: is a dict \(keys \['train', 'test'\]\): iterating it "
                                            r"gives its keys, not examples. Pass one of its entries \(e\.g\. "
                                            r"train_dataset\['train'\]\)"):
        train_causal_lm(model, splits, str(tmp_path), pad_token_id=tokenizer.eos_token_id, max_steps=1)


# ------------------------------------------------ perturbation_curves: ids on another device than the model


def test_perturbation_curves_refuses_ids_on_another_device_than_the_model(bert):
    """The model on an accelerator, the explained ids left on the CPU: the first forward failed inside the model
    (torch's "Expected all tensors to be on the same device"; on the meta device, which stands in for an accelerator
    here, "Tensor.item() cannot be called on meta tensors"), naming neither the argument nor the move. The check is
    explain's own (attribution.text.refuse_inputs_on_another_device)."""
    import copy

    from bcos_plugins.metrics import perturbation_curves

    explanation = explain(bert, IDS, MASK)
    special = torch.zeros_like(IDS, dtype=torch.bool)
    perturbation_curves(bert, IDS, MASK, explanation, special_tokens=special)  # the same call, one device: runs
    elsewhere = copy.deepcopy(bert).to("meta")
    with pytest.raises(BcosValueError, match=r"input_ids: is on cpu, but the model's input embeddings are on meta.*"
                                             r"input_ids\.to\(model\.device\)"):
        perturbation_curves(elsewhere, IDS, MASK, explanation, special_tokens=special)
