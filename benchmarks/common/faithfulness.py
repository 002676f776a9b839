"""The faithfulness benchmarks' explanation methods and evaluation loops, shared by
``benchmarks/bench_faithfulness.py`` (the method table) and ``benchmarks/bench_frontier.py`` (the B frontier).

- ``make_methods``: the table's rows (Captum's post-hoc methods on the conventional model at its attribution
  point, the ablations, ``BcosAttribution`` on the B-cos model), each a function of a :class:`Batch`;
- ``evaluate_sst2`` / ``evaluate_seqpg``: explain, time and score every method into :class:`MethodResult`
  (per-sentence perturbation curves, entropy, completeness; per-example SeqPG evidence split);
- ``seqpg_examples``: the two-segment examples the given models classify confidently and correctly.

``cfg`` is any settings object with the attributes a function reads (``batch``, ``ig_steps``,
``shapley_samples``, ``lime_samples``, ``perturbations_per_eval``; ``segment``, ``n_seqpg``, ``min_confidence`` for
SeqPG).

``perturbations_per_eval`` (BENCH_PERTURBATIONS_PER_EVAL; :func:`perturbations_per_eval`) is how many perturbed
copies of each explained sentence go through the model in one forward call, for every perturbation method
(ShapleyValueSampling, Lime and Occlusion through Captum's ``perturbations_per_eval``, the Comp/Suff curves through
``perturbation_curves``' ``batch_size``). It changes only how the same perturbed inputs are grouped into forward calls,
so the scores are equal up to floating-point rounding; 0 (the default) keeps the CPU's values of the published runs
and uses 256 on a CUDA device, where many small forward calls cost more than a few large ones.
IntegratedGradients already evaluates all its steps of a batch in one forward call (``internal_batch_size`` unset).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
from captum.attr import (
    InputXGradient,
    IntegratedGradients,
    LayerGradientXActivation,
    Lime,
    Occlusion,
    Saliency,
    ShapleyValueSampling,
)
from tqdm.auto import tqdm

from bcos_plugins import explain
from bcos_plugins.convert import dynamic_linear_copy, spec_for
from bcos_plugins.metrics import (
    PerturbationCurves,
    completeness_error,
    explanation_entropy,
    make_seqpg_examples,
    measure_cost,
    perturbation_curves,
    seqpg_evidence_split,
    special_tokens_mask,
)

__all__ = ["DEVICE", "MAX_LENGTH", "Batch", "Method", "MethodResult", "batches", "encode", "evaluate_seqpg",
           "evaluate_sst2", "explained_logits", "make_bcos_methods", "make_methods", "mask_baseline",
           "perturbation_curve_rows", "perturbations_per_eval", "predictions", "seqpg_examples", "token_feature_mask"]

MAX_LENGTH = 64
# GPU if present (the "GPU if present"); every model and batch is moved here
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# perturbed copies of a sentence per forward call with BENCH_PERTURBATIONS_PER_EVAL=0 on a CUDA device: every
# method's perturbations of a batch of BENCH_BATCH sentences up to MAX_LENGTH tokens (Shapley sampling: one per
# token per permutation; Lime's 100 default samples) fit in one call, a few hundred rows of MiniLM
GPU_PERTURBATIONS_PER_EVAL = 256
# ... and on the CPU the values the published tables were measured with (per method; rows per call for the curves)
CPU_PERTURBATIONS_PER_EVAL = {"ShapSampl": 16, "LIME": 32, "Occlusion": 16}
CPU_CURVE_ROWS = 64


def perturbations_per_eval(cfg, method: str, device: torch.device = DEVICE) -> int:
    """Perturbed copies of each sentence per forward call for ``method`` (a key of CPU_PERTURBATIONS_PER_EVAL):
    ``cfg.perturbations_per_eval`` when set (> 0), else the CPU's per-method value or GPU_PERTURBATIONS_PER_EVAL on
    a CUDA ``device``."""
    if cfg.perturbations_per_eval > 0:
        return cfg.perturbations_per_eval
    return GPU_PERTURBATIONS_PER_EVAL if device.type == "cuda" else CPU_PERTURBATIONS_PER_EVAL[method]


def perturbation_curve_rows(cfg, n_sentences: int, device: torch.device = DEVICE) -> int:
    """``perturbation_curves``' ``batch_size`` (rows per forward call) for a batch of ``n_sentences``: the
    setting's perturbations of every sentence, or CPU_CURVE_ROWS on the CPU when the setting is 0."""
    if cfg.perturbations_per_eval == 0 and device.type != "cuda":
        return CPU_CURVE_ROWS
    per_sentence = cfg.perturbations_per_eval or GPU_PERTURBATIONS_PER_EVAL
    return per_sentence * n_sentences


def _phase(per_method, name: str):
    """``per_method.phase(name)`` of a caller's budget (``bench_faithfulness.Budget``), or no timing."""
    return contextlib.nullcontext() if per_method is None else per_method.phase(name)


@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    target: torch.Tensor
    special: torch.Tensor


def mask_baseline(fwd: EmbeddingForward, batch: Batch, mask_id: int) -> torch.Tensor:
    """Combined embedding with every non-special token replaced by [MASK] (special tokens stay)."""
    ids = batch.ids.masked_fill(~batch.special & batch.mask.bool(), mask_id)
    return fwd.embed(ids, batch.mask)


def token_feature_mask(emb: torch.Tensor) -> torch.Tensor:
    """One Captum feature per token position, ``(1, pos, 1)``: Captum broadcasts it over the batch and the embedding
    dimension.

    Not expanded to the input's shape: ShapleyValueSampling reads every element of the mask with ``.item()`` once per
    permutation sample, batch x pos x hidden calls (460,000 per batch of 8 MiniLM sentences of 15 tokens at 10
    samples, against 11 forward calls), each a device synchronisation on a GPU. The attributions (and Lime's) are
    bitwise those of the expanded mask (tests/test_bench_frontier.py)."""
    return torch.arange(emb.shape[1], device=emb.device)[None, :, None]


@dataclass(frozen=True)
class Method:
    """One row of the table: which model it explains, how, and where its attributions are taken.

    ``decomposes_logit``: the row is input x gradient at its point, whose token scores are meant to add up to
    the explained logit (exactly for B-cos); the report gives its completeness error."""

    kind: str
    run: Callable[[Batch], torch.Tensor]
    point: str
    decomposes_logit: bool = False


def make_methods(conv, bcos, mask_id: int, cfg) -> dict[str, Method]:
    """name -> Method (model kind, function(batch) -> token scores (batch, pos), attribution point); with
    ``bcos=None`` only the conventional model's rows."""
    conv_fwd = EmbeddingForward(conv)

    def at_embedding(method_factory, fwd=conv_fwd, **kwargs):
        method = method_factory(fwd)

        def run(b: Batch) -> torch.Tensor:
            emb = fwd.embed(b.ids, b.mask)
            extra = {}
            if "baselines" in kwargs:
                extra["baselines"] = mask_baseline(fwd, b, mask_id)
            if kwargs.get("feature_mask"):
                extra["feature_mask"] = token_feature_mask(emb)
            call = {k: v for k, v in kwargs.items() if k not in ("baselines", "feature_mask")}
            attr = method.attribute(emb, target=b.target, additional_forward_args=(b.mask,), **call, **extra)
            return attr.detach().sum(-1)

        return run

    def attention(b: Batch) -> torch.Tensor:
        with torch.no_grad():
            att = conv(input_ids=b.ids, attention_mask=b.mask, output_attentions=True).attentions[-1]
        return att[:, :, 0, :].mean(1)

    bcos_rows = {} if bcos is None else make_bcos_methods(bcos)
    # paper Table 3: the conventional model itself as W(x) x + bias terms (non-linearities held constant)
    conv_wx = dynamic_linear_copy(conv)

    def conv_wx_run(b: Batch) -> torch.Tensor:
        return explain(conv_wx, b.ids, b.mask, target=b.target).contributions

    d = conv.config.hidden_size
    conv_point = conv_fwd.point.description
    methods = {
        "Attention": Method("conventional", attention, "last layer's attention, [CLS] row, mean over heads"),
        "IxG": Method("conventional", at_embedding(InputXGradient), conv_point, decomposes_logit=True),
        f"IG ({cfg.ig_steps} steps)": Method("conventional", at_embedding(IntegratedGradients,
                                                                          n_steps=cfg.ig_steps), conv_point),
        f"IG ({cfg.ig_steps} steps, [MASK] baseline)": Method("conventional", at_embedding(
            IntegratedGradients, baselines=True, n_steps=cfg.ig_steps), conv_point),
        "Saliency": Method("conventional", at_embedding(Saliency), conv_point),
        f"ShapSampl ({cfg.shapley_samples})": Method("conventional", at_embedding(
            ShapleyValueSampling, baselines=True, feature_mask=True, n_samples=cfg.shapley_samples,
            perturbations_per_eval=perturbations_per_eval(cfg, "ShapSampl")), conv_point),
        f"LIME ({cfg.lime_samples})": Method("conventional", at_embedding(
            Lime, baselines=True, feature_mask=True, n_samples=cfg.lime_samples,
            perturbations_per_eval=perturbations_per_eval(cfg, "LIME")), conv_point),
        "Occlusion": Method("conventional", at_embedding(
            Occlusion, baselines=True, sliding_window_shapes=(1, d), strides=(1, d),
            perturbations_per_eval=perturbations_per_eval(cfg, "Occlusion")), conv_point),
        "W(x)x of conv. (ablation)": Method(
            "conventional", conv_wx_run, EmbeddingForward(conv_wx).point.description + "; conventional model with "
            "attention, activation gates and LayerNorm scales held constant, biases kept (their share of the logit "
            "is attributed to no token)", decomposes_logit=True),
    }
    return {**methods, **bcos_rows}


def make_bcos_methods(bcos) -> dict[str, Method]:
    """The B-cos model's rows: its explanation and, as an ablation, plain IxG on it."""
    bcos_fwd = EmbeddingForward(bcos)
    bcos_method = BcosAttribution(bcos_fwd)

    def bcos_run(b: Batch) -> torch.Tensor:
        emb = bcos_fwd.embed(b.ids, b.mask)
        return bcos_method.attribute(emb, target=b.target, additional_forward_args=(b.mask,)).sum(-1)

    # Plain IxG on the B-cos model after its embedding LayerNorm, as for the conventional model: at the
    # combined embedding (the B-cos point) each token's score would be identically zero outside explanation
    # mode, since that LayerNorm ignores the scale of each token's vector
    bcos_ln = spec_for(bcos).embedding_module(bcos)[0]
    bcos_layer_ixg = LayerGradientXActivation(
        lambda ids, mask: bcos(input_ids=ids, attention_mask=mask).logits, bcos_ln)
    bcos_ixg_point = ("output of the B-cos model's embedding LayerNorm (after the embedding LayerNorm, where input x "
                      "gradient is not zero); plain gradient, not in explanation mode")

    def bcos_ixg(b: Batch) -> torch.Tensor:
        return bcos_layer_ixg.attribute(b.ids, target=b.target, additional_forward_args=(b.mask,)).detach().sum(-1)

    return {
        "IxG on B-cos (ablation)": Method("bcos", bcos_ixg, bcos_ixg_point, decomposes_logit=True),
        "B-cos": Method("bcos", bcos_run, bcos_fwd.point.description, decomposes_logit=True),
    }


# ---------------------------------------------------------------- evaluation


@dataclass
class MethodResult:
    seconds: float = 0.0
    n: int = 0
    peak_mib: float = 0.0
    curves: list[PerturbationCurves] = field(default_factory=list)
    entropy: list[torch.Tensor] = field(default_factory=list)
    seqpg: list[torch.Tensor] = field(default_factory=list)  # (n, 3): right segment, wrong segment, special
    seqpg_seconds: float = 0.0
    memory_method: str = ""
    point: str = ""
    kind: str = ""
    completeness: list[torch.Tensor] = field(default_factory=list)  # |sum of scores - logit| / |logit| per row


def encode(tokenizer, texts, max_length: int = MAX_LENGTH):
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def batches(ids, mask, target, tokenizer, size):
    for start in range(0, ids.shape[0], size):
        sl = slice(start, start + size)
        b_ids, b_mask = ids[sl], mask[sl]
        keep = int(b_mask.sum(-1).max())  # trim common right padding: fewer features for perturbation methods
        b_ids, b_mask = b_ids[:, :keep], b_mask[:, :keep]
        yield Batch(b_ids.to(DEVICE), b_mask.to(DEVICE), target[sl].to(DEVICE),
                    special_tokens_mask(tokenizer, b_ids).to(DEVICE))


@torch.no_grad()
def predictions(model, ids, mask, size: int = 64):
    return torch.cat([model(input_ids=ids[s : s + size].to(DEVICE),
                            attention_mask=mask[s : s + size].to(DEVICE)).logits.argmax(-1).cpu()
                      for s in range(0, ids.shape[0], size)])


def evaluate_sst2(methods, models, tokenizer, texts, cfg, results: dict[str, MethodResult],
                  per_method=None):
    ids, mask = encode(tokenizer, texts)
    # Batches of sentences of similar length: a batch is cut to its longest sentence, and ShapleyValueSampling
    # perturbs every position of it for the whole batch, so its cost grows with (longest length)^2 per batch.
    # Every metric is a mean over sentences, so the order changes no number beyond the samplers' noise.
    by_length = torch.argsort(mask.sum(-1), stable=True)
    ids, mask = ids[by_length], mask[by_length]
    preds = {kind: predictions(m, ids, mask) for kind, m in models.items()}
    for name, method in tqdm(methods.items(), desc="SST-2 Comp/Suff", file=sys.stdout):
        kind, run = method.kind, method.run
        res = results.setdefault(name, MethodResult(point=method.point, kind=kind))
        explained = []
        with _phase(per_method, f"SST-2 {name}"):
            # warm-up, untimed, on one sentence: lazy initialisation is per method, not per row
            run(next(batches(ids[:1], mask[:1], preds[kind][:1], tokenizer, 1)))
            for b in batches(ids, mask, preds[kind], tokenizer, cfg.batch):
                scores, cost = measure_cost(run, b)
                res.seconds += cost.seconds
                res.n += b.ids.shape[0]
                res.peak_mib = max(res.peak_mib, cost.peak_mib)
                res.memory_method = cost.memory_method
                explained.append((b, scores))
        with _phase(per_method, "SST-2 metrics (Comp/Suff curves, entropy, completeness)"):
            for b, scores in explained:
                res.curves.append(perturbation_curves(models[kind], b.ids, b.mask, scores, special_tokens=b.special,
                                                      target=b.target,
                                                      batch_size=perturbation_curve_rows(cfg, b.ids.shape[0])))
                res.entropy.append(explanation_entropy(scores, b.mask & ~b.special))
                if method.decomposes_logit:
                    res.completeness.append(completeness_error(scores, explained_logits(models[kind], b)))


@torch.no_grad()
def explained_logits(model, b: Batch) -> torch.Tensor:
    return model(input_ids=b.ids, attention_mask=b.mask).logits.gather(1, b.target[:, None]).squeeze(1)


def evaluate_seqpg(methods, models, tokenizer, examples, cfg, results: dict[str, MethodResult],
                   per_method=None):
    ids, mask, targets = examples.explanation_batch()
    special = special_tokens_mask(tokenizer, ids)
    for name, method in tqdm(methods.items(), desc="SeqPG", file=sys.stdout):
        run = method.run
        res = results.setdefault(name, MethodResult(point=method.point, kind=method.kind))
        rows = []
        with _phase(per_method, f"SeqPG {name}"):
            for start in range(0, ids.shape[0], cfg.batch):
                sl = slice(start, start + cfg.batch)
                b = Batch(ids[sl].to(DEVICE), mask[sl].to(DEVICE), targets[sl].to(DEVICE), special[sl].to(DEVICE))
                scores, cost = measure_cost(run, b)
                res.seqpg_seconds += cost.seconds
                rows.append(scores.cpu())
        res.seqpg.append(seqpg_evidence_split(torch.cat(rows), examples.segment_masks, examples.attention_mask))


def seqpg_examples(conv, bcos, tok, data, cfg):
    """SeqPG examples both models (``bcos=None``: the conventional one) classify confidently and correctly, or
    None with the reason printed."""
    try:
        return make_seqpg_examples([conv] if bcos is None else [conv, bcos], tok, data.texts, data.labels, segment_length=cfg.segment,
                                   n_examples=cfg.n_seqpg, min_confidence=cfg.min_confidence)
    except ValueError as err:  # e.g. an undertrained model is nowhere confident: report the rest of the table
        print(f"SeqPG skipped: {err}")
        return None
