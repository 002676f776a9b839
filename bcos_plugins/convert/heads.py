"""B-cos subclasses of transformers modules whose forward applies a head activation inline.

``bcosify`` swaps the class of the existing instance (parameters and state-dict keys are unchanged) for
these subclasses, which run the same computation without the tanh / ReLU: the B-cos LM recipe removes
head activations (they are not dynamic-weight and the B > 1 non-linearity replaces them).
"""

from __future__ import annotations

import torch
from transformers.loss.loss_utils import ForSequenceClassificationLoss
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.distilbert.modeling_distilbert import DistilBertForSequenceClassification
from transformers.models.roberta.modeling_roberta import RobertaClassificationHead
from transformers.utils import can_return_tuple


class BcosRobertaClassificationHead(RobertaClassificationHead):
    """``RobertaClassificationHead`` without the tanh between ``dense`` and ``out_proj``."""

    def forward(self, features: torch.Tensor, **kwargs) -> torch.Tensor:
        x = self.dropout(features[:, 0, :])
        x = self.dropout(self.dense(x))
        return self.out_proj(x)


class StockNamedModel:
    """Mixin of a B-cos class that replaces a transformers model's own class (bcosify's swap of the model itself):
    ``_get_name()`` is the stock class's name, the first transformers class of the MRO.

    transformers keys behaviour on that name: ``Trainer.compute_loss`` shifts the labels for label smoothing only
    when ``model._get_name()`` is in its causal-LM mapping, so a user's own ``Trainer(label_smoothing_factor=...)``
    trained a ``BcosGemma2ForCausalLM`` on its unshifted labels (each token predicted from itself), silently. The
    class itself keeps its B-cos name: ``repr``, pickling and ``save_pretrained``'s ``architectures`` read it."""

    def _get_name(self) -> str:
        return next(c.__name__ for c in type(self).__mro__ if c.__module__.startswith("transformers."))

    def __repr__(self) -> str:
        # nn.Module's repr starts with _get_name(): the printed model names its B-cos class, as before
        return type(self).__name__ + super().__repr__()[len(self._get_name()):]


class BcosDistilBertForSequenceClassification(StockNamedModel, DistilBertForSequenceClassification):
    """``DistilBertForSequenceClassification`` without the ReLU after ``pre_classifier``."""

    # ``return_dict=False`` (the call's or the config's) gives transformers' tuple, as the stock forward does: the
    # output object came back instead, whose unpacking (``loss, logits = model(..., return_dict=False)``) gave its
    # key names, the strings "loss" and "logits"
    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                position_ids=None, **kwargs) -> SequenceClassifierOutput:
        out = self.distilbert(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                              position_ids=position_ids, return_dict=True, **kwargs)
        pooled = self.dropout(self.pre_classifier(out[0][:, 0]))
        logits = self.classifier(pooled)
        # transformers' own loss for the configured problem type, as the stock forward computes it.
        loss = ForSequenceClassificationLoss(labels, logits, self.config) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions)
