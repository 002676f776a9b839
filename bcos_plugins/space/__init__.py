"""Space Model (Tytarenko & Amin): a concept-operator classification head with exact context attribution.

- :class:`SpaceModelForSequenceClassification` / :class:`SpaceModelConfig`: the head over any transformers
  encoder, a ``PreTrainedModel`` (``save_pretrained`` / ``from_pretrained``, Trainer-ready ``loss``);
- :mod:`~bcos_plugins.space.losses`: inter-space and intra-space terms;
- :func:`context_attribution`: each token's exact share of a logit, as a :class:`SpaceExplanation`;
- :func:`zero_shot_evaluation`: train on one dataset, evaluate on another (SST-2 -> rt_polarity).
"""

from .attribution import SpaceExplanation, concept_contributions, context_attribution
from .losses import inter_space_loss, intra_space_loss, intra_space_weight_from_paper
from .modeling import (
    SpaceHead,
    SpaceModelConfig,
    SpaceModelForSequenceClassification,
    SpaceModelOutput,
    masked_mean,
    register_auto_classes,
)
from .zero_shot import (
    classification_scores,
    predict_labels,
    read_rt_polarity,
    read_sst2_tsv,
    zero_shot_evaluation,
)

register_auto_classes()

__all__ = [
    "SpaceExplanation",
    "SpaceHead",
    "SpaceModelConfig",
    "SpaceModelForSequenceClassification",
    "SpaceModelOutput",
    "classification_scores",
    "concept_contributions",
    "context_attribution",
    "inter_space_loss",
    "intra_space_loss",
    "intra_space_weight_from_paper",
    "masked_mean",
    "predict_labels",
    "read_rt_polarity",
    "read_sst2_tsv",
    "register_auto_classes",
    "zero_shot_evaluation",
]
