"""What session 25's finished helpers noticed and left (helper-186): the causal-LM collator refuses token_type_ids it
would drop while a model reads them; aopc refuses fractions outside [0, 1]; top_k_iou and average_precision keep
float64; PixelPerturbation names a contrastive explanation's foil; perturbation_curves' docstring names every refusal
of left padding; predict_labels warns of the texts it cuts; fine_tune_classifier refuses a plateau schedule it cannot
step; adversarial_masks' docstring says what an augmented layer's masks hold. Each test failed before its change."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from test_leftovers_s24_f import _bcos_bert, _minilm_tokenizer, texts_cut_at

from bcos_plugins.errors import BcosValueError
from bcos_plugins.train_decoder import CausalLMCollator

# --------------------------------------------------------------- 1. the collator's dropped token_type_ids


def test_causal_lm_collator_refuses_token_type_ids_it_would_drop():
    """GPT-2 adds the embedding of token_type_ids: the batch, which has none, changed the model's input silently."""
    collator = CausalLMCollator(pad_token_id=0)
    features = [{"input_ids": [5, 6, 7], "token_type_ids": [0, 1, 1]}, {"input_ids": [5, 6]}]
    with pytest.raises(BcosValueError, match=r"(?s)feature 0 has 'token_type_ids'.*Drop the token_type_ids"):
        collator(features)


def test_causal_lm_collator_drops_all_zero_token_type_ids_silently():
    """Type 0 everywhere is the model's default: the batch is the one without them."""
    collator = CausalLMCollator(pad_token_id=0)
    plain = collator([{"input_ids": [5, 6, 7]}, {"input_ids": [5, 6]}])
    typed = collator([{"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 0]},
                      {"input_ids": torch.tensor([5, 6]), "token_type_ids": torch.tensor([0, 0])}])
    assert typed.keys() == plain.keys()
    for key in plain:
        assert torch.equal(typed[key], plain[key]), key
    # a non-zero type past max_length is not in the batch either: nothing the model reads changes
    truncated = CausalLMCollator(pad_token_id=0, max_length=2)
    assert torch.equal(truncated([{"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1]}])["input_ids"],
                       torch.tensor([[5, 6]]))


# --------------------------------------------------------------- 2. aopc's fractions outside [0, 1]


@pytest.mark.parametrize("fractions", [[0.0, 10.0], [-0.5, 0.5], [0.0, 1.5]])
def test_aopc_refuses_fractions_outside_zero_one_naming_the_argument_and_the_range(fractions):
    """The area took any increasing floats: [0, 10] gave an area over a tenfold removal, silently."""
    from bcos_plugins.metrics import aopc

    with pytest.raises(BcosValueError, match=r"^fractions: must be >= 0\.0 and <= 1\.0"):
        aopc(torch.ones(1, 2), fractions)
    assert aopc(torch.ones(1, 2), [0.0, 1.0]).item() == 1.0  # the ends of the range are fractions


def test_pixel_perturbation_refuses_fractions_outside_zero_one_by_the_same_check():
    from bcos_plugins.metrics import pixel_perturbation

    with pytest.raises(BcosValueError, match=r"^fractions: must be >= 0\.0 and <= 1\.0"):
        pixel_perturbation(lambda x: x.flatten(1)[:, :2], torch.rand(1, 3, 2, 2), torch.rand(1, 2, 2), 0,
                           fractions=[0.0, 1.5])


# --------------------------------------------------------------- 3. the rationale metrics' dtype


@pytest.mark.parametrize("dtype, expected", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                             (torch.bfloat16, torch.float32), (torch.int64, torch.float64)])
def test_top_k_iou_and_average_precision_return_the_scores_float_dtype(dtype, expected):
    """float64 scores gave float32 values, where aopc and reciprocal_rank keep float64 (the metrics' ranking dtype:
    at least float32, float64 for integer scores)."""
    from bcos_plugins.metrics import average_precision, top_k_iou

    scores = torch.tensor([[3, 1, 2, 0], [0, 2, 1, 3]]).to(dtype)
    gold = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    iou, ap = top_k_iou(scores, gold), average_precision(scores, gold)
    assert iou.dtype == expected and ap.dtype == expected
    # the values are the same in every dtype: row 0 ranks its gold tokens first; row 1's top 2 are positions 3 (gold)
    # and 1 (not), its second gold token comes third (precision 2/3 there)
    assert iou.tolist() == pytest.approx([1.0, 1 / 3], rel=1e-7)
    assert ap.tolist() == pytest.approx([1.0, (1 + 2 / 3) / 2], rel=1e-7)
    if expected == torch.float64:  # float64's own rounding, not float32's
        assert iou[1].item() == 1 / 3 and ap[1].item() == (1 + 2 / 3) / 2


# --------------------------------------------------------------- 4. PixelPerturbation says whether it scored a contrast


def test_pixel_perturbation_result_names_the_foil_of_a_contrastive_explanation():
    """Its curves track the target's score minus the foil's (0820b1a), but the result did not say so, where
    PerturbationCurves has ``foil``: a reader could not tell a contrast's curves from a class's."""
    from conftest import TINY_VIT_SHAPE

    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()
    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    target, foil = torch.tensor([0, 3]), torch.tensor([1, 2])
    encoded = model.encode(images)

    def forward(e):
        return model(encoded_pixel_values=e).logits

    fractions = (0.0, 0.25)
    contrast = pixel_perturbation(forward, encoded, explain_image(model, images, target=target, foil=foil), target,
                                  fractions=fractions, score="logit")
    assert contrast.foil is not None and contrast.foil.tolist() == [1, 2]
    plain = pixel_perturbation(forward, encoded, explain_image(model, images, target=target), target,
                               fractions=fractions, score="logit")
    assert plain.foil is None


# --------------------------------------------------------------- 5. perturbation_curves' docstring on left padding


def test_perturbation_curves_docstring_names_the_refusal_of_left_padding_for_unknown_classifiers():
    """f646a66 refuses left padding for a sequence classifier outside the registry not known to read the last token
    (tests/test_leftovers_s25_c.py); the docstring still named only models with a learned position table."""
    from bcos_plugins.metrics import perturbation_curves

    doc = " ".join(perturbation_curves.__doc__.split())
    assert "sequence classifier not known to classify from the last token (ELECTRA's reads the first column)" in doc
    assert "also with the caller's own ``position_ids``" in doc
    assert "reads a learned position table" in doc  # the older refusal is still named


# --------------------------------------------------------------- 6. predict_labels warns of the texts it cuts


def test_predict_labels_warns_of_truncated_texts_once_per_call_as_predict_does():
    """A text past max_length (128 by default) was classified from its first tokens without a word, where predict
    warns (corpus.warn_of_truncated_texts); zero_shot_evaluation's warning names zero_shot_evaluation."""
    from bcos_plugins.space.zero_shot import predict_labels, zero_shot_evaluation

    tokenizer = _minilm_tokenizer(with_mask=True)
    model = _bcos_bert(len(tokenizer))
    texts, expected = texts_cut_at(tokenizer, "predict_labels", 12, words=(20, 15))  # 22 and 17 tokens
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # two batches, each with a cut text: one warning for the call, naming both by their index in texts
        predictions = predict_labels(model, tokenizer, texts, batch_size=2, max_length=12)
    cut = [w for w in caught if "max_length=12" in str(w.message)]
    assert len(cut) == 1 and issubclass(cut[0].category, UserWarning)
    assert re.search(expected, str(cut[0].message))
    assert cut[0].filename == __file__  # at the caller's line
    with pytest.warns(UserWarning, match=expected.replace("predict_labels:", "zero_shot_evaluation:", 1)):
        zero_shot_evaluation(model, tokenizer, texts, predictions, batch_size=2, max_length=12)
    # the texts kept whole (max_length=22): no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        predict_labels(model, tokenizer, texts, batch_size=2, max_length=22)


# --------------------------------------------------------------- 7. a plateau schedule without evaluation data


@pytest.mark.parametrize("scheduler", ["reduce_lr_on_plateau", "SchedulerType.REDUCE_ON_PLATEAU"])
def test_fine_tune_classifier_refuses_a_plateau_schedule_naming_the_keyword_and_the_missing_evaluation(scheduler):
    """transformers failed with "lr_scheduler_type reduce_lr_on_plateau requires an eval strategy", naming neither
    the helper nor that it takes no evaluation data."""
    from transformers import SchedulerType

    from bcos_plugins.fine_tuning import fine_tune_classifier

    value = SchedulerType.REDUCE_ON_PLATEAU if scheduler.startswith("SchedulerType") else scheduler
    tokenizer = _minilm_tokenizer(with_mask=True)
    model = _bcos_bert(len(tokenizer))
    with pytest.raises(BcosValueError, match=r"^lr_scheduler_type: is .*fine_tune_classifier takes no evaluation data"
                       r".*Pick a schedule by step"):
        fine_tune_classifier(model, tokenizer, ["a b", "c d"], [0, 1], lr_scheduler_type=value, progress=False)


# --------------------------------------------------------------- 8. adversarial_masks of an augmented layer


def test_adversarial_masks_docstring_says_an_augmented_layers_masks_include_the_constant_coordinate():
    """The masks of an augmented layer have d_in + 1 entries, the last on the constant [x, 1] coordinate that no input
    moves, and the docstring did not say so (nor what adding m[:-1] to x does). The shift it states is checked here."""
    from bcos_plugins.bilinear import (
        BilinearMLP,
        adversarial_masks,
        augment_input,
        bilinear_weights,
        eigendecompose,
    )

    doc = " ".join(adversarial_masks.__doc__.split())
    assert "the last one on the constant ``[x, 1]`` coordinate, which no input moves" in doc
    assert "``alpha * (delta_ij - m_i[-1] * v_j[-1])``" in doc

    torch.manual_seed(0)
    d_in = 6
    layer = BilinearMLP(d_in, 8, 3, bias=True).double()
    eig = eigendecompose(bilinear_weights(layer).augmented(), torch.eye(3, dtype=torch.float64))
    result = adversarial_masks(eig)
    assert result.masks.shape == (3, 1, d_in + 1)
    masks, vectors = result.masks[:, 0], result.eigenvectors[:, 0]
    x, alpha = torch.randn(d_in, dtype=torch.float64), 0.7
    for i in range(3):
        shift = augment_input(x + alpha * masks[i, :-1]) @ vectors.T - augment_input(x) @ vectors.T
        promised = alpha * (torch.eye(3, dtype=torch.float64)[i] - masks[i, -1] * vectors[:, -1])
        torch.testing.assert_close(shift, promised, rtol=1e-9, atol=1e-9)
