"""Explanations and metrics leave every module in the training mode it had (``nn.dynamic.evaluating``).

They switch a model to eval mode while they run (dropout would make the explained function random). Restoring it
with ``model.train(was_training)`` set every submodule to the model's own flag, so a module a training loop keeps in
eval mode (a frozen encoder, a normalisation layer with fixed statistics) came back training after an ``explain``
call in the loop, silently changing what the loop computes; and a model kept in eval mode with one submodule
training lost that submodule's mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import padded_batch, tiny_model
from test_conformance import _word_tokenizer

from bcos_plugins import bcosify, explain
from bcos_plugins.nn import explanation_mode
from bcos_plugins.nn.dynamic import evaluating
from bcos_plugins.prediction import predict


def _flags(model):
    return {name: module.training for name, module in model.named_modules()}


def _mixed(model, top_training: bool):
    """``model`` in ``top_training`` mode with its first child in the other mode."""
    model.train(top_training)
    next(model.children()).train(not top_training)
    return _flags(model)


def _classifier():
    return bcosify(tiny_model("BertForSequenceClassification"), verbose=False)


def _causal_lm():
    return bcosify(tiny_model("GPT2LMHeadModel"), verbose=False)


def _explain(model):
    ids, mask = padded_batch()
    explain(model, ids, mask, target=0)


def _explanation_mode(model):
    with explanation_mode(model):
        assert not any(m.training for m in model.modules())


def _evaluating_raising(model):
    with pytest.raises(KeyError), evaluating(model):
        assert not any(m.training for m in model.modules())
        raise KeyError("inside the block")


def _captum(model):
    from bcos_plugins.adapters.captum import LayerBcos

    ids, mask = padded_batch()
    LayerBcos(model).attribute(ids, target=0, additional_forward_args=(mask,))


def _predict(model):
    predict(model, _word_tokenizer(), ["w3 w4 w5", "w6 w7"])


def _perplexity(model):
    from bcos_plugins.metrics import perplexity

    perplexity(model, [[3, 4, 5, 6, 7]], max_length=8)


def _next_token_contrast(model):
    from bcos_plugins.metrics import next_token_contrast

    ids, mask = padded_batch()
    next_token_contrast(model, ids, mask, target=torch.tensor([3, 4, 5]), foil=torch.tensor([6, 7, 8]))


CALLS = [(_explain, _classifier), (_explanation_mode, _classifier), (_evaluating_raising, _classifier),
         (_captum, _classifier), (_predict, _classifier), (_perplexity, _causal_lm),
         (_next_token_contrast, _causal_lm), (_explain, _causal_lm)]


@pytest.mark.parametrize("top_training", [True, False])
@pytest.mark.parametrize(("call", "make"), CALLS, ids=[f"{c.__name__[1:]}-{m.__name__[1:]}" for c, m in CALLS])
def test_every_modules_training_flag_is_restored(call, make, top_training):
    model = make()
    before = _mixed(model, top_training)
    call(model)
    assert _flags(model) == before


def test_a_model_wholly_in_eval_mode_is_not_switched():
    """(eval() and train() walk the whole model: a model already in eval mode, every call after the first, needs
    neither.)"""
    model = _classifier().eval()
    calls = []
    model.train = lambda mode=True: calls.append(mode)  # noqa: ARG005
    with evaluating(model), explanation_mode(model):
        pass
    assert calls == []


def test_the_package_switches_models_to_eval_mode_in_one_place():
    """``model.train(was_training)`` restores the model's own flag only: every explanation and metric goes through
    ``evaluating`` (or ``explanation_mode``, which does the same), and no other module restores a flag by hand."""
    root = Path(__file__).resolve().parents[1]
    offenders = [str(path.relative_to(root)) for folder in ("bcos_plugins", "adapters")
                 for path in (root / folder).rglob("*.py")
                 if ".train(was_training)" in path.read_text() and path.name != "dynamic.py"]
    assert offenders == []
