"""Bilinear MLPs and weight-based analysis (Pearce, Dooms et al., ICLR 2025); maths in docs/design.md#bilinear-layers.

- :class:`BilinearMLP`: ``P ((W x) * (V x))``, a :class:`~bcos_plugins.nn.DynamicWeightModule`.
- :func:`bilinear_weights`: ``(W, V, P)`` from our module, a TransformerLens bilinear ``GatedMLP``, a
  transformers gated MLP with the identity activation, or plain tensors; biases via the augmented input.
- :func:`interaction_matrix` ``Q(u)``, :func:`eigendecompose`, :func:`interaction_spectra`, :func:`hosvd`,
  :func:`truncation_curve`, :func:`adversarial_masks`, :func:`effective_rank`, :func:`l1_l2_sparsity`.
- :class:`SwishBetaToBilinear`: a ``transformers.TrainerCallback`` turning a SwiGLU model bilinear (App. J);
  :func:`load_annealing_checkpoint` loads its checkpoints saved while the gates anneal.
"""

from .eigen import (
    Eigendecomposition,
    effective_rank,
    eigendecompose,
    eigenvector_activations,
    interaction_spectra,
    l1_l2_sparsity,
    top_eigen_indices,
)
from .hosvd import HOSVD, hosvd
from .interaction import bilinear_tensor, interaction_matrix, iter_interaction_matrices
from .masks import AdversarialMasks, adversarial_masks, pseudo_inverse_masks
from .module import BilinearMLP
from .sources import bilinear_weights
from .truncation import TruncationCurve, truncated_outputs, truncation_curve
from .weights import BilinearWeights, augment_input

__all__ = [
    "HOSVD",
    "AdversarialMasks",
    "BilinearMLP",
    "BilinearWeights",
    "Eigendecomposition",
    "SwishBetaToBilinear",
    "TruncationCurve",
    "adversarial_masks",
    "augment_input",
    "bilinear_tensor",
    "bilinear_weights",
    "effective_rank",
    "eigendecompose",
    "eigenvector_activations",
    "hosvd",
    "interaction_matrix",
    "interaction_spectra",
    "iter_interaction_matrices",
    "load_annealing_checkpoint",
    "l1_l2_sparsity",
    "pseudo_inverse_masks",
    "top_eigen_indices",
    "truncated_outputs",
    "truncation_curve",
]


def __getattr__(name: str):
    # swish_beta imports transformers' Trainer machinery; load it only when asked for.
    if name in ("SwishBetaToBilinear", "SwishBeta", "finalize_bilinear", "set_swish_beta", "load_annealing_checkpoint"):
        from . import swish_beta

        return getattr(swish_beta, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
