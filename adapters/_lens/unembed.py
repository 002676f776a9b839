"""``BcosSoftCappedUnembed``: TransformerLens' unembedding followed by a final-logit soft-cap held as a dynamic scale.

Gemma 2 soft-caps its logits, ``c * tanh(z / c)``. TransformerLens' ``HookedTransformer.forward`` applies that inline
(``cfg.output_logits_soft_cap``), outside any module, so explanation mode cannot hold it constant and explanations
of the capped logits would be incomplete. A B-cos model applies it in its unembedding instead, as the B-cos
transformers head does (:class:`bcos_plugins.convert.gemma.BcosSoftCappedLMHead`, the same
:func:`~bcos_plugins.nn.activation.soft_cap_scale`)::

    z      = resid @ W_U                          -> unembed.hook_out (the uncapped logits)
    g      = tanh(z / c) / (z / c)                -> unembed.hook_soft_cap (a DynamicHookPoint)
    logits = z * g                                  (= c * tanh(z / c))

``c`` is the config's ``bcos_output_logits_soft_cap`` (:class:`~.config.BcosTransformerConfig` moves a positive
``output_logits_soft_cap`` there, so TransformerLens' forward does not cap a second time).
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor
from transformer_lens.components import Unembed

from bcos_plugins.nn.activation import soft_cap_scale

from .hook_point import DynamicHookPoint

__all__ = ["BcosSoftCappedUnembed"]


class BcosSoftCappedUnembed(Unembed):
    """B-cos version of TransformerLens' ``Unembed`` for a soft-capped model (see the module docstring)."""

    def convert_to_soft_capped(self) -> None:
        """Add the soft-cap's hook point (after swapping an ``Unembed``'s class to this one)."""
        self.hook_soft_cap = DynamicHookPoint()

    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab_out"]:
        logits = super().forward(residual)
        gate = soft_cap_scale(self.hook_soft_cap, logits, self.cfg.bcos_output_logits_soft_cap)
        return logits * self.hook_soft_cap(gate)
