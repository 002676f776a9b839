"""The B-cos masked-LM head: BERT's prediction head with its vocabulary bias left out.

``bcosify`` converts the head's transform (dense, GELU, LayerNorm) like the rest of the model and keeps the
decoder, which is tied to the word embeddings (as the B-cos LM paper keeps LM heads). The stock decoder also
adds a per-token bias; a bias is a contribution no input token makes, so explanations of masked-LM logits would
not sum to the logit. This subclass applies the tied decoder weight without it (the ``bias`` parameter stays in
the state dict, unused, so checkpoints keep the stock layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.bert.modeling_bert import BertLMPredictionHead


class BcosBertLMPredictionHead(BertLMPredictionHead):
    """``BertLMPredictionHead`` whose decoder (tied to the word embeddings) adds no vocabulary bias."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden_states), self.decoder.weight)
