"""A small GPT-2's compact vocabulary and the Captum baselines of its contrastive next-token explanations.

Shared by examples/blimp_mrr.py and benchmarks/bench_decoders.py, which compare B-cos explanations with these
baselines on one and the same model.
"""

from __future__ import annotations

import time

import torch
from bcos_plugins.adapters.captum import EmbeddingForward
from captum.attr import InputXGradient, Occlusion, Saliency
from torch import Tensor

__all__ = ["CompactVocabulary", "captum_scores", "seconds_per_explanation"]


class CompactVocabulary:
    """The GPT-2 token ids that occur in the data, renumbered 0..n-1.

    A full 50,257-row embedding and LM head would dominate a tiny model's CPU time; keeping only the ids the
    slice uses leaves every sequence unchanged up to renumbering (``to_gpt2`` maps back for display).
    """

    def __init__(self, *id_tensors: Tensor) -> None:
        used = torch.unique(torch.cat([t.flatten() for t in id_tensors]))
        self.to_gpt2 = used
        self.from_gpt2 = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
        self.from_gpt2[used] = torch.arange(len(used))

    def __len__(self) -> int:
        return len(self.to_gpt2)

    def __call__(self, ids: Tensor) -> Tensor:
        return self.from_gpt2[ids]


def captum_scores(model, batch) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Token scores (and seconds taken) of Captum's Saliency (the B-cos LM paper's "Grad Norm": L1 norm of the
    gradient), InputXGradient and Occlusion for ``logit(target) - logit(foil)`` at each row's last token.

    ``batch`` holds ``input_ids``, ``attention_mask``, ``target_ids`` and ``foil_ids`` (an ``encode_blimp`` or
    ``encode_ioi`` batch). Every method attributes at :class:`EmbeddingForward`'s point, the one ``explain``
    uses (GPT-2: word + position embedding), so all methods are compared at one place; Occlusion replaces a
    token by the end-of-text embedding at the same position (the paper's in-distribution [PAD] choice).
    """
    forward = EmbeddingForward(model)
    ids, mask = batch.input_ids, batch.attention_mask

    def contrast(embedded, attention_mask, target, foil):
        # Captum repeats the additional arguments when it evaluates several perturbations per batch.
        logits = forward(embedded, attention_mask)
        return logits.gather(1, target[:, None]).squeeze(1) - logits.gather(1, foil[:, None]).squeeze(1)

    extra = (mask, batch.target_ids, batch.foil_ids)
    x = forward.embed(ids, mask)
    occluded = forward.embed(torch.full_like(ids, model.config.eos_token_id), mask)
    methods = {
        "Saliency": lambda: Saliency(contrast).attribute(x.clone().requires_grad_(), abs=True,
                                                         additional_forward_args=extra).sum(-1),
        "InputXGradient": lambda: InputXGradient(contrast).attribute(
            x.clone().requires_grad_(), additional_forward_args=extra).sum(-1),
        # one value per token, repeated over the embedding dimension by the (1, d) window
        "Occlusion": lambda: Occlusion(contrast).attribute(
            x, sliding_window_shapes=(1, x.shape[-1]), baselines=occluded, additional_forward_args=extra,
            perturbations_per_eval=4)[..., 0],
    }
    scores, seconds = {}, {}
    for name, run in methods.items():
        start = time.perf_counter()
        scores[name] = run().detach()
        seconds[name] = time.perf_counter() - start
    return scores, seconds


def seconds_per_explanation(timings: dict[str, list[tuple[float, int]]]) -> dict[str, float]:
    """Per method, its seconds summed over the batches divided by the explanations they held: ``timings`` maps a
    method to ``(seconds for the batch, explanations in it)`` per batch.

    Not the mean of each batch's seconds per explanation: the IOI batch holds 200 prompts and each BLiMP batch
    50, so that mean weighted an IOI explanation a quarter of a BLiMP one (and a batch's fixed cost 4x more)."""
    out = {}
    for method, parts in timings.items():
        n = sum(count for _, count in parts)
        if n <= 0:
            raise ValueError(f"timings[{method!r}]: no explanation timed; time at least one batch of one row")
        out[method] = sum(seconds for seconds, _ in parts) / n
    return out
