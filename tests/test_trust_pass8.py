"""Eighth trust pass: the same valid model and input called from unusual contexts (``torch.no_grad()``,
``torch.inference_mode()``, autocast, a float64 default dtype, deterministic algorithms; models in half precision,
left in training mode, with gradient checkpointing, compiled; inputs non-contiguous, int32, on the meta device;
the same input twice, after an exception mid-call), each checked against the same call in a plain context or the
model's own logits. The cases that crashed unhelpfully, one test each."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import VOCAB, padded_batch, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bcos(name: str):
    return bcosify(tiny_model(name), b=1.25, verbose=False)


# ------------------------------------------------------------------ torch.inference_mode()


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForCausalLM"])
def test_layer_bcos_under_inference_mode_gives_the_plain_calls_attributions(name):
    """``explain`` and ``BcosAttribution`` lift the caller's inference_mode; LayerBcos did not: RuntimeError
    'Inference tensors cannot be saved for backward' (BERT) or 'element 0 of tensors does not require grad'
    (Llama), also for ids and masks made inside the block."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model = _bcos(name)
    ids, mask = padded_batch(side="right" if name.startswith("Bert") else "left")
    target = torch.tensor([0, 1, 2]) if name.startswith("Bert") else torch.tensor([5, 7, 9])
    plain, plain_delta = captum.LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask,),
                                                           return_convergence_delta=True)
    with torch.inference_mode():
        inside, delta = captum.LayerBcos(model).attribute(ids.clone(), target=target,
                                                          additional_forward_args=(mask.clone(),),
                                                          return_convergence_delta=True)
    torch.testing.assert_close(inside, plain, rtol=0, atol=0)
    torch.testing.assert_close(delta, plain_delta, rtol=0, atol=0)
    # the attributions are the explanation: they sum to the explained logits
    expl = explain(model, ids, mask, target=target)
    torch.testing.assert_close(inside.sum(-1), expl.contributions, rtol=1e-4, atol=1e-6)


def test_llm_gradient_attribution_with_layer_bcos_runs_under_inference_mode():
    """Captum's LLM workflow over LayerBcos crashed under inference_mode as LayerBcos did."""
    pytest.importorskip("bcos_plugins.adapters.captum")
    from bcos_plugins.adapters.captum import LayerBcos
    from captum.attr import LLMGradientAttribution, TextTokenInput
    from test_conformance import _word_tokenizer

    model, tokenizer = _bcos("GPT2LMHeadModel"), _word_tokenizer()
    prompt = TextTokenInput("w3 w4 w5 w6", tokenizer)
    plain = LLMGradientAttribution(LayerBcos(model), tokenizer).attribute(prompt, target="w7 w8")
    with torch.inference_mode():
        inside = LLMGradientAttribution(LayerBcos(model), tokenizer).attribute(prompt, target="w7 w8")
    torch.testing.assert_close(inside.token_attr, plain.token_attr, rtol=0, atol=0)


@pytest.mark.parametrize("entry", ["explain_logits", "token_component_decomposition"])
def test_lens_explanations_under_inference_mode_are_the_plain_ones(entry):
    """TransformerLens' explain_logits and token_component_decomposition made their positions (and checked tokens)
    under the caller's inference_mode and indexed the logits with them inside the recorded graph: RuntimeError
    'Inference tensors cannot be saved for backward'."""
    lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    from conftest import hooked_transformer_from_hf_or_none

    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:
        return
    model = from_hf(_bcos("GPT2LMHeadModel"))
    explain_at = getattr(lens, entry)
    tokens = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    plain = explain_at(model, tokens, target=5)
    with torch.inference_mode():
        inside = explain_at(model, tokens, target=5)
        made_inside = explain_at(model, tokens.clone(), target=5, attention_mask=torch.ones(2, 6, dtype=torch.long))
    for got in (inside, made_inside):
        for field in ("contributions", "table") if entry == "token_component_decomposition" else ("contributions",):
            if hasattr(plain, field):
                torch.testing.assert_close(getattr(got, field), getattr(plain, field), rtol=0, atol=0)
        torch.testing.assert_close(got.explained, plain.explained, rtol=0, atol=0)
    with torch.no_grad():
        logits = model(tokens)[:, -1, 5]
    torch.testing.assert_close(plain.explained, logits, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ tensors on the meta device


@pytest.mark.parametrize("argument", ["input_ids", "attention_mask"])
def test_token_ids_or_a_mask_on_the_meta_device_are_refused_naming_them(argument):
    """Ids or a mask on the meta device (a shape without values) failed inside the token check with
    NotImplementedError 'Cannot copy out of meta tensor; no data!'."""
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    given = {"input_ids": ids, "attention_mask": mask}
    given[argument] = given[argument].to("meta")
    with pytest.raises(BcosValueError, match=rf"^{argument}: is on the meta device \(a shape without values\).*"
                                             r"Pass the real tensor"):
        explain(model, given["input_ids"], given["attention_mask"])


# ------------------------------------------------------------------ targets made under torch.inference_mode()


def test_targets_foils_and_directions_made_under_inference_mode_are_explained():
    """A target tensor made under inference_mode (explain_dataset makes one per batch) was gathered inside the
    recorded graph: RuntimeError 'Inference tensors cannot be saved for backward', from explain and from
    explain_dataset called under inference_mode."""
    from bcos_plugins.attribution import Direction

    model = _bcos("GPT2LMHeadModel")
    ids, mask = padded_batch(side="left")
    target, foil, vector = torch.tensor([5, 7, 9]), torch.tensor([6, 8, 10]), torch.linspace(-1, 1, VOCAB)
    plain = explain(model, ids, mask, target=target, foil=foil)
    plain_direction = explain(model, ids, mask, target=Direction(vector))
    with torch.inference_mode():
        inside = explain(model, ids, mask, target=target.clone(), foil=foil.clone())
        direction = explain(model, ids, mask, target=Direction(vector.clone()))
        made_inside = target.clone()
    torch.testing.assert_close(inside.contributions, plain.contributions, rtol=0, atol=0)
    torch.testing.assert_close(direction.contributions, plain_direction.contributions, rtol=0, atol=0)
    torch.testing.assert_close(explain(model, ids, mask, target=made_inside, foil=foil).contributions,
                               plain.contributions, rtol=0, atol=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0)).logits[:, -1]
    torch.testing.assert_close(plain.explained, logits[torch.arange(3), target] - logits[torch.arange(3), foil],
                               rtol=1e-5, atol=1e-6)


def test_explain_dataset_runs_under_inference_mode():
    pytest.importorskip("datasets")
    from test_conformance import _word_tokenizer

    from bcos_plugins import explain_dataset

    model, tokenizer = _bcos("BertForSequenceClassification"), _word_tokenizer()
    texts = ["w3 w4 w5 w6 w7", "w8 w9 w10", "w11 w12 w13 w14"]
    plain = explain_dataset(model, tokenizer, texts, target=1)["scores"]
    with torch.inference_mode():
        inside = explain_dataset(model, tokenizer, texts, target=1)["scores"]
    assert inside == plain


@pytest.mark.parametrize("method", ["BcosAttribution", "LayerBcos"])
def test_captum_targets_made_under_inference_mode_are_attributed(method):
    """Captum's own gather of the target saved an inference tensor for backward: RuntimeError."""
    captum = pytest.importorskip("bcos_plugins.adapters.captum")
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    target = torch.tensor([0, 1, 2])
    if method == "BcosAttribution":
        forward = captum.EmbeddingForward(model)
        inputs, attribution = forward.embed(ids, mask), captum.BcosAttribution(forward)
    else:
        inputs, attribution = ids, captum.LayerBcos(model)
    plain = attribution.attribute(inputs, target=target, additional_forward_args=(mask,))
    with torch.inference_mode():
        inside = attribution.attribute(inputs, target=target.clone(), additional_forward_args=(mask,))
    torch.testing.assert_close(inside, plain, rtol=0, atol=0)


# ------------------------------------------------------------------ a model left in training mode


def test_perturbation_curves_of_a_model_left_in_training_mode_are_its_eval_mode_curves():
    """perturbation_curves ran the model in the mode it was left in: after training (model.train()) every
    perturbed row was scored with dropout on, and the curves were random (off by 2x on this model), silently. The
    decoder metrics and SeqPG switch to eval mode; so does it now, and gives the training flag back."""
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    target = torch.tensor([0, 1, 2])
    scores = explain(model, ids, mask, target=target).contributions
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    evaluated = perturbation_curves(model, ids, mask, scores, target=target, special_tokens=special)
    model.train()
    trained = perturbation_curves(model, ids, mask, scores, target=target, special_tokens=special)
    assert model.training
    torch.testing.assert_close(trained.comprehensiveness, evaluated.comprehensiveness, rtol=0, atol=0)
    torch.testing.assert_close(trained.sufficiency, evaluated.sufficiency, rtol=0, atol=0)
    torch.testing.assert_close(trained.full_probability, evaluated.full_probability, rtol=0, atol=0)


# ------------------------------------------------------------------ a wrapped model


def test_a_data_parallel_wrapper_is_refused_naming_the_wrapped_model():
    """explain(nn.DataParallel(model)) was refused with 'Pass one of the transformers classes BertForMaskedLM, ...',
    though the wrapped model is one of them: the fix is to pass model.module."""
    from bcos_plugins.convert.architectures import UnsupportedModuleError

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    with pytest.raises(UnsupportedModuleError, match=r"^model: torch\.nn\.parallel\.data_parallel\.DataParallel is a "
                                                     r"wrapper around \w*BertForSequenceClassification, .*"
                                                     r"Pass the wrapped model itself \(model\.module\)"):
        explain(torch.nn.DataParallel(model), ids, mask)
    explain(torch.nn.DataParallel(model).module, ids, mask)  # the wrapped model itself is explained
