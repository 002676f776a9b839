"""Placeholder package; see the open issues."""
from .attributions import perturbable_mask, special_tokens_mask, token_scores
from .perturbation import DEFAULT_FRACTIONS, PerturbationCurves, aopc, perturbation_curves, top_k_masks
from .pointing import SeqPGExamples, make_seqpg_examples, seqpg_score
from .summary import Cost, completeness_error, explanation_entropy, measure_cost
