"""Top-k IoU and AUPRC against gold rationale masks: hand cases, padding exclusion, scikit-learn agreement."""

import math

import pytest
import torch
from sklearn.metrics import average_precision_score

from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics.rationale import average_precision, rationale_alignment, top_k_iou


def test_iou_hand_case_k_equals_gold_size():
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.3, 0.2]])
    gold = torch.tensor([[1, 0, 0, 1, 0]])
    # k = 2 gold tokens; top-2 = {0, 2}; intersection {0}; union {0, 2, 3}.
    assert top_k_iou(scores, gold).item() == pytest.approx(1 / 3)


def test_iou_fixed_k_and_fraction():
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.3, 0.2]])
    gold = torch.tensor([[1, 0, 1, 0, 0]])
    assert top_k_iou(scores, gold, k=1).item() == pytest.approx(1 / 2)  # {0} vs {0, 2}
    assert top_k_iou(scores, gold, k=3).item() == pytest.approx(2 / 3)  # {0, 2, 3} vs {0, 2}
    assert top_k_iou(scores, gold, k=0.4).item() == pytest.approx(1.0)  # int(5 * 0.4) = 2 -> {0, 2}


def test_iou_perfect_and_worst():
    gold = torch.tensor([[0, 1, 1, 0]])
    assert top_k_iou(torch.tensor([[0.0, 2.0, 1.0, -1.0]]), gold).item() == 1.0
    assert top_k_iou(torch.tensor([[3.0, -2.0, -1.0, 1.0]]), gold).item() == 0.0


def test_padding_and_special_tokens_never_count():
    # The padding position has the highest score and is gold-marked: it must be ignored entirely.
    scores = torch.tensor([[5.0, 0.9, 0.1, 0.2, 9.0, 9.0]])
    gold = torch.tensor([[0, 1, 0, 0, 0, 1]])
    valid = torch.tensor([[0, 1, 1, 1, 0, 0]])  # [CLS] at 0, [SEP] at 4, padding at 5
    assert top_k_iou(scores, gold, valid).item() == 1.0
    assert average_precision(scores, gold, valid).item() == 1.0
    # Without the mask the same row scores worse: the mask is what excludes them.
    assert top_k_iou(scores, gold).item() < 1.0


def test_ap_hand_case():
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    gold = torch.tensor([[1, 0, 1, 0]])
    # positives at ranks 1 and 3: AP = (1/1 + 2/3) / 2
    assert average_precision(scores, gold).item() == pytest.approx((1 + 2 / 3) / 2)


def test_ap_matches_sklearn_with_ties_and_padding():
    g = torch.Generator().manual_seed(0)
    batch, length = 40, 17
    scores = torch.randint(0, 5, (batch, length), generator=g).float()  # many ties
    gold = (torch.rand(batch, length, generator=g) < 0.3).long()
    lengths = torch.randint(3, length + 1, (batch,), generator=g)
    valid = torch.arange(length)[None, :] < lengths[:, None]
    ours = average_precision(scores, gold, valid)
    for i in range(batch):
        keep = valid[i]
        y = gold[i][keep].numpy()
        if y.sum() == 0:
            assert math.isnan(ours[i].item())
        else:
            assert ours[i].item() == pytest.approx(average_precision_score(y, scores[i][keep].numpy()), abs=1e-6)


def test_rows_without_rationale_are_excluded_from_means():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.3, 0.2, 0.1]])
    gold = torch.tensor([[1, 0, 0], [0, 0, 0]])
    result = rationale_alignment(scores, gold)
    assert result.n_rows == 1
    assert result.iou == 1.0 and result.auprc == 1.0
    assert math.isnan(result.iou_per_row[1].item()) and math.isnan(result.auprc_per_row[1].item())


def test_batched_equals_row_by_row():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(8, 12, generator=g)
    gold = (torch.rand(8, 12, generator=g) < 0.4).long()
    gold[:, 0] = 1
    valid = torch.ones(8, 12, dtype=torch.bool)
    valid[:, 9:] = False
    batched = top_k_iou(scores, gold, valid)
    for i in range(8):
        assert batched[i] == top_k_iou(scores[i:i + 1, :9], gold[i:i + 1, :9])[0]


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="batch, pos"):
        top_k_iou(torch.zeros(3), torch.zeros(3))
    # (batch, pos, d) attributions are token scores summed over d, as every metric reads them (trust pass 25)
    scores = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(0))
    gold = torch.tensor([[1, 0, 0], [0, 1, 1]])
    assert torch.equal(top_k_iou(scores, gold), top_k_iou(scores.sum(-1), gold))
    with pytest.raises(ValueError, match="gold_mask: has shape"):
        average_precision(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="k must be"):
        top_k_iou(torch.zeros(1, 3), torch.ones(1, 3), k=0)
    with pytest.raises(ValueError, match="NaN"):
        average_precision(torch.tensor([[float("nan"), 1.0]]), torch.tensor([[1, 0]]))


# --- issue 15: unusual input gets a correct answer or a clear error -------------------------------------------

def test_nan_scores_masks_and_k_out_of_range_are_named():
    scores, gold = torch.rand(3, 4), torch.tensor([[1, 0, 0, 0]] * 3)
    nan = scores.clone()
    nan[2, 1] = float("nan")
    with pytest.raises(BcosValueError, match=r"scores: contain NaN or inf at valid positions in row \[2\]"):
        rationale_alignment(nan, gold)
    # a NaN at a position that does not count is fine, and changes nothing
    valid = torch.ones(3, 4, dtype=torch.bool)
    valid[2, 1] = False
    assert torch.equal(top_k_iou(nan, gold, valid), top_k_iou(scores, gold, valid))
    with pytest.raises(BcosValueError, match="gold_mask: must be a 0/1 mask"):
        top_k_iou(scores, gold * 2)
    with pytest.raises(BcosValueError, match="gold_mask: contains NaN"):
        average_precision(scores, torch.full((3, 4), float("nan")))
    with pytest.raises(BcosValueError, match="scores: are empty"):
        rationale_alignment(torch.zeros(0, 4), torch.zeros(0, 4))
    for k in (0, 5, -1, True):
        with pytest.raises(BcosValueError, match=r"k: k must be None .* an int in \[1, 4\]"):
            top_k_iou(scores, gold, k=k)
    with pytest.raises(BcosValueError, match="k: a float k"):
        top_k_iou(scores, gold, k=1.5)
