"""One token-batch check (issue 31): ``explain``, Captum's ``EmbeddingForward``, the TransformerLens adapter, the
Space model, ``next_token_contrast`` and ``perturbation_curves`` refuse the same bad token batch with the same
words (one mechanism, ``_checks.require_token_batch``), each naming the argument, the problem and the fix.

Before, each path had its own check: the TransformerLens adapter let a 0/1-violating mask through and called a
float batch "not a tensor of token ids", the Space model and the metrics turned lists into ids and said "is
empty" where ``explain`` said "empty input".
"""

from __future__ import annotations

import re
import warnings
from functools import cache

import pytest
import torch
from bcos_plugins.adapters.captum import EmbeddingForward
from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition
from conftest import tiny_config
from test_cross_path import bcos_model, lens_model

from bcos_plugins import SpaceModelConfig, SpaceModelForSequenceClassification, explain
from bcos_plugins.attribution import resolve_positions
from bcos_plugins.errors import BcosError, BcosTypeError, BcosValueError
from bcos_plugins.metrics import next_token_contrast, perturbation_curves
from bcos_plugins.space import inter_space_loss, intra_space_loss

GPT2 = ("gpt2", 2, 2.0)  # test_cross_path's tiny B-cos GPT-2: vocabulary 40, 16 positions


@cache
def space():
    torch.manual_seed(0)
    return SpaceModelForSequenceClassification(SpaceModelConfig(encoder_config=tiny_config("bert"))).eval()


def _paths(with_space: bool = True):
    model = bcos_model(*GPT2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lens = lens_model(*GPT2)
    paths = {
        "explain": lambda ids, mask: explain(model, ids, mask, target=5),
        "captum EmbeddingForward.embed": lambda ids, mask: EmbeddingForward(model).embed(ids, mask),
        "explain_logits": lambda ids, mask: explain_logits(lens, ids, target=5, attention_mask=mask),
        "token_component_decomposition": lambda ids, mask: token_component_decomposition(lens, ids,
                                                                                         attention_mask=mask),
        "next_token_contrast": lambda ids, mask: next_token_contrast(model, ids, mask, target=5, foil=6),
        "perturbation_curves": lambda ids, mask: perturbation_curves(
            bcos_model("bert", 2, 2.0), ids, mask, torch.zeros(2, 5), special_tokens=torch.zeros(2, 5, dtype=bool)),
    }
    if with_space:
        paths["SpaceModel"] = lambda ids, mask: space()(input_ids=ids, attention_mask=mask)
    return paths


def _ids(batch: int = 2, length: int = 5) -> torch.Tensor:
    return torch.randint(3, 40, (batch, length), generator=torch.Generator().manual_seed(0))


def _refusal(call, ids, mask) -> BcosError:
    with pytest.raises(BcosError) as info:
        call(ids, mask)
    return info.value


# (ids, mask, exception, message once "tokens" (the TransformerLens name) reads "input_ids")
SAME_WORDS = {
    "list": (lambda: _ids().tolist(), lambda: None, BcosTypeError,
             r"input_ids: expected a tensor of token ids \(batch, pos\), got list\. Tokenise with tokenizer\(texts, "
             r"return_tensors='pt'\) \(TransformerLens: model\.to_tokens\(texts\)\)"),
    "float": (lambda: _ids().float(), lambda: None, BcosTypeError,
              r"input_ids: token ids must be integers, got torch\.float32\. Pass the tokenizer's ids "
              r"\(TransformerLens: model\.to_tokens\(text\); .*EmbeddingForward\)"),
    "rank": (lambda: _ids()[0], lambda: None, BcosValueError,
             r"input_ids: expected shape \(batch, pos\), got \(5,\)\. Add a batch dimension with input_ids\[None\] "
             r"for one sequence"),
    "empty": (lambda: _ids()[:0], lambda: None, BcosValueError,
              r"input_ids: empty input of shape \(0, 5\); there is nothing to explain\. Pass at least one sequence "
              r"of at least one token"),
    "mask_shape": (_ids, lambda: torch.ones(2, 4, dtype=torch.long), BcosValueError,
                   r"attention_mask: shape \(2, 4\) differs from input_ids \(2, 5\)\. Pass the mask the tokenizer "
                   r"returned with the ids \(one 0/1 entry per token\)"),
    "mask_list": (_ids, lambda: [[1] * 5] * 2, BcosTypeError,
                  r"attention_mask: expected a tensor, got list\. Pass the mask the tokenizer returned with the ids"),
    "mask_values": (_ids, lambda: torch.full((2, 5), 2), BcosValueError,
                    r"attention_mask: must hold 0 \(padding\) and 1 \(real token\) only, got \[2\]\. Pass a boolean "
                    r"tensor or one of 0s and 1s"),
    "empty_row": (_ids, lambda: torch.tensor([[1] * 5, [0] * 5]), BcosValueError,
                  r"attention_mask: row\(s\) \[1\] have no real token \(all zeros\); there is nothing to attribute "
                  r"to\. Remove empty rows from the batch"),
}


@pytest.mark.parametrize("case", list(SAME_WORDS))
def test_every_token_path_refuses_a_bad_batch_with_the_same_words(case):
    make_ids, make_mask, kind, words = SAME_WORDS[case]
    messages = {}
    for path, call in _paths().items():
        error = _refusal(call, make_ids(), make_mask())
        assert type(error) is kind, (path, error)
        messages[path] = re.sub(r"\btokens\b", "input_ids", str(error))
    assert len(set(messages.values())) == 1, messages
    assert re.fullmatch(words + r"\.?", next(iter(messages.values()))), messages


def test_ids_outside_the_vocabulary_and_beyond_the_position_table_are_named_alike():
    for path, call in _paths(with_space=False).items():  # the Space encoder has another vocabulary
        if path == "perturbation_curves":  # takes any callable, so it knows no vocabulary or position table
            continue
        name = "tokens" if path in ("explain_logits", "token_component_decomposition") else "input_ids"
        ids = _ids()
        ids[1, 2] = 40
        with pytest.raises(BcosValueError, match=rf"^{name}: has ids outside the vocabulary \[0, 40\) at row \[1\]: "
                                                 r"\[40\]\. Tokenise with the model's own tokenizer"):
            call(ids, None)
        limit = r"cfg\.n_ctx" if name == "tokens" else r"config\.n_positions"  # where each model keeps it
        with pytest.raises(BcosValueError, match=rf"^{name}: has 17 positions but the model has only 16 \({limit}, "
                                                 r"its position table\)\. Truncate the inputs to 16 tokens \(tokenizer\(\.\.\., "
                                                 rf"truncation=True, max_length=16\), or {name}\[:, -16:\]\)"):
            call(_ids(length=17), None)


def test_the_checked_batch_reaches_the_model_as_int64():
    model = bcos_model(*GPT2)
    ids, mask = _ids(), torch.ones(2, 5, dtype=torch.bool)
    reference = explain(model, ids, mask.long(), target=5)
    for dtype in (torch.uint8, torch.int32):
        torch.testing.assert_close(explain(model, ids.to(dtype), mask, target=5).contributions, reference.contributions)


def test_mask_only_checks_use_the_same_words():
    # resolve_positions (every path's positions) and the Space losses check a mask on its own: same words
    empty_row = torch.tensor([[1, 1, 0], [0, 0, 0]])
    concepts, labels = torch.rand(2, 3, 2, 4), torch.tensor([0, 1])
    words = (r"^attention_mask: row\(s\) \[1\] have no real token \(all zeros\); there is nothing to attribute to\. "
             r"Remove empty rows from the batch\.$")
    for call in (lambda: resolve_positions(None, empty_row), lambda: inter_space_loss(concepts, labels, empty_row),
                 lambda: intra_space_loss(concepts, empty_row)):
        with pytest.raises(BcosValueError, match=words):
            call()
    with pytest.raises(BcosValueError, match=r"^attention_mask: shape \(2, 2\) differs from concepts \(2, 3\)\. Pass "
                                             r"the mask the tokenizer returned with the ids \(one 0/1 entry per token\)"):
        inter_space_loss(concepts, labels, torch.ones(2, 2))
    with pytest.raises(BcosValueError, match=r"^attention_mask: must hold 0 \(padding\) and 1 \(real token\) only"):
        intra_space_loss(concepts, torch.full((2, 3), 0.5))
