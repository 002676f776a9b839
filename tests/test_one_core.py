"""One explanation core (issue 31): every public explanation path runs the attribution core's target / foil
resolution (``resolve_explained``) and its input x gradient step (``input_x_gradient``), none a copy, so the
same model, input and target give the same answer on every path.

- each entry point is called with the core's functions wrapped in a counter, in the module that calls them: a
  path that stopped calling them (a copy of the mechanism) fails here;
- the source of ``bcos_plugins/`` and ``adapters/`` parses targets and foils (``parse_ids(..., "target")``)
  only inside the attribution core;
- for one tiny B-cos GPT-2, one padded batch and the top next token as the target, ``explain``,
  Captum's ``BcosAttribution`` and ``LayerBcos``, inseq's "bcos" and TransformerLens' ``explain_logits`` give
  the same contributions; ``explain_image`` and Captum on the encoded image give identical ones;
- the metrics take every result type (text, image, Space, TransformerLens) and agree with its own
  ``completeness_error``.

The property-based comparison over random models, paddings, targets, foils and positions is
tests/test_cross_path.py; the one reading of a model's position limit, walked through every caller per family
kind, is tests/test_position_limit.py.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest
import torch
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition
from conftest import TINY_VIT_SHAPE, tiny_config
from test_cross_path import bcos_model, captum_paths, inseq_path, lens_model

from bcos_plugins import SpaceModelConfig, SpaceModelForSequenceClassification, context_attribution, explain
from bcos_plugins.attribution import Explanation, input_x_gradient, resolve_explained
from bcos_plugins.metrics import completeness_error, token_scores
from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (2, 2.0)  # heads, B of test_cross_path's tiny models


def _batch():
    ids = torch.tensor([[5, 9, 14, 22, 7], [0, 0, 31, 8, 19]])
    mask = (ids != 0).long()
    return ids, mask


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()


@pytest.fixture(scope="module")
def space():
    torch.manual_seed(0)
    return SpaceModelForSequenceClassification(SpaceModelConfig(encoder_config=tiny_config("bert"))).eval()


def _entry_points(vit, space):
    """(module that resolves the target, calls input x gradient, a call of its public entry point)."""
    ids, mask = _batch()
    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    return [
        ("bcos_plugins.explain", True, lambda: explain(bcos_model("gpt2", *CONFIG), ids, mask, target=7, foil=9)),
        ("bcos_plugins.vision.explain", True, lambda: explain_image(vit, images, target=1)),
        ("bcos_plugins.space.attribution", False, lambda: context_attribution(space, ids + 3, mask, foil=0)),
        ("bcos_plugins.adapters._lens.explain", True,
         lambda: explain_logits(lens_model("gpt2", *CONFIG), ids, attention_mask=mask, target=7)),
        ("bcos_plugins.adapters._lens.components", False,
         lambda: token_component_decomposition(lens_model("gpt2", *CONFIG), ids, attention_mask=mask)),
    ]


def test_every_entry_point_runs_the_cores_target_resolution_and_gradient_step(monkeypatch, vit, space):
    for module_name, takes_gradient, call in _entry_points(vit, space):
        module = importlib.import_module(module_name)
        calls = {"resolve_explained": 0, "input_x_gradient": 0}

        def counted(name, function, calls=calls):
            def wrapper(*args, **kwargs):
                calls[name] += 1
                return function(*args, **kwargs)
            return wrapper

        with monkeypatch.context() as patch:
            assert module.resolve_explained is resolve_explained, module_name  # the core's, not a copy
            patch.setattr(module, "resolve_explained", counted("resolve_explained", resolve_explained))
            if takes_gradient:
                assert module.input_x_gradient is input_x_gradient, module_name
                patch.setattr(module, "input_x_gradient", counted("input_x_gradient", input_x_gradient))
            call()
        assert calls["resolve_explained"] == 1, (module_name, calls)
        assert calls["input_x_gradient"] == (1 if takes_gradient else 0), (module_name, calls)


def test_targets_and_foils_are_parsed_only_in_the_attribution_core():
    copies = []
    for folder in ("bcos_plugins", "adapters"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent == ROOT / "bcos_plugins" / "attribution":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                # parsing a target or a foil by hand (reading the explained value with select_explained from
                # targets resolve_explained returned is reuse, not a copy)
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) \
                        == "parse_ids":
                    names = {a.value for a in node.args if isinstance(a, ast.Constant)}
                    if names & {"target", "foil"}:
                        copies.append(f"{path.relative_to(ROOT)}:{node.lineno} parses {sorted(names)}")
    assert not copies, "resolve targets with bcos_plugins.attribution.resolve_explained:\n" + "\n".join(copies)


def test_every_text_path_gives_the_same_contributions_for_the_same_target():
    model = bcos_model("gpt2", *CONFIG)
    ids, mask = _batch()
    with torch.no_grad():  # the top next token at each row's last real token (the last column: left padding)
        top = model(input_ids=ids, attention_mask=mask,
                    position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits[:, -1].argmax(-1)
    ref = explain(model, ids, mask, target=top)

    fwd = EmbeddingForward(model)
    captum = BcosAttribution(fwd).attribute(fwd.embed(ids, mask), target=ref.target, additional_forward_args=(mask,))
    assert torch.equal(captum, ref.input_contributions)  # the same forward pass: identical, not just close

    scale = ref.contributions.abs().max().item()
    for name, contributions, explained in captum_paths(model, ids, mask, ref.target, None, None):
        torch.testing.assert_close(contributions, ref.contributions, rtol=0, atol=1e-5 * scale, msg=name)
        torch.testing.assert_close(explained, ref.explained, rtol=0, atol=1e-5 * scale, msg=name)
    lens = explain_logits(lens_model("gpt2", *CONFIG), ids, attention_mask=mask)  # default: the top next token
    assert torch.equal(lens.target, top)
    torch.testing.assert_close(lens.contributions, ref.contributions, rtol=0, atol=1e-5 * scale)
    decomposition = token_component_decomposition(lens_model("gpt2", *CONFIG), ids, attention_mask=mask)
    torch.testing.assert_close(decomposition.token_totals, ref.contributions, rtol=0, atol=1e-5 * scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        contributions, explained = inseq_path("gpt2", CONFIG, ids, mask, ref.target, None, ref)
    torch.testing.assert_close(contributions, ref.contributions, rtol=0, atol=1e-5 * scale)


def test_the_image_path_equals_captum_on_the_encoded_image(vit):
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    ref = explain_image(vit, images)  # target: the predicted class
    encoded = vit.encode(images)
    captum = BcosAttribution(lambda x: vit(encoded_pixel_values=x).logits, model=vit).attribute(encoded,
                                                                                               target=ref.target)
    assert torch.equal(captum, ref.input_contributions)


def test_the_metrics_take_every_result_type(vit, space):
    ids, mask = _batch()
    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(3))
    results = {
        "text": explain(bcos_model("gpt2", *CONFIG), ids, mask, target=7, foil=9),
        "image": explain_image(vit, images),
        "space": context_attribution(space, ids + 3, mask),
        "TransformerLens": explain_logits(lens_model("gpt2", *CONFIG), ids, attention_mask=mask, target=7),
    }
    for name, result in results.items():
        assert isinstance(result, Explanation), name
        torch.testing.assert_close(completeness_error(result, result.explained), result.completeness_error,
                                   msg=name)
        if name != "image":
            torch.testing.assert_close(token_scores(result), result.input_contributions.flatten(2).sum(-1),
                                       msg=name)
