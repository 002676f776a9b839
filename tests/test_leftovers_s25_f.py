"""Newcomer items helper-183 noticed in session 25 (helper-188): BcosLinear / BcosConv2d take ``bias=False`` as the
``nn`` calls they replace do. Each test failed before its change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosConv2d, BcosLinear

# --------------------------------------------------------------- 1. bias=False carried over from nn.Linear / nn.Conv2d


@pytest.mark.parametrize("bias", [False, np.bool_(False)])
def test_bcos_linear_takes_bias_false_as_nn_linear_does(bias):
    """``BcosLinear(4, 3, bias=False)`` (copied from an nn.Linear call) failed with Python's "unexpected keyword"."""
    torch.manual_seed(0)
    layer = BcosLinear(4, 3, bias=bias)
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
    """A bias is a term outside W(x)x: the explanation would no longer sum to the output."""
    with pytest.raises(BcosValueError, match=r"^bias: B-cos layers have no bias, got bias=True: a bias adds a term "
                                             r"outside W\(x\)x.*no longer sum to the output\. Pass bias=False"):
        build(True)
    with pytest.raises(BcosValueError, match=r"^bias: B-cos layers have no bias"):
        build(np.bool_(True))
    with pytest.raises(BcosTypeError, match=r"^bias: must be False \(B-cos layers have no bias\), got 'no'"):
        build("no")
