"""Lists of Python floats are read at Python's precision (float64, as NumPy reads them), one rule in
``require_tensor``: ``torch.as_tensor`` read them at torch's default dtype, float32, so scores 1e-9 apart around 1.0
tied (ranks, areas, sums and differences silently wrong) and 1e39 became inf, then refused as the user's NaN or inf.
An input that feeds a model is read at the model's dtype instead, and a value beyond that dtype's range is refused
naming the dtype. One metric per module of bcos_plugins/metrics that takes lists, then the model-feeding callers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosValueError

# around 1.0 float32 holds steps of 1.2e-7: these are one value in float32 and three in float64
CLOSE = [1.0, 1.0 + 1e-9, 1.0 + 2e-9]
HUGE = 1e39  # beyond float32's largest, 3.4e38


def test_require_tensor_reads_python_floats_as_float64_and_keeps_other_dtypes():
    from bcos_plugins._checks import require_tensor

    assert require_tensor("x", CLOSE).dtype == torch.float64
    assert require_tensor("x", tuple(CLOSE)).unique().numel() == 3
    assert require_tensor("x", [[1, 2.5]]).dtype == torch.float64  # ints mixed with a float: float64, as NumPy
    assert require_tensor("x", 1.5).dtype == torch.float64
    assert float(require_tensor("x", [HUGE])[0]) == HUGE
    # what holds no Python float keeps its dtype: ints, bools, NumPy arrays, tensors, NumPy float32 scalars
    assert require_tensor("x", [1, 2]).dtype == torch.int64
    assert require_tensor("x", [True, False], kind="bool").dtype == torch.bool
    assert require_tensor("x", np.array(CLOSE, dtype=np.float32)).dtype == torch.float32
    assert require_tensor("x", torch.tensor(CLOSE, dtype=torch.float16)).dtype == torch.float16
    assert require_tensor("x", [np.float32(1.5)]).dtype == torch.float32


def test_require_tensor_reads_a_model_input_at_the_models_dtype_and_names_an_overflow():
    from bcos_plugins._checks import require_tensor

    assert require_tensor("x", CLOSE, list_dtype=torch.float32).dtype == torch.float32
    assert require_tensor("x", [1, 2], list_dtype=torch.float32).dtype == torch.int64  # ints stay ids / counts
    assert require_tensor("x", np.array(CLOSE), list_dtype=torch.float32).dtype == torch.float64  # arrays are kept
    with pytest.raises(BcosValueError, match=r"x.*beyond the range of torch\.float32.*3\.4"):
        require_tensor("x", [[1.0, HUGE]], list_dtype=torch.float32)
    # an inf the caller wrote is theirs: refused as before where finite values are required, kept where not
    with pytest.raises(BcosValueError, match="NaN or inf"):
        require_tensor("x", [1.0, float("inf")], list_dtype=torch.float32)
    assert require_tensor("x", [1.0, float("inf")], list_dtype=torch.float32, finite=False).isinf().any()


# ---------------------------------------------------------------- one metric per module of bcos_plugins/metrics


def test_attributions_perturbable_mask_refuses_a_list_mask_value_that_is_not_0_or_1():
    """1 + 1e-8 read as float32 is 1.0, so a list mask passed the 0/1 check that the same NumPy array fails."""
    from bcos_plugins.metrics.attributions import perturbable_mask

    ids = [[5, 6, 7]]
    special = [[1.0, 0.0, 1.0 + 1e-8]]
    with pytest.raises(BcosValueError, match="special_tokens.*0/1 mask"):
        perturbable_mask(ids, None, special_tokens=np.array(special))
    with pytest.raises(BcosValueError, match="special_tokens.*0/1 mask"):
        perturbable_mask(ids, None, special_tokens=special)


def test_decoder_reciprocal_rank_ranks_list_scores_1e9_apart():
    """float32 tied the three scores and the stable sort kept prefix order: the evidence ranked 3rd (1/3), not 1st."""
    from bcos_plugins.metrics.decoder import reciprocal_rank

    rr = reciprocal_rank([CLOSE], [[False, False, True]])
    assert rr.tolist() == [1.0]


def test_decoder_probability_gap_takes_list_logits_beyond_float32():
    """[1e39, 0] became [inf, 0] and was refused as logits holding +inf ("check the model's output")."""
    from bcos_plugins.metrics.decoder import probability_gap

    assert probability_gap([[HUGE, 0.0]], [0], [1]).tolist() == [1.0]


def test_image_pixel_ranking_and_pointing_game_of_list_maps():
    from bcos_plugins.metrics.image import grid_pointing_game, pixel_ranking

    # tied in float32, so the order was the seed's shuffle; float64 ranks them 3, 2, 1, 0
    ranking = pixel_ranking([[[1.0, 1.0 + 1e-9], [1.0 + 2e-9, 1.0 + 3e-9]]])
    assert ranking.tolist() == [[3, 2, 1, 0]]
    # 1 / (1 + 3e-9): float32 read the share as exactly 1.0
    share = grid_pointing_game([[[1.0, 1e-9], [1e-9, 1e-9]]], 0)
    assert float(share[0]) == pytest.approx(1 / (1 + 3e-9), rel=1e-12, abs=0)
    assert float(share[0]) < 1.0
    # 1e39 was refused as the map's NaN or inf
    assert float(grid_pointing_game([[[HUGE, 0.0], [0.0, 0.0]]], 0)[0]) == 1.0


def test_paired_bootstrap_difference_of_lists_beyond_float32():
    """The 1e-9 case is pinned in tests/test_leftovers_s22.py (helper-115's local fix, now require_tensor's rule);
    1e39 was refused as 'contains NaN or inf'."""
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a = [HUGE, HUGE, HUGE, HUGE]
    b = [2 * HUGE, 3 * HUGE, 2 * HUGE, 4 * HUGE]
    r = paired_bootstrap_difference(a, b, n_resamples=200)
    assert r.difference == pytest.approx(1.75 * HUGE, rel=1e-12)
    assert r == paired_bootstrap_difference(np.array(a), np.array(b), n_resamples=200)


def test_perturbation_aopc_of_a_list_curve():
    from bcos_plugins.metrics.perturbation import aopc

    # a flat curve at 1 + 1e-9 has a normalised area of 1 + 1e-9; float32 read it as 1.0
    assert float(aopc([1.0 + 1e-9] * 9, normalise=True)) == pytest.approx(1.0 + 1e-9, rel=1e-13, abs=0)
    assert float(aopc([HUGE] * 9, normalise=True)) == pytest.approx(HUGE, rel=1e-12)


def test_pointing_seqpg_evidence_split_refuses_a_list_mask_value_that_is_not_0_or_1():
    from bcos_plugins.metrics.pointing import seqpg_evidence_split

    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    masks = [[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0 + 1e-8]]]
    with pytest.raises(BcosValueError, match="segment_masks.*0/1 mask"):
        seqpg_evidence_split(scores, np.array(masks))
    with pytest.raises(BcosValueError, match="segment_masks.*0/1 mask"):
        seqpg_evidence_split(scores, masks)


def test_rationale_average_precision_and_top_k_iou_of_list_scores_1e9_apart():
    """Tied in float32: every token sat at the gold token's threshold (precision 1/3), and top-1 took the first."""
    from bcos_plugins.metrics.rationale import average_precision, top_k_iou

    gold = [[0, 0, 1]]
    assert average_precision([CLOSE], gold).tolist() == [1.0]
    assert top_k_iou([CLOSE], gold, k=1).tolist() == [1.0]


def test_summary_completeness_error_of_list_attributions():
    """float32 summed 1.0 + 3e-9 to 1.0: the error read 0 (exact completeness) where it is 3e-9."""
    from bcos_plugins.metrics.summary import completeness_error

    error = completeness_error([[[1.0, 3e-9]]], [1.0], relative=False)
    assert float(error[0]) == pytest.approx(3e-9, rel=1e-6)
    # 1e39 was refused as NaN or inf
    assert float(completeness_error([[[HUGE, 0.0]]], [HUGE])[0]) == 0.0


def test_summary_completeness_error_of_an_explained_value_beyond_the_attributions_dtype_is_its_real_gap():
    """explained is compared in the wider dtype of the two (float64 for a list): 1e39 against float32 attributions
    was cast to inf (refused as 'contains NaN or inf', blaming the value; then refused naming float32); it is a logit
    the attributions (sum 2) miss, relative error |2 - 1e39| / 1e39 = 1.0 (tests/test_trust_pass21_metrics_leftovers.py
    pins the 1e-9 gap the narrowing read as 0)."""
    from bcos_plugins.metrics.summary import completeness_error

    assert float(completeness_error(torch.ones(1, 2), [HUGE])[0]) == abs(2.0 - HUGE) / HUGE == 1.0
    # the same value as a float64 tensor was cast to inf, and the error read NaN (the docstring: never NaN or inf)
    assert float(completeness_error(torch.ones(1, 2), torch.tensor([HUGE], dtype=torch.float64))[0]) == 1.0
    assert float(completeness_error(torch.ones(1, 2), torch.tensor([2.0], dtype=torch.float64))[0]) == 0.0


# ---------------------------------------------------------------- inputs that feed a model: the model's dtype


def test_space_head_reads_list_hidden_states_at_the_heads_dtype():
    """A float64 head refused a list of hidden states as 'float32 but the head's weights are float64'."""
    from bcos_plugins.space.modeling import SpaceHead

    torch.manual_seed(0)
    head = SpaceHead(d_model=3, n_spaces=2, n_latent=2).double()
    hidden = [[[0.1, 0.2 + 1e-9, 0.3], [0.4, 0.5, 0.6]]]
    z = head.concepts(hidden)
    assert z.dtype == torch.float64
    assert torch.equal(z, head.concepts(torch.tensor(hidden, dtype=torch.float64)))
    assert torch.equal(head.token_contributions(z.tolist()), head.token_contributions(z))
    # a float32 head reads them as float32, as before
    assert SpaceHead(d_model=3, n_spaces=2, n_latent=2).concepts(hidden).dtype == torch.float32


def test_bilinear_layer_reads_a_list_input_at_its_dtype_and_names_an_overflow():
    from bcos_plugins.bilinear.weights import BilinearWeights

    torch.manual_seed(0)
    w = BilinearWeights(torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64),
                        torch.randn(2, 4, dtype=torch.float64))
    x = [[0.1, 0.2 + 1e-9, 0.3]]
    assert torch.equal(w.forward(x), w.forward(torch.tensor(x, dtype=torch.float64)))  # a float64 layer: was a dtype mismatch
    w32 = BilinearWeights(w.W.float(), w.V.float(), w.P.float())
    assert w32.forward(x).dtype == torch.float32
    with pytest.raises(BcosValueError, match=r"x.*beyond the range of torch\.float32"):
        w32.forward([[HUGE, 0.0, 0.0]])


def test_encode_image_keeps_torchs_default_dtype_for_a_list():
    """No model is known there: a list image is read at torch's default dtype (what models are built in)."""
    from bcos_plugins.vision.encoding import encode_image

    assert encode_image([[[[0.25, 0.5]]]]).dtype == torch.get_default_dtype()
