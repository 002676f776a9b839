"""The token-id dtype rule every adapter applies where ids enter (one place, one message)."""

from __future__ import annotations

import torch
from torch import Tensor

from bcos_plugins.errors import BcosTypeError

__all__ = ["require_token_ids"]

# Embedding layers take int64 / int32 indices; a uint8 index tensor is read as a mask by tensor indexing
# (TransformerLens' W_E[tokens]) or refused deep inside torch, and a narrow dtype may already have wrapped ids
TOKEN_ID_DTYPES = (torch.int64, torch.int32)


def require_token_ids(name: str, ids: Tensor) -> None:
    """Refuse an integer tensor of ids whose dtype an embedding cannot index with as meant."""
    if isinstance(ids, Tensor) and not ids.is_floating_point() and ids.dtype not in TOKEN_ID_DTYPES \
            and ids.dtype != torch.bool:
        raise BcosTypeError(f"{name}: token ids of dtype {ids.dtype} are not indexed as ids (embedding layers take "
                            f"torch.long or torch.int32; a uint8 index selects by mask). Pass {name}.long()")
