"""Faithfulness, plausibility and cost metrics that score attributions from any method.

- text faithfulness (ERASER comprehensiveness / sufficiency, AOPC, SeqPG): :mod:`.perturbation`, :mod:`.pointing`
- decoders (MRR against evidence tokens with the random baseline, probability gap, perplexity): :mod:`.decoder`
- rationale alignment (top-k IoU, AUPRC): :mod:`.rationale`
- two training variants compared seed by seed and example by example (interval, McNemar, non-inferiority):
  :mod:`.paired`
- images (grid pointing game, pixel perturbation): :mod:`.image`
- explanation entropy, completeness error, time and peak memory: :mod:`.summary`
"""

from .attributions import perturbable_mask, special_tokens_mask, token_scores
from .decoder import (
    MRRResult,
    NextTokenContrast,
    PerplexityResult,
    expected_random_reciprocal_rank,
    mean_reciprocal_rank,
    next_token_contrast,
    perplexity,
    probability_gap,
    random_reciprocal_rank,
    reciprocal_rank,
)
from .image import IMAGE_FRACTIONS, PixelPerturbation, grid_pointing_game, pixel_perturbation, pixel_ranking
from .paired import PairedAccuracyDifference, paired_accuracy_difference
from .perturbation import DEFAULT_FRACTIONS, PerturbationCurves, aopc, perturbation_curves, top_k_masks
from .pointing import SeqPGExamples, make_seqpg_examples, seqpg_evidence_split, seqpg_score
from .rationale import RationaleAlignment, average_precision, rationale_alignment, top_k_iou
from .summary import Cost, completeness_error, explanation_entropy, measure_cost

__all__ = [
    "DEFAULT_FRACTIONS",
    "IMAGE_FRACTIONS",
    "Cost",
    "MRRResult",
    "NextTokenContrast",
    "PairedAccuracyDifference",
    "PerplexityResult",
    "PerturbationCurves",
    "PixelPerturbation",
    "RationaleAlignment",
    "SeqPGExamples",
    "aopc",
    "average_precision",
    "completeness_error",
    "expected_random_reciprocal_rank",
    "explanation_entropy",
    "grid_pointing_game",
    "make_seqpg_examples",
    "mean_reciprocal_rank",
    "measure_cost",
    "next_token_contrast",
    "paired_accuracy_difference",
    "perplexity",
    "perturbable_mask",
    "perturbation_curves",
    "pixel_perturbation",
    "pixel_ranking",
    "probability_gap",
    "random_reciprocal_rank",
    "rationale_alignment",
    "reciprocal_rank",
    "seqpg_evidence_split",
    "seqpg_score",
    "special_tokens_mask",
    "token_scores",
    "top_k_iou",
    "top_k_masks",
]
