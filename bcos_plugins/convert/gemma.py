"""B-cos mixins for Gemma 2: its RMSNorm with a ``(1 + weight)`` gain and its soft-capped final logits.

``bcosify`` mixes these into the classes of the existing instances (attribute names, parameters and state-dict
keys stay transformers'), as it does for gated MLPs.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import can_return_tuple

from ..nn.activation import soft_cap_scale
from ..nn.dynamic import DynamicWeightModule
from ..nn.functional import at_least_float32
from .heads import StockNamedModel

try:  # the helper the stock Gemma 2 forward calls in recent transformers
    from transformers.modeling_utils import slice_logits_to_keep
except ImportError:  # older transformers (the declared floor, 5.9): the stock forward's own inline slice

    def slice_logits_to_keep(hidden_states: Tensor, logits_to_keep: int | Tensor) -> Tensor:
        indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return hidden_states[:, indices, :]


# The key-value cache's name in the model's forward and outputs: ``cache`` in recent transformers, ``past_key_values``
# up to the declared floor's generation (5.9); the stock forward this class replaces uses its own version's name.
_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

__all__ = ["BcosGemmaRMSNorm", "BcosSoftCappedLMHead", "BcosUncappedCausalLM"]


class BcosGemmaRMSNorm(DynamicWeightModule):
    """Gemma's RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + weight)`` whose rsqrt factor is the dynamic weight.

    Gemma stores the gain as an offset from 1 (its weights start at 0), so the package's
    :class:`~bcos_plugins.nn.DetachableRMSNorm` (gain ``weight``) would compute another model: the stock
    module keeps its parameter and only its forward changes. Half-precision inputs are computed in float32 and
    cast back, as the stock forward does; float64 ones stay float64 (the stock forward's ``x.float()`` narrows
    them to float32, a rounding on the path from input to output that explanation mode cannot hold constant, so
    a float64 model's explanations were complete only to float32's rounding and ``explain`` refused them).
    """

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        wide = x.to(at_least_float32(x.dtype))
        # not explaining: the same steps without the scope and detach calls (docs/benchmarks.md, 2026-11-28 16:16
        # UTC: a small model's forward pays their Python per module and call)
        if not self.explaining:
            inv_rms = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
            return (wide * inv_rms * (1.0 + self.weight.to(wide.dtype))).type_as(x)
        with self.dynamic_scope():
            inv_rms = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * self.dynamic_weight(inv_rms) * (1.0 + self.weight.to(wide.dtype))).type_as(x)


class BcosSoftCappedLMHead(DynamicWeightModule):
    """An LM head whose logits are soft-capped, ``c * tanh(z / c)`` (Gemma 2's ``config.final_logit_softcapping``),
    written ``z * g`` with ``g = tanh(z / c) / (z / c)`` the dynamic weight: the values are the stock model's
    (float rounding apart), and in explanation mode the logits are linear in the head's input, so explanations of
    them stay complete.

    The cap lives in the head, not in the model's forward (:class:`BcosUncappedCausalLM`), so that it is held
    constant wherever the head runs, also inside a TransformerLens bridge, which calls the model's forward from
    outside its own module tree. ``bcosify`` hands the head the model's own config through :meth:`bcos_configure`,
    and the cap is read from it at every call, as the stock forward reads ``config.final_logit_softcapping``: a cap
    copied once at conversion ignored a later edit of the config (``model.config.final_logit_softcapping = None``),
    which ``save_pretrained`` wrote and ``load_bcos_model`` then applied, so the reloaded model computed other logits
    than the saved one, silently.
    """

    _bcos_config = None
    # its forward runs the head's own (super().forward) and caps what it returns, so bcosify takes any class there
    runs_own_forward = True

    def bcos_configure(self, config) -> None:
        self._bcos_config = config

    @property
    def soft_cap(self) -> float | None:
        """The final-logit soft-cap ``c`` the head applies now: the model config's ``final_logit_softcapping``."""
        return None if self._bcos_config is None else self._bcos_config.final_logit_softcapping

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... vocab"]:
        logits = super().forward(x)
        soft_cap = self.soft_cap
        if soft_cap is None:
            return logits
        scale = self.dynamic_weight(soft_cap_scale(self, logits, soft_cap))
        if not torch.is_grad_enabled():  # nothing recorded: the product written into the fresh scale (same bits)
            return scale.mul_(logits)
        return logits * scale


class BcosUncappedCausalLM(StockNamedModel, nn.Module):
    """``Gemma2ForCausalLM.forward`` without its inline final-logit soft-cap, which its LM head applies instead
    (:class:`BcosSoftCappedLMHead`)."""

    def set_output_embeddings(self, new_embeddings):
        # resize_token_embeddings of an untied model puts in a fresh nn.Linear head: without the soft-cap it gave
        # uncapped logits (16 % off the capped ones, and another model than load_bcos_model rebuilt), silently
        old = self.get_output_embeddings()
        if type(new_embeddings) is nn.Linear and isinstance(old, BcosSoftCappedLMHead) and isinstance(old, nn.Linear):
            new_embeddings.__class__ = type(old)  # bcosify's mixed class of the head it replaces
            new_embeddings.bcos_configure(self.config)
        super().set_output_embeddings(new_embeddings)

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, **kwargs) -> CausalLMOutputWithPast:
        if "past_key_values" in kwargs:  # the name transformers deprecates for ``cache``
            cache = kwargs.pop("past_key_values")
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, use_cache=use_cache, **{_CACHE: cache}, **kwargs)
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions, **{_CACHE: getattr(outputs, _CACHE)})
