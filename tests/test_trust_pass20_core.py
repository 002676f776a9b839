"""Trust pass 20, the package core outside conversion and adapters: unusual inputs to ``explain``, the metrics, the
training and prediction helpers, the bilinear analyses, Space, the vision model and the pictures, each checked
against an independent computation written here (the row alone, float64, the formula by hand). The cases that were
silently wrong or crashed unhelpfully, one test each (the tally is in the CHANGELOG and the session's report).

- ``seqpg_evidence_split`` / ``seqpg_score`` divided the positive evidence by its total floored at 1e-30: scores below
  that (a float64 B-cos model at a large B explains logits of 1e-57) gave shares near 0 instead of the split, rows
  no longer summing to 1, without a word.
- ``weight_colour_image`` divided each pixel's weights by their largest magnitude floored at 1e-12: weights below it
  (the same models, in float32 too) were drawn with other colours (black where the hue was full).
- ``adversarial_masks`` took the top ``per_direction`` eigenvalues of each direction as its "positive" eigenvectors
  even where fewer than that were positive: a direction whose interaction matrix is singular (a rank-1 layer) or
  negative semidefinite got a mask for a null-space eigenvector (eigenvalue 1e-7, rounding) or a negative one, a key
  that activates nothing, returned as one.
- ``predict`` / ``accuracy`` / ``predict_labels`` / ``fine_tune_classifier`` took a text that tokenises to no token
  (an empty text with a tokenizer that adds no special tokens) as a row of padding alone: a decoder classifier's
  logits of no text were returned, counted and trained on; a first-column classifier's refusal told to pad on the
  right where the tokenizer already did. Each now refuses it naming the text, as ``explain_dataset`` does.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from conftest import padded_batch, tiny_model
from test_pretrain import QUIET, word_tokenizer

from bcos_plugins import bcosify, explain, fine_tune_classifier
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.train import accuracy, predict

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ SeqPG: shares whatever the scale of the scores


def _split_by_hand(scores: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """(right, wrong, rest) shares of positive evidence per example, averaged over its two classes, in float64."""
    n, _, length = segments.shape
    positive = scores.double().clamp_min(0).reshape(n, 2, length)
    out = torch.zeros(n, 3, dtype=torch.float64)
    for i in range(n):
        for s in range(2):
            total = positive[i, s].sum()
            if total > 0:
                right = positive[i, s][segments[i, s]].sum() / total
                wrong = positive[i, s][segments[i, 1 - s]].sum() / total
                out[i] += torch.stack([right, wrong, 1 - right - wrong]) / 2
    return out


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float64, 1e-40), (torch.float64, 1e-57), (torch.float32, 1e-33)])
def test_seqpg_evidence_split_does_not_depend_on_the_scale_of_the_scores(dtype, scale):
    from bcos_plugins.metrics import seqpg_evidence_split, seqpg_score

    torch.manual_seed(0)
    scores = torch.randn(4, 7, dtype=torch.float64)
    segments = torch.zeros(2, 2, 7, dtype=torch.bool)
    segments[:, 0, 1:3] = True
    segments[:, 1, 4:6] = True
    expected = _split_by_hand(scores, segments)
    split = seqpg_evidence_split((scores * scale).to(dtype), segments)
    # was about 1e-10 of the shares for float64 scores of 1e-40 (rows summing to 2e-10 instead of 1)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(split.double(), expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(split.double().sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=tolerance)
    torch.testing.assert_close(seqpg_score((scores * scale).to(dtype), segments).double(), expected[:, 0],
                               rtol=tolerance, atol=tolerance)


# ------------------------------------------------------------------ the colour picture of W(x) at any scale


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float64, 1e-30), (torch.float64, 1e-200), (torch.float32, 1e-30)])
def test_weight_colour_image_does_not_depend_on_the_scale_of_the_weights(dtype, scale):
    from bcos_plugins.vision.visualize import weight_colour_image

    torch.manual_seed(0)
    weights = torch.randn(6, 4, 4, dtype=torch.float64)
    contributions = torch.randn(4, 4, dtype=torch.float64)
    # the picture by hand: per pixel, the weights over their largest magnitude, positive part, w_c / (w_c + w_C+c)
    scaled = (weights / weights.abs().amax(0, keepdim=True)).clamp_min(0)
    colour = scaled[:3] / (scaled[:3] + scaled[3:]).clamp_min(1e-12)
    picture = weight_colour_image((weights * scale).to(dtype), contributions)
    # was black (colour 0) wherever the weights were below 1e-12, off by up to 1.0
    np.testing.assert_allclose(picture[..., :3], colour.permute(1, 2, 0).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(picture, weight_colour_image(weights, contributions), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ adversarial masks: positive eigenvectors only


def _rank_one_layer():
    torch.manual_seed(0)
    return torch.randn(1, 5, dtype=torch.float64), torch.randn(1, 5, dtype=torch.float64), torch.randn(3, 1,
                                                                                                      dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adversarial_masks_refuse_a_direction_with_fewer_positive_eigenvalues_than_asked(dtype):
    from bcos_plugins.bilinear import adversarial_masks, eigendecompose

    W, V, P = (t.to(dtype) for t in _rank_one_layer())
    # a rank-1 layer's Q(u) = p_u sym(w v^T) has one positive and one negative eigenvalue, the rest 0 (rounding)
    eig = eigendecompose((W, V, P), torch.eye(3, dtype=dtype)[:1])
    assert int((eig.eigenvalues > 1e-4).sum()) == 1
    # was a mask for a null-space eigenvector (eigenvalue 1e-8), returned as the second "positive" one
    with pytest.raises(BcosValueError, match=r"^per_direction: .*direction\(s\) \[0\] .*1 positive eigenvalue"):
        adversarial_masks(eig, per_direction=2)
    # a negative semidefinite Q (W = -V): no positive eigenvalue at all, the "positive" one was 1.7e-7
    negative = eigendecompose((W, -W, torch.ones(1, 1, dtype=dtype)), torch.ones(1, 1, dtype=dtype))
    assert (negative.eigenvalues < 1e-4).all()
    with pytest.raises(BcosValueError, match=r"^per_direction: .*direction\(s\) \[0\] .*0 positive eigenvalue"):
        adversarial_masks(negative, per_direction=1)


def test_adversarial_masks_of_a_rank_one_direction_key_its_positive_eigenvector():
    from bcos_plugins.bilinear import BilinearWeights, adversarial_masks, eigendecompose

    W, V, P = _rank_one_layer()
    u = torch.eye(3, dtype=torch.float64)[:1]
    result = adversarial_masks(eigendecompose((W, V, P), u), per_direction=1)
    # independent: the positive eigenvalue of the 5x5 sym(w v^T) scaled by p_0, from numpy
    q = P[0, 0] * 0.5 * (W.T @ V + V.T @ W)
    values, vectors = np.linalg.eigh(q.numpy())
    assert float(result.eigenvalues[0, 0]) == pytest.approx(values.max(), rel=1e-10)
    assert abs(float(result.masks[0, 0] @ torch.from_numpy(vectors[:, values.argmax()]))) == pytest.approx(1.0)
    # the key moves the output along u by lambda ((v.x + 1)^2 - (v.x)^2) for the oriented eigenvector
    x = torch.randn(5, dtype=torch.float64)
    layer = BilinearWeights(W, V, P)
    v = result.eigenvectors[0, 0]
    moved = (layer.forward(x + result.masks[0, 0]) - layer.forward(x)) @ u[0]
    sign = float(result.masks[0, 0] @ v)
    along = float(v @ x)
    expected = float(result.eigenvalues[0, 0]) * ((along + sign) ** 2 - along**2)
    assert float(moved) == pytest.approx(expected, rel=1e-9)


# ------------------------------------------------------------------ texts that tokenise to no token


_EMPTY = r"^texts: text 1 \(''\) tokenises to no token.*Drop empty texts"


@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification",
                                  "BertForSequenceClassification"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_predict_and_accuracy_refuse_a_text_that_tokenises_to_no_token_naming_it(name, side):
    model, tok = bcosify(tiny_model(name), verbose=False), word_tokenizer()
    tok.padding_side = side
    texts = ["w1 w2 w3", "", "w4"]
    # was a row of padding alone: a decoder classifier's logits of no text, counted by accuracy
    with pytest.raises(BcosValueError, match=_EMPTY):
        predict(model, tok, texts)
    with pytest.raises(BcosValueError, match=_EMPTY):
        accuracy(model, tok, texts, [0, 1, 2])
    if name.startswith("Bert") and side == "left":
        return  # a first-column classifier refuses left padding anyway
    # the texts with tokens are predicted as alone (the independent computation)
    kept = predict(model, tok, ["w1 w2 w3", "w4"])
    for i, text in enumerate(["w1 w2 w3", "w4"]):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            torch.testing.assert_close(kept[i], model(input_ids=ids).logits[0], rtol=1e-5, atol=1e-6)


def test_predict_names_the_empty_text_by_its_index_in_texts_whatever_the_batch():
    model, tok = bcosify(tiny_model("GPT2ForSequenceClassification"), verbose=False), word_tokenizer()
    texts = ["w1 w2 w3 w4 w5", "w1", "w2 w3", "", "w6 w7 w8"]
    with pytest.raises(BcosValueError, match=r"^texts: text 3 \(''\) tokenises to no token"):
        predict(model, tok, texts, batch_size=2)


def test_predict_labels_refuses_a_text_that_tokenises_to_no_token():
    from bcos_plugins.space.zero_shot import predict_labels

    model, tok = bcosify(tiny_model("GPT2ForSequenceClassification"), verbose=False), word_tokenizer()
    with pytest.raises(BcosValueError, match=_EMPTY):
        predict_labels(model, tok, ["w1 w2", "", "w3"])


def test_fine_tune_classifier_refuses_a_text_that_tokenises_to_no_token_before_training():
    model, tok = bcosify(tiny_model("GPT2ForSequenceClassification"), verbose=False), word_tokenizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # was trained on a row of padding alone, labelled 1
    with pytest.raises(BcosValueError, match=_EMPTY):
        fine_tune_classifier(model, tok, ["w1 w2", "", "w3"], [0, 1, 0], **QUIET)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------ pixel perturbation of a half-precision ViT


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("score", ["softmax", "sigmoid", "logit"])
def test_pixel_perturbation_of_a_half_precision_vit_scores_its_logits_in_float32(tiny_vits, vit_images, dtype, score):
    """The curves were computed and returned in the model's dtype: a bfloat16 softmax keeps 3 significant digits, so
    the confidences (off by up to 5e-4) and the area between the curves (0.0649 for 0.0653) were rounded, where the
    text metrics take probabilities in float32. Now the logits are widened first (exactly): the curves are those of
    the same logits in float32."""
    from bcos_plugins.metrics import pixel_perturbation

    model = copy.deepcopy(tiny_vits["bcos"]).to(dtype)
    images, _ = vit_images
    encoded = model.encode(images.to(dtype))
    with torch.no_grad():
        target = model(encoded_pixel_values=encoded).logits.argmax(-1)
    attributions = torch.randn(images.shape[0], 16, 16, generator=torch.Generator().manual_seed(0))
    curves = pixel_perturbation(lambda e: model(encoded_pixel_values=e).logits, encoded, attributions, target,
                                score=score)
    # independent: the same forward, its logits widened to float32 before the score
    wide = pixel_perturbation(lambda e: model(encoded_pixel_values=e).logits.float(), encoded, attributions, target,
                              score=score)
    assert curves.most_first.dtype == curves.least_first.dtype == torch.float32
    torch.testing.assert_close(curves.most_first, wide.most_first, rtol=0, atol=0)
    torch.testing.assert_close(curves.least_first, wide.least_first, rtol=0, atol=0)
    torch.testing.assert_close(curves.area_between, wide.area_between, rtol=0, atol=0)


# ------------------------------------------------------------------ the causal-LM collator's mask


@pytest.mark.parametrize("mask", [[0.5, 1.0, 1.0], [1.0, 1.0, 1.7], [1.0, -0.2, 1.0]])
def test_causal_lm_collator_refuses_a_mask_that_is_not_0_1_instead_of_truncating_it(mask):
    """The mask was cast to integers before its 0/1 check, so 0.5 read as padding (0) and 1.7 as a real token (1):
    the labels of another row than given (token 6 dropped from the loss for [0.5, 1, 1]), without a word."""
    from bcos_plugins import CausalLMCollator

    with pytest.raises(BcosValueError, match=r"^features: feature 0: attention_mask must be 0/1"):
        CausalLMCollator(0)([{"input_ids": [5, 6, 7], "attention_mask": mask}])
    # a float mask of 0s and 1s is the integer one: the same batch
    ones = CausalLMCollator(0)([{"input_ids": [5, 6, 7], "attention_mask": [0.0, 1.0, 1.0]}])
    assert ones["labels"].tolist() == [[-100, -100, 7]] and ones["attention_mask"].tolist() == [[0, 1, 1]]


# ------------------------------------------------------------------ attention rollout of small attention rows


@pytest.mark.parametrize(("dtype", "scale", "tolerance"), [(torch.float32, 1e-40, 1e-4), (torch.float64, 1e-310, 1e-9)])
def test_attention_rollout_renormalises_rows_of_any_size(dtype, scale, tolerance):
    """B-cos attention with a multiplicative prior is not row-stochastic, and rollout renormalises its rows; the row
    sum was floored at the dtype's smallest normal number, so rows summing below it (float32 rows of 1e-40) were not
    renormalised and the residual identity took over: a map off by 0.15 (of about 0.25), without a word."""
    from bcos_plugins.vision.rollout import attention_rollout

    torch.manual_seed(0)
    attentions = [torch.softmax(torch.randn(2, 2, 4, 4, dtype=torch.float64), -1) for _ in range(2)]
    # independent: the recursion by hand on the row-normalised mean over heads, in float64
    rollout = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
    for a in attentions:
        mean = a.mean(1)
        rollout = (0.5 * mean / mean.sum(-1, keepdim=True) + 0.5 * torch.eye(4, dtype=torch.float64)) @ rollout
    expected = rollout.mean(1).reshape(2, 2, 2).repeat_interleave(2, 1).repeat_interleave(2, 2)
    small = attention_rollout([(a * scale).to(dtype) for a in attentions], patch_size=2)
    torch.testing.assert_close(small.double(), expected, rtol=tolerance, atol=tolerance)
    # rows of zeros stay what they were: the identity's share alone
    zero = attention_rollout([torch.zeros(1, 2, 4, 4, dtype=dtype)], patch_size=2)
    torch.testing.assert_close(zero, torch.full((1, 4, 4), 0.125, dtype=dtype))


# ------------------------------------------------------------------ truncation_curve's directions


def test_truncation_curve_names_directions_of_the_wrong_shape_and_is_the_layers_accuracy_at_full_rank():
    """``directions`` of one vector or of another width were refused naming ``eig`` or ``u``, arguments of inner
    functions the caller never passed (and asking for ``eigendecompose(layer, u)``)."""
    from bcos_plugins.bilinear import BilinearWeights, truncation_curve

    torch.manual_seed(0)
    W, V, P = torch.randn(4, 5), torch.randn(4, 5), torch.randn(3, 4)
    x, labels = torch.randn(40, 5), torch.randint(0, 3, (40,))
    with pytest.raises(BcosValueError, match=r"^directions: .*\(n, d_out\) = \(n, 3\).*got shape \(3,\)"):
        truncation_curve((W, V, P), x, torch.zeros(40, dtype=torch.long), [1], directions=torch.ones(3))
    with pytest.raises(BcosValueError, match=r"^directions: .*width 4.*d_out=3"):
        truncation_curve((W, V, P), x, labels, [1], directions=torch.eye(4))
    # independent: at k = d_in the truncated classifier is the layer itself, argmax of directions @ out(x)
    directions = torch.randn(3, 3)
    curve = truncation_curve((W, V, P), x, labels, [5], directions=directions)
    own = (BilinearWeights(W, V, P).forward(x) @ directions.T).argmax(-1)
    assert curve.full_accuracy == pytest.approx(float((own == labels).float().mean()))
    assert curve.accuracy == [pytest.approx(curve.full_accuracy)]


# ------------------------------------------------------------------ segment and position ids given to explain


def test_explain_refuses_segment_and_position_ids_of_the_wrong_form_naming_them():
    """``token_type_ids`` / ``position_ids`` that do not fit the batch failed inside the model with torch's messages
    ("The size of tensor a (9) must match the size of tensor b (8)", "embedding(): argument 'indices' must be Tensor,
    not list", "index 100 is out of bounds for dimension 1 with size 40": a device-side assert on a GPU), naming
    neither the argument nor the fix."""
    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    ids, mask = padded_batch()
    types = torch.zeros_like(ids)
    with pytest.raises(BcosValueError, match=r"^token_type_ids: has shape \(3, 8\) for input_ids of shape \(3, 9\)"):
        explain(model, ids, mask, token_type_ids=types[:, :-1])
    with pytest.raises(BcosTypeError, match=r"^token_type_ids: is a list.*Pass a tensor"):
        explain(model, ids, mask, token_type_ids=types.tolist())
    with pytest.raises(BcosValueError, match=r"^position_ids: has shape \(9,\) for input_ids of shape \(3, 9\)"):
        explain(model, ids, mask, position_ids=torch.arange(9))
    with pytest.raises(BcosValueError, match=r"^position_ids: holds 108, outside the model's 40 positions "
                                             r"\(config.max_position_embeddings\)"):
        explain(model, ids, mask, position_ids=torch.arange(9)[None] + 100)
    with pytest.raises(BcosValueError, match=r"^position_ids: holds -1, outside"):
        explain(model, ids, mask, position_ids=torch.arange(9)[None] - 1)
    with pytest.raises(BcosTypeError, match=r"^position_ids: is a torch.float32 tensor"):
        explain(model, ids, mask, position_ids=torch.arange(9.0)[None])
    # the forms that fit are the model's own call: one row for every row, or one per row
    plain = explain(model, ids, mask)
    for types_given, positions in ((types[:1], torch.arange(9)[None]), (types, torch.arange(9).expand(3, 9))):
        given = explain(model, ids, mask, token_type_ids=types_given, position_ids=positions)
        with torch.no_grad():
            own = model(input_ids=ids, attention_mask=mask, token_type_ids=types_given, position_ids=positions).logits
        torch.testing.assert_close(given.explained, own.gather(1, given.target[:, None])[:, 0])
        torch.testing.assert_close(given.explained, plain.explained)  # right padding: the same positions


def test_pretrain_masked_lm_refuses_a_text_that_tokenises_to_no_token_before_training():
    """A batch of such texts (rows of padding alone) failed mid-training inside the attention ("cannot reshape tensor
    of 0 elements into shape [2, 0, -1, 8]"), after however many steps had run; now refused before any step, as
    fine_tune_classifier refuses it."""
    from bcos_plugins.pretrain import pretrain_masked_lm

    with pytest.raises(BcosValueError, match=r"^texts: text 0 \(''\) tokenises to no token \(and 1 more\): there is "
                                             r"nothing to pre-train on"):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), word_tokenizer(), ["", "w1 w2", ""], **QUIET)


# ------------------------------------------------------------------ zero-shot evaluation's labels and scores


class _FirstTokenClassifier(torch.nn.Module):
    """Class ``input_ids[:, 0] % 3`` with certainty: predictions known in advance (outside the registry)."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.nn.functional.one_hot(input_ids[:, 0] % 3, 3).float())


def test_zero_shot_evaluation_scores_unmapped_predictions_as_errors_over_the_datasets_classes():
    """Unmapped predictions were written as -1 and scored as a class of their own: an unlabelled split's labels (-1,
    as GLUE's test sets have) then matched every unmapped prediction (accuracy 1.0 for a model whose classes map to
    nothing), and with real labels the phantom class -1 entered the macro averages (precision 0.5 for 0.75)."""
    from bcos_plugins.space.zero_shot import zero_shot_evaluation

    tok = word_tokenizer()  # w0, w1, w2 are ids 5, 6, 7: classes 2, 0, 1
    with pytest.raises(BcosValueError, match=r"^labels: must be >= 0, got -1"):
        zero_shot_evaluation(_FirstTokenClassifier(), tok, ["w1", "w2"], [-1, -1], label_map={})
    scores = zero_shot_evaluation(_FirstTokenClassifier(), tok, ["w1", "w2", "w0", "w1"], [0, 1, 1, 1],
                                  label_map={0: 0, 1: 1})
    # by hand: predictions [0, 1, unmapped, 0]; class 0: P = 1/2, R = 1/1; class 1: P = 1/1, R = 1/3
    assert scores["accuracy"] == pytest.approx(0.5)
    assert scores["precision_macro"] == pytest.approx((0.5 + 1.0) / 2)
    assert scores["recall_macro"] == pytest.approx((1.0 + 1 / 3) / 2)
    assert scores["f1_macro"] == pytest.approx((2 * 0.5 / 1.5 + 2 * (1 / 3) / (4 / 3)) / 2)


def test_paired_accuracy_difference_refuses_negative_class_ids():
    """An unlabelled split's labels (-1) matched no prediction: both variants scored 0.0, the difference 0 with an
    interval of zero width (no discordant pair), so ``non_inferior`` answered True at any margin, without a word."""
    pytest.importorskip("scipy")
    from bcos_plugins.metrics import paired_accuracy_difference

    with pytest.raises(BcosValueError, match=r"^labels: holds -1 at examples \[0, 1, 2\], not a class id"):
        paired_accuracy_difference([0, 1, 1], [1, 1, 0], [-1, -1, -1])
    with pytest.raises(BcosValueError, match=r"^predictions_b: holds -1 at seeds \[1\], not a class id"):
        paired_accuracy_difference([[0, 1, 1], [0, 1, 1]], [[0, 1, 1], [0, -1, 1]], [0, 1, 1])


# ------------------------------------------------------------------ token scores: reduce="l2" on token-level scores


def test_token_scores_l2_is_the_magnitude_whatever_the_number_of_feature_dimensions():
    """``reduce="l2"`` (the unsigned norm over the features, for methods whose sign is meaningless) returned
    ``(batch, pos)`` scores signed, where the same scores with a feature axis of one came back as magnitudes: the
    metrics ranked a token of -3 last instead of first, without a word."""
    from bcos_plugins.metrics import token_scores, top_k_masks

    scores = torch.tensor([[1.0, -3.0, 2.0, 0.5]])
    expected = scores.abs()
    torch.testing.assert_close(token_scores(scores, reduce="l2"), expected)
    torch.testing.assert_close(token_scores(scores[..., None], reduce="l2"), expected)
    torch.testing.assert_close(token_scores(scores[..., None, None].expand(1, 4, 2, 2), reduce="l2"), 2 * expected)
    # the metrics rank by it: the top token is the one of magnitude 3
    masks, _ = top_k_masks(token_scores(scores, reduce="l2"), torch.ones(1, 4, dtype=torch.bool), [0.25])
    assert masks[0, 0].tolist() == [False, True, False, False]


# ------------------------------------------------------------------ measure_cost's device


def test_measure_cost_refuses_a_device_it_cannot_measure_naming_it():
    """``device="cuda"`` without CUDA failed inside torch ("Torch not compiled with CUDA enabled", an
    AssertionError), an unknown type with torch's list of device types, and ``"meta"`` (or any other type) was
    measured as the CPU process and reported under that device's name."""
    from bcos_plugins.metrics import measure_cost

    with pytest.raises(BcosValueError, match=r"^device: .*'meta'.*measures the CPU or a CUDA device"):
        measure_cost(lambda: 1, device="meta")
    # the package's one device check (require_available_device) since session 26: a name that is no device is a
    # BcosTypeError, a device the machine lacks names the available ones (tests/test_leftovers_s26_small.py)
    with pytest.raises(BcosTypeError, match=r"^device: .*'tpu', not a device"):
        measure_cost(lambda: 1, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BcosValueError, match=r"^device: is 'cuda', which this machine does not have"):
            measure_cost(lambda: 1, device="cuda")
    result, cost = measure_cost(lambda: 3, device="cpu")
    assert result == 3 and cost.device == "cpu" and cost.seconds >= 0


# ------------------------------------------------------------------ the explanation figure's inputs


def test_save_explanation_figure_refuses_what_it_would_draw_wrongly_naming_it(tmp_path):
    """The figure checked nothing: four channels were drawn as RGBA (the fourth as transparency), NaN maps as blank
    panels, images in [0, 255] saturated white, each saved without a word; two channels, a missing map and a 3-d
    batch failed inside matplotlib or torch ("Invalid shape (8, 8, 2) for image data", an IndexError)."""
    from bcos_plugins.vision.visualize import save_explanation_figure

    torch.manual_seed(0)
    images, maps = torch.rand(2, 1, 8, 8), {"W(x)x": torch.randn(2, 8, 8)}
    for channels in (2, 4):
        with pytest.raises(BcosValueError, match=rf"^images: has {channels} channels; the figure draws grey \(1\) or "
                                                 r"RGB \(3\) images"):
            save_explanation_figure(tmp_path / "f.png", torch.rand(2, channels, 8, 8), maps)
    with pytest.raises(BcosValueError, match=r"^images: has values in \[0\.\d+, 1\.99\d*\], drawn on \[0, 1\]"):
        save_explanation_figure(tmp_path / "f.png", images * 2, maps)
    with pytest.raises(BcosValueError, match=r"^images: must have 4 dimensions"):
        save_explanation_figure(tmp_path / "f.png", images[:, 0], maps)
    with pytest.raises(BcosValueError, match=r"^columns\['W\(x\)x'\]: contains NaN or inf"):
        save_explanation_figure(tmp_path / "f.png", images, {"W(x)x": torch.full((2, 8, 8), float("nan"))})
    with pytest.raises(BcosValueError, match=r"^columns\['W\(x\)x'\]: has 1 maps for 2 images"):
        save_explanation_figure(tmp_path / "f.png", images, {"W(x)x": torch.randn(1, 8, 8)})
    with pytest.raises(BcosValueError, match=r"^row_titles: has 1 titles for 2 images"):
        save_explanation_figure(tmp_path / "f.png", images, maps, row_titles=["one"])
    assert not (tmp_path / "f.png").exists()
    path = save_explanation_figure(tmp_path / "f.png", images, {**maps, "list": list(torch.rand(2, 8, 8))},
                                   row_titles=["a", "b"])
    assert path.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ digit canvases and grids


def test_digit_canvases_refuse_digits_that_are_not_grey_images_in_0_1_and_keep_their_dtype():
    """Three-channel digits failed inside the canvas copy ("The expanded size of the tensor (1) must match the
    existing size (3)"); digits of 0-16 (sklearn's raw scale) were clipped to 1 in the scaled-up views and kept whole in
    the others, one dataset of two scales; float64 digits came back float32."""
    from bcos_plugins.vision.data import DigitImages, make_grids, place_digits

    torch.manual_seed(0)
    labels = torch.arange(4)
    with pytest.raises(BcosValueError, match=r"^digits: have 3 channels; digits are grey images \(n, 1, s, s\)"):
        DigitImages(torch.rand(4, 3, 8, 8), labels)
    with pytest.raises(BcosValueError, match=r"^digits: have 3 channels"):
        make_grids(torch.rand(4, 3, 8, 8), labels, torch.rand(4), 1)
    with pytest.raises(BcosValueError, match=r"^digits: have values in \[0.*, 15.*\]; digits are images in \[0, 1\]"):
        DigitImages(torch.rand(4, 1, 8, 8) * 16, labels)
    digits = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    canvas = place_digits(digits, 12, torch.tensor([False, False]), torch.tensor([[0, 0], [4, 2]]))
    assert canvas.dtype == torch.float64
    assert torch.equal(canvas[1, :, 4:12, 2:10], digits[1]) and torch.isclose(canvas[1].sum(), digits[1].sum())


def test_top_k_iou_takes_a_numpy_or_tensor_k_as_the_number_it_holds():
    """``k=np.int64(2)`` (a count read from a NumPy array) or a 0-d tensor was refused as "not an int in [1, 4]"."""
    from bcos_plugins.metrics import rationale_alignment, top_k_iou

    scores, gold = torch.tensor([[0.5, 0.1, 0.9, 0.3]]), torch.tensor([[1, 0, 0, 1]])
    for k, plain in ((np.int64(2), 2), (torch.tensor(2), 2), (torch.tensor(0.5), 0.5), (np.float32(0.75), 0.75)):
        torch.testing.assert_close(top_k_iou(scores, gold, k=k), top_k_iou(scores, gold, k=plain))
        assert rationale_alignment(scores, gold, k=k).iou == rationale_alignment(scores, gold, k=plain).iou
    # by hand: the top 2 are positions 2 and 0, gold is {0, 3}: 1 / 3
    assert float(top_k_iou(scores, gold, k=np.int64(2))) == pytest.approx(1 / 3)
    with pytest.raises(BcosValueError, match=r"^k: "):
        top_k_iou(scores, gold, k=np.bool_(True))


# ------------------------------------------------------------------ refusals that named no argument


def test_seqpg_rationale_rollout_and_grid_refusals_name_their_argument():
    """These refusals were bare ValueErrors whose message named no argument (``"no text has 50 tokens; lower
    segment_length"``, ``"got spans for 1 rows but the encoding has 2"``): each now starts with the argument, as
    every other refusal of the package does, and is a BcosValueError (still a ValueError)."""
    from bcos_plugins.guided import gold_mask_from_spans, gold_mask_from_words, random_rationale_mask
    from bcos_plugins.metrics import make_seqpg_examples
    from bcos_plugins.vision.data import make_grids
    from bcos_plugins.vision.rollout import attention_rollout

    model, tok = tiny_model("BertForSequenceClassification"), word_tokenizer()
    with pytest.raises(BcosValueError, match=r"^segment_length: no text has 50 tokens"):
        make_seqpg_examples(model, tok, ["w1 w2", "w3"], [0, 1])
    with pytest.raises(BcosValueError, match=r"^model: is an empty list"):
        make_seqpg_examples([], tok, ["w1 w2", "w3"], [0, 1], segment_length=1)
    encoding = tok(["w1 w2", "w3"], padding=True, return_offsets_mapping=True)
    with pytest.raises(BcosValueError, match=r"^spans: got spans for 1 rows but the encoding has 2"):
        gold_mask_from_spans(encoding, [[(0, 2)]])
    with pytest.raises(BcosValueError, match=r"^encoding: has no offset_mapping"):
        gold_mask_from_spans(tok(["w1 w2"]), [[(0, 2)]])
    words = tok([["w1", "w2"], ["w3"]], is_split_into_words=True, padding=True)
    with pytest.raises(BcosValueError, match=r"^word_rationales: got word rationales for 1 rows"):
        gold_mask_from_words(words, [[1, 0]])
    with pytest.raises(BcosValueError, match=r"^word_rationales: row 0: token 1 comes from word 1"):
        gold_mask_from_words(words, [[1], [0]])
    with pytest.raises(BcosValueError, match=r"^eligible: a row's gold mask has more positions than eligible"):
        random_rationale_mask(torch.tensor([[1.0, 1.0]]), torch.tensor([[True, False]]))
    with pytest.raises(BcosValueError, match=r"^attentions: 3 tokens do not form a square grid"):
        attention_rollout([torch.softmax(torch.randn(1, 1, 3, 3), -1)], 2)
    with pytest.raises(BcosValueError, match=r"^n_grids: only 1 grids could be made"):
        make_grids(torch.rand(4, 1, 4, 4), torch.arange(4), torch.rand(4), 2)


class _NaNRowClassifier(_FirstTokenClassifier):
    """Logits of NaN for texts starting with w0 (id 5), finite otherwise."""

    def forward(self, input_ids, attention_mask=None):
        out = super().forward(input_ids, attention_mask)
        out.logits[input_ids[:, 0] == 5] = float("nan")
        return out


def test_predict_labels_refuses_nan_logits_naming_the_texts():
    """``predict`` refuses NaN logits (a padded float64 Gemma 2 gives them), ``predict_labels`` took their arg-max as
    a class (0: torch's arg-max of a NaN row) and ``zero_shot_evaluation`` scored it, without a word."""
    from bcos_plugins.space.zero_shot import predict_labels, zero_shot_evaluation

    tok = word_tokenizer()
    texts = ["w1 w2", "w0 w1", "w2", "w0"]
    with pytest.raises(BcosValueError, match=r"^predict_labels: the model's logits are NaN for texts \[1, 3\]"):
        predict_labels(_NaNRowClassifier(), tok, texts, batch_size=4)
    with pytest.raises(BcosValueError, match=r"^predict_labels: the model's logits are NaN for texts \[1\]"):
        zero_shot_evaluation(_NaNRowClassifier(), tok, texts[:2], [0, 1])
    assert predict_labels(_NaNRowClassifier(), tok, ["w1 w2", "w2"]) == [0, 1]
