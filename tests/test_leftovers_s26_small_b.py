"""Small items of session 26's trust pass (helper-205):
1. ``completeness_error`` refuses boolean attributions, as every other metric does (one refusal,
   ``metrics.attributions.refuse_boolean_scores``, also the rationale and MRR metrics');
2. docs/hosts/inseq.md says that ``inseq.load_model`` switches the caller's tokenizer to left padding, which a
   BERT-family classifier then refuses, and the fix (the claim is checked here through inseq's own call);
3. the demo's terminal shares show a small non-zero share readably (``+1.2e-05``, not ``+0.000``);
4. ``explanation_entropy``'s docstring says an all-zero row has entropy 0 and how to exclude such rows.
Each test failed before its change, except those named as controls."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
import torch
import transformers as T

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.metrics import completeness_error, explanation_entropy

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------ 1. completeness_error refuses boolean attributions

@pytest.mark.parametrize("as_captum_tuple", [False, True])
def test_completeness_error_refuses_boolean_attributions(as_captum_tuple):
    mask = torch.tensor([[True, False, True], [False, False, True]])
    attributions = (mask,) if as_captum_tuple else mask
    # before: a mask summed as its count of True entries, compared with the explained values, silently
    with pytest.raises(BcosTypeError, match=r"attributions: must be numbers, got a boolean tensor.*float\(\)"):
        completeness_error(attributions, torch.tensor([2.0, 1.0]))


def test_completeness_error_of_float_attributions_unchanged():
    """Control: the mask's float() is read as scores."""
    mask = torch.tensor([[True, False, True], [False, False, True]])
    error = completeness_error(mask.float(), torch.tensor([2.0, 1.0]))
    assert torch.equal(error, torch.zeros(2, dtype=error.dtype))


def test_the_metrics_share_one_boolean_refusal():
    """Control: the rationale and MRR metrics refuse through the same function, with their message of before."""
    from bcos_plugins.metrics import decoder, rationale, summary
    from bcos_plugins.metrics.attributions import refuse_boolean_scores

    for module in (decoder, rationale, summary):
        assert module.refuse_boolean_scores is refuse_boolean_scores
    scores = torch.tensor([[True, False]])
    with pytest.raises(BcosTypeError, match="scores: must be numbers, got a boolean tensor. Pass float token scores"):
        rationale.top_k_iou(scores, torch.tensor([[1, 0]]))


# ------------------------------------------------ 2. inseq.load_model leaves the tokenizer padding on the left

def test_inseq_load_model_leaves_the_tokenizer_left_padded_and_the_docs_say_so(minilm_bcos_bert):
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    from bcos_plugins.adapters.inseq import load_classifier

    from bcos_plugins import bcosify
    from bcos_plugins.pretrained import minilm_path

    bert = minilm_bcos_bert[0]
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())  # its own: the call below changes it
    assert tokenizer.padding_side == "right"
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                          bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    decoder = bcosify(T.GPT2LMHeadModel(config).eval(), b=1.5, verbose=False)
    inseq.load_model(decoder, "bcos", tokenizer=tokenizer)
    assert tokenizer.padding_side == "left"  # inseq's HuggingfaceDecoderOnlyModel sets it, in place
    texts = ["a gorgeous, witty film", "dull"]
    with pytest.raises(BcosValueError, match=r"pads on the left.*Pad on the right \(tokenizer.padding_side = 'right'\)"):
        load_classifier(bert, tokenizer).attribute(texts)
    tokenizer.padding_side = "right"  # the documented fix
    out = load_classifier(bert, tokenizer).attribute(texts)
    assert len(out.sequence_attributions) == 2

    page = " ".join((ROOT / "docs/hosts/inseq.md").read_text().split())
    assert re.search(r"`inseq.load_model` \(any method\) sets the tokenizer it is given to `padding_side = \"left\"`",
                     page)
    assert "load a second tokenizer for the classifier, or set `tokenizer.padding_side = \"right\"` back" in page


# ------------------------------------------------ 3. the demo's terminal shares

def test_demo_terminal_shows_small_non_zero_shares_readably():
    from rich.console import Console

    from examples.demo_sst2 import colour_tokens

    plain = Console(file=StringIO(), no_color=True, width=200)
    plain.print(colour_tokens(["a", "film", "the", "."], torch.tensor([-0.125, 0.5, 1.2e-5, -3e-4]), colour=False))
    # before: the(+0.000) .(-0.000), a share of 1.2e-5 shown as nothing
    assert plain.file.getvalue().strip() == "a(-0.125) film(+0.500) the(+1.2e-05) .(-0.0003)"


def test_one_formatter_for_the_terminal_shares():
    from bcos_plugins.visualize import signed_share_text

    assert [signed_share_text(s) for s in (0.0, 5e-4, 0.412, -2.5e-7)] == ["+0.000", "+0.001", "+0.412", "-2.5e-07"]
    for example in ("examples/demo_sst2.py", "examples/space_sst2.py"):
        source = (ROOT / example).read_text()
        assert "signed_share_text(s)" in source and "s:+.3f}" not in source


# ------------------------------------------------ 4. explanation_entropy of an all-zero row

def test_entropy_docstring_says_an_all_zero_row_is_0_and_how_to_exclude_it():
    doc = " ".join(explanation_entropy.__doc__.split())
    assert "all score exactly 0" in doc and "has entropy 0" in doc
    snippet = re.search(r"``h = explanation_entropy\(scores, mask\); (h\[.*?\]\.mean\(\))``", doc).group(1)
    scores = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    h = explanation_entropy(scores, mask)
    assert float(h[1]) == 0.0  # the documented contract, kept
    kept = eval(snippet, {"h": h, "scores": scores, "mask": mask})  # the docstring's own line, as written
    assert torch.allclose(kept, h[[0, 2]].mean())
