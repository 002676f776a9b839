"""Self-Guided Attention (Gu): human rationale masks inside attention during training, and gold masks.

- :func:`guide_attention` / :func:`unguide_attention`: guidance in the last L layers of a transformers
  BERT-family model (Eq. 3, 4, 5, renormalised product), fed by ``model(..., rationale_mask=M)`` in training;
- :func:`guidance_hooks`: the same guidance as TransformerLens hooks on ``hook_attn_scores``;
- gold masks from character spans or highlighted words, and the random control of equal sparsity;
- :func:`attention_supervision_loss`: a training loss pulling the [CLS] attention of the guided layers
  towards the normalised gold mask (or, ``objective="rank"``, only ranks the rationale first), so rationale
  alignment survives evaluation without masks, and
  :func:`supervision_warmup_factor`, the linear warm-up of its weight, with :class:`PlateauGate` to start
  it once the task loss has left its plateau, and :class:`PlateauRestart`, the rule that restarts a run
  still on the plateau at a fixed point of its training;
- :func:`attention_token_scores`: [CLS] attention as token scores for the rationale metrics
  (:mod:`bcos_plugins.metrics.rationale`).
"""

from .attention import (
    GUIDED_IMPLEMENTATIONS,
    GoldMaskAtEvaluationError,
    RationaleGuidance,
    attention_token_scores,
    guide_attention,
    guided_layers,
    register_guided_attention,
    unguide_attention,
)
from .guidance import GUIDANCE_MODES, guide_scores
from .hooks import attn_scores_guidance_hook, guidance_hooks
from .masks import (
    find_span,
    gold_mask_from_spans,
    gold_mask_from_words,
    hatexplain_word_rationale,
    parse_esnli_question,
    random_rationale_mask,
    text_token_mask,
)
from .supervision import (
    SUPERVISION_OBJECTIVES,
    PlateauGate,
    PlateauRestart,
    PlateauWatch,
    attention_supervision_loss,
    supervision_warmup_factor,
)

__all__ = [
    "GUIDANCE_MODES",
    "GUIDED_IMPLEMENTATIONS",
    "GoldMaskAtEvaluationError",
    "PlateauGate",
    "PlateauRestart",
    "PlateauWatch",
    "RationaleGuidance",
    "SUPERVISION_OBJECTIVES",
    "attention_supervision_loss",
    "attention_token_scores",
    "attn_scores_guidance_hook",
    "find_span",
    "gold_mask_from_spans",
    "gold_mask_from_words",
    "guidance_hooks",
    "guide_attention",
    "guide_scores",
    "guided_layers",
    "hatexplain_word_rationale",
    "parse_esnli_question",
    "random_rationale_mask",
    "register_guided_attention",
    "supervision_warmup_factor",
    "text_token_mask",
    "unguide_attention",
]
