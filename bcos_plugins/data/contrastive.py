"""The batch shape of contrastive next-token tasks (BLiMP, IOI): what ``explain(..., target=, foil=)`` and
``mean_reciprocal_rank(scores, evidence, candidates)`` read, shared by :class:`~bcos_plugins.data.BlimpBatch` and
:class:`~bcos_plugins.data.IOIBatch` so the metrics take either unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Bool, Int
from torch import Tensor

__all__ = ["ContrastiveBatch"]


@dataclass
class ContrastiveBatch:
    """Tokenised prompts, left-padded, with the token to explain against its foil and the evidence to find.

    ``evidence`` marks the tokens a faithful explanation should rank first; ``candidates`` the tokens that are
    ranked (real prompt tokens, BOS excluded).
    """

    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    target_ids: Int[Tensor, " batch"]
    foil_ids: Int[Tensor, " batch"]
    evidence: Bool[Tensor, "batch pos"]
    candidates: Bool[Tensor, "batch pos"]

    def __len__(self) -> int:
        return self.target_ids.shape[0]
