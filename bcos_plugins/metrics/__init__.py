"""Placeholder package; see the open issues."""
from .attributions import perturbable_mask, special_tokens_mask, token_scores
from .perturbation import DEFAULT_FRACTIONS, PerturbationCurves, aopc, perturbation_curves, top_k_masks
from .pointing import SeqPGExamples, make_seqpg_examples, seqpg_score
from .summary import Cost, completeness_error, explanation_entropy, measure_cost
from .rationale import RationaleAlignment, average_precision, rationale_alignment, top_k_iou
from .image import IMAGE_FRACTIONS, PixelPerturbation, grid_pointing_game, pixel_perturbation, pixel_ranking
from .decoder import MRRResult, expected_random_reciprocal_rank, mean_reciprocal_rank, probability_gap, random_reciprocal_rank, reciprocal_rank
