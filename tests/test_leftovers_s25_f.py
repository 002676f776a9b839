"""Newcomer items helper-183 noticed in session 25 (helper-188): 1. BcosLinear / BcosConv2d take ``bias=False`` as the
``nn`` calls they replace do; 2. TokenExplanation.to refuses a device the machine lacks naming ``device``; 3. the demo
says "1 epoch"; 4. train_causal_lm of a GPT-2 gives no "loss_type=None" warning. Each test failed before its change
(the ones named as controls excepted)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosConv2d, BcosLinear

# --------------------------------------------------------------- 1. bias=False carried over from nn.Linear / nn.Conv2d


def test_bcos_linear_takes_bias_false_as_nn_linear_does():
    """``BcosLinear(4, 3, bias=False)`` (copied from an nn.Linear call) failed with Python's "unexpected keyword"."""
    torch.manual_seed(0)
    layer = BcosLinear(4, 3, bias=False)
    torch.manual_seed(0)
    plain = BcosLinear(4, 3)
    assert torch.equal(layer.weight, plain.weight)
    assert list(dict(layer.named_parameters())) == ["weight"]
    x = torch.randn(2, 4)
    assert torch.equal(layer(x), plain(x))


def test_bcos_conv2d_takes_bias_false_as_nn_conv2d_does():
    torch.manual_seed(0)
    layer = BcosConv2d(3, 2, 3, padding=1, bias=False)
    torch.manual_seed(0)
    plain = BcosConv2d(3, 2, 3, padding=1)
    assert torch.equal(layer.weight, plain.weight)
    assert list(dict(layer.named_parameters())) == ["weight"]
    x = torch.randn(1, 3, 5, 5)
    assert torch.equal(layer(x), plain(x))


@pytest.mark.parametrize("build", [lambda bias: BcosLinear(4, 3, bias=bias),
                                   lambda bias: BcosConv2d(3, 2, 3, bias=bias)], ids=["linear", "conv2d"])
def test_bcos_layers_refuse_bias_true_saying_why(build):
    """A bias is a term outside W(x)x: the explanation would no longer sum to the output. A flag that is no Python
    bool is refused by the package's one rule for flags (require_bool; NumPy's bools too, since session 26,
    tests/test_leftovers_s26_small.py)."""
    with pytest.raises(BcosValueError, match=r"^bias: B-cos layers have no bias, got bias=True: a bias adds a term "
                                             r"outside W\(x\)x.*no longer sum to the output\. Pass bias=False"):
        build(True)
    with pytest.raises(BcosTypeError, match=r"^bias: must be True or False, got numpy\.bool np\.True_ \(pass "
                                            r"bool\(bias\)\)\. Pass bias=False or leave it out \(B-cos layers have no "
                                            r"bias\)"):
        build(np.bool_(True))
    with pytest.raises(BcosTypeError, match=r"^bias: must be True or False, got str 'no'\. Pass bias=False"):
        build("no")


# --------------------------------------------------------------- 2. TokenExplanation.to an unavailable device


def _token_explanation():
    from bcos_plugins import TokenExplanation

    scores = torch.ones(2, 3)
    return TokenExplanation(contributions=scores, input_contributions=scores[..., None], explained=scores.sum(1),
                            target=torch.tensor([1, 0]), input_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]))


def test_token_explanation_to_refuses_cuda_on_a_machine_without_it_naming_device(monkeypatch):
    """It raised torch's "Torch not compiled with CUDA enabled" (an AssertionError naming no argument)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    expl = _token_explanation()
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda', which this machine does not have \(available: "
                                             r"cpu\)\. Pass an available device, e.g. 'cpu'\.$"):
        expl.to("cuda")
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda:0', which"):
        expl.to(torch.device("cuda", 0), torch.float64)


def test_token_explanation_to_refuses_a_cuda_index_past_the_machines_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda:3', which this machine does not have \(available: "
                                             r"cpu, cuda:0\)"):
        _token_explanation().to("cuda:3")


def test_token_explanation_to_refuses_a_name_that_is_no_device():
    with pytest.raises(BcosTypeError, match=r"^device: is 'gpu', not a device\. Pass one of \['cpu'"):
        _token_explanation().to("gpu")


def test_token_explanation_to_an_available_device_still_moves_and_casts():
    """Control (passed before too): the device check leaves an available device's move and a cast alone."""
    moved = _token_explanation().to(torch.device("cpu"), torch.float64)
    assert moved.contributions.dtype == torch.float64 and moved.input_ids.dtype == torch.int64
    assert moved.to("cpu").contributions.device.type == "cpu"
    assert moved.to(torch.float32).contributions.dtype == torch.float32


# --------------------------------------------------------------- 3. "1 epochs" in the demo's output


def test_epochs_text_says_one_epoch_in_the_singular():
    from benchmarks.common.settings import epochs_text

    assert [epochs_text(e) for e in (1, 1.0, 2.0, 0.5, 3)] == ["1 epoch", "1 epoch", "2 epochs", "0.5 epochs",
                                                                "3 epochs"]


@pytest.mark.parametrize("script", ["examples/demo_sst2.py", "examples/blimp_mrr.py",
                                    "benchmarks/bench_faithfulness.py"])
def test_scripts_print_their_epochs_through_epochs_text(script):
    """``make demo`` with DEMO_EPOCHS=1 printed "(1 epochs)": each script printed f"{epochs:g} epochs"."""
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / script).read_text()
    assert ":g} epochs" not in source
    assert "epochs_text(" in source


# --------------------------------------------------------------- 4. transformers' "loss_type=None" warning in training


class _Records(__import__("logging").Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("class_name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_train_causal_lm_gives_no_unrecognised_loss_type_warning(tmp_path, class_name):
    """GPT2LMHeadModel's class name holds none of transformers' loss names, so its loss_type was None and its first
    loss (labels passed in training) warned "`loss_type=None` was set in the config but it is unrecognized" (seen in
    examples/inseq_quickstart); the loss it fell back to, ForCausalLMLoss, is the one train_causal_lm sets. Llama
    (loss_type ForCausalLM already) is the control."""
    import logging

    from conftest import tiny_model
    from transformers.utils import logging as hf_logging

    from bcos_plugins import bcosify
    from bcos_plugins.train_decoder import train_causal_lm

    logger = hf_logging.get_logger("transformers.modeling_utils")
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process: a run before hid it
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)
    try:
        model = bcosify(tiny_model(class_name), b=1.1, verbose=False)
        rows = [{"input_ids": [3, 4, 5, 6]}, {"input_ids": [7, 8, 9]}]
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=1, per_device_train_batch_size=2,
                        disable_tqdm=True)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert not [m for m in records.messages if "loss_type" in m]
    # set for the call only (since session 26, tests/test_leftovers_s26_small.py): the model's own value is back
    assert model.loss_type == (None if class_name == "GPT2LMHeadModel" else "ForCausalLM")
