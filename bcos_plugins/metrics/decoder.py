"""Metrics for contrastive next-token explanations of decoders (B-cos LM paper §7, docs/design.md#metrics).

- **Reciprocal rank** of one explanation: rank the candidate tokens of the prefix by score (descending) and
  take ``1 / rank`` of the best-ranked evidence token. MRR is its mean over examples. Ties keep the prefix
  order (a stable sort, as the paper's evaluation code sorts). Rows that have no evidence token, or whose candidates'
  scores are all equal (a single candidate too), have no rank (NaN) and are left out of the mean and of the random
  baseline's mean (one selection of rows, ``MRRResult.n``): the paper's code leaves out rows of zeros, and a row of
  equal non-zero scores has no more ranking (its rank was the tie rule's: 1 where the evidence comes first). Until
  2026-11-29 only rows of zeros were left out here. The rule, one with :func:`~bcos_plugins.metrics.top_k_iou`: a
  row whose scores are all equal is NaN where the metric's definition needs the scores to order the row's tokens. A
  rank always needs an order, so every tied row is left out here, also a row of one candidate (rank 1 for every
  method and for chance: no information) and a tied row whose candidates are all evidence; a top k needs one only to
  pick k of the valid tokens, so top_k_iou counts a tied row where k takes them all. Neither metric leaves out a row
  its scores do order, even where every order gives the same value (all candidates evidence; k taking every token).
- **Random baseline**: the expected reciprocal rank when the ``n`` candidates are ranked uniformly at random and
  ``k`` of them are evidence. The best evidence rank is ``r`` with probability ``C(n - r, k - 1) / C(n, k)``
  (the other ``k - 1`` evidence tokens all rank below ``r``), so

      E[1 / min rank] = sum_{r=1}^{n-k+1} C(n - r, k - 1) / (r C(n, k))

  which is the formula of the paper's code (``expected_inverse_of_min``), extended to ``k == n`` (value 1).
- **Probability gap**: ``p(target) - p(foil)`` under the softmax of the next-token logits at the explained
  position (the paper's Table 5 / 13 "probability gap"); :func:`next_token_contrast` runs a model on a BLiMP
  or IOI batch and returns it with the logit difference and the accuracy (IO logit > S logit for IOI).
- **Perplexity**: ``exp`` of the mean next-token negative log-likelihood on held-out text (:func:`perplexity`),
  the paper's measure of how much language-modelling ability B-cosification keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .._checks import bad_rows, require_int, require_row_ids, require_same_shape, require_tensor
from ..convert.architectures import position_limit, vocabulary_size
from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import evaluating
from ..nn.functional import at_least_float32
from .attributions import refuse_boolean_scores, scores_and_positions

__all__ = [
    "MRRResult",
    "NextTokenContrast",
    "PerplexityResult",
    "expected_random_reciprocal_rank",
    "mean_reciprocal_rank",
    "next_token_contrast",
    "perplexity",
    "probability_gap",
    "random_reciprocal_rank",
    "reciprocal_rank",
]


def _check_masks(scores: Tensor, evidence: Tensor, candidates: Tensor | None) -> Tensor:
    # finite=False: only the candidate tokens' scores must be finite (reciprocal_rank's check), as in the rationale
    # metrics, whose positions outside valid_mask never enter
    scores = require_tensor("scores", scores, ndim=2, kind="real", finite=False, shape_hint="(batch, pos)")
    if 0 in scores.shape:
        raise argument_error("scores", f"are empty (shape {tuple(scores.shape)})",
                             "Pass the scores of at least one token of one example")
    evidence = require_tensor("evidence", evidence, ndim=2, kind="mask")
    require_same_shape("evidence", evidence, "scores", scores, "Pass one flag per scored token")
    if candidates is None:
        candidates = torch.ones_like(scores, dtype=torch.bool)
    else:
        candidates = require_tensor("candidates", candidates, ndim=2, kind="mask")
        require_same_shape("candidates", candidates, "scores", scores, "Pass one flag per scored token")
    candidates = candidates.bool()
    if (evidence.bool() & ~candidates).any():
        rows = (evidence.bool() & ~candidates).any(1).nonzero().flatten().tolist()
        raise argument_error("evidence", f"rows {rows} mark evidence outside the candidate tokens (padding, "
                             "excluded tokens, or tokens after a causal explanation's position, which its output does "
                             "not see)", "Evidence must be a subset of the ranked prefix tokens")
    return candidates


def reciprocal_rank(
    scores: Float[Tensor, "batch pos"],
    evidence: Bool[Tensor, "batch pos"],
    candidates: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, " batch"]:
    """``1 / rank`` of the best-ranked evidence token per row, float64 (NaN where undefined, see module docstring).

    Args:
        scores: token scores of a contrastive explanation (higher = more evidence for target over foil), a method's
            attributions at the embeddings ``(batch, pos, d)`` (or Captum's one-input tuple; summed over ``d``), or the
            explanation itself (``explain(..., target=, foil=)``: its contributions, and its ``attention_mask`` as the
            default ``candidates``).
        evidence: True on the ground-truth evidence tokens.
        candidates: tokens that take part in the ranking (True), e.g. the real prefix tokens without padding
            and BOS; default: all positions (an explanation's real tokens, those its explained output sees: a causal
            model's explanation at an earlier ``position`` leaves out the tokens after it). Padding left among the
            candidates takes part in the ranking: a padded batch's rows rank otherwise than alone.
    """
    scores, candidates = scores_and_positions(scores, candidates, ranked_as="candidates")
    # the checked tensors are used below: lists passed the checks, then failed on .detach() / .bool(). A NaN at a
    # padding token (not a candidate) was refused as "NaN or inf in row [0]. Pass finite values", where the check below
    # (candidate tokens only) meant to take it
    scores = require_tensor("scores", scores, ndim=2, kind="real", finite=False, shape_hint="(batch, pos)")
    refuse_boolean_scores("scores", scores)  # flags: their ties ranked evidence by position, silently
    evidence = require_tensor("evidence", evidence, ndim=2, kind="mask")
    candidates = _check_masks(scores, evidence, candidates)
    bad = ~torch.isfinite(scores.detach().double()) & candidates
    if bad.any():
        raise argument_error("scores", f"contain NaN or inf at candidate tokens in {bad_rows(bad)}",
                             "Fix the attribution method for those rows")
    # Non-candidates sink below every candidate; a stable descending sort keeps prefix order among ties.
    ranked = scores.detach().to(torch.float64).masked_fill(~candidates, float("-inf"))
    order = ranked.sort(dim=1, descending=True, stable=True).indices
    evidence_in_order = evidence.bool().gather(1, order)
    has_evidence = evidence_in_order.any(1)
    best_rank = evidence_in_order.to(torch.long).argmax(1) + 1
    rr = 1.0 / best_rank.to(torch.float64)
    # all candidates' scores equal (all zero: the paper's rule; or a constant): no ranking, the rank was the tie rule's
    # pick by position (1.0 where the evidence came first), where top_k_iou leaves such rows out
    values = scores.detach().to(torch.float64)
    tied = values.masked_fill(~candidates, float("inf")).amin(1) == values.masked_fill(~candidates, float("-inf")).amax(1)
    return rr.masked_fill(~has_evidence | tied, float("nan"))


def expected_random_reciprocal_rank(n_candidates: int, n_evidence: int) -> float:
    """Expected ``1 / rank`` of the best of ``n_evidence`` evidence tokens among ``n_candidates`` ranked at random.

    ``sum_r t_r / r`` over the best rank ``r = 1 .. n - k + 1``, with ``t_r = C(n - r, k - 1) / C(n, k)`` the chance
    that it is ``r``, by the recurrence ``t_1 = k / n``, ``t_(r+1) = t_r (n - r - k + 1) / (n - r)``: every number
    stays in [0, 1] (the binomial coefficients themselves overflowed a float from about n = 1,030 on, e.g. 2,000
    candidates with 1,000 evidence tokens raised OverflowError).
    """
    n = require_int("n_candidates", n_candidates, minimum=1)
    k = require_int("n_evidence", n_evidence)
    if not 1 <= k <= n:
        raise argument_error("n_evidence", f"need 1 <= n_evidence <= n_candidates, got n_evidence={k}, "
                             f"n_candidates={n}", "Count the evidence tokens among the candidates")
    chance, expected = k / n, 0.0
    for r in range(1, n - k + 2):
        expected += chance / r
        chance *= (n - r - k + 1) / (n - r) if r < n else 0.0
        if chance == 0.0:  # every later rank is less likely still (and ranks past n - k + 1 impossible)
            break
    return expected


def random_reciprocal_rank(
    evidence: Bool[Tensor, "batch pos"], candidates: Bool[Tensor, "batch pos"] | None = None
) -> Float[Tensor, " batch"]:
    """Per-row random baseline of :func:`reciprocal_rank` (NaN for rows without evidence)."""
    evidence = require_tensor("evidence", evidence, ndim=2, kind="mask")
    scores = torch.ones(evidence.shape, dtype=torch.float64)
    candidates = _check_masks(scores, evidence, candidates)
    n = candidates.sum(1).tolist()
    k = evidence.bool().sum(1).tolist()
    return torch.tensor([expected_random_reciprocal_rank(ni, ki) if ki > 0 else float("nan")
                         for ni, ki in zip(n, k, strict=True)], dtype=torch.float64)


@dataclass
class MRRResult:
    """Mean reciprocal rank of a set of explanations and its random baseline on the same rows.

    ``n`` counts the rows that had a rank (evidence present, candidates' scores not all equal); ``n_skipped`` the
    others. ``random`` is averaged over the same ``n`` rows (one selection for both means), so ``mrr - random`` compares
    a method with chance on the rows it was scored on. Until 2026-11-29 ``random`` was averaged over every row with
    evidence, as the paper's code does, tied rows included: a method's MRR and its baseline covered different rows.
    """

    mrr: float
    random: float
    n: int
    n_skipped: int
    reciprocal_ranks: Float[Tensor, " batch"]


def mean_reciprocal_rank(
    scores: Float[Tensor, "batch pos"],
    evidence: Bool[Tensor, "batch pos"],
    candidates: Bool[Tensor, "batch pos"] | None = None,
) -> MRRResult:
    """MRR of a batch of explanations with its random baseline on the same rows (see :func:`reciprocal_rank`).

    One selection of rows serves both means: the rows with a rank (an evidence token, and candidates whose scores are
    not all equal); ``MRRResult.n`` counts them and ``n_skipped`` the others. A tied row (a single candidate too) is
    left out of the baseline's mean as of the MRR's: the baseline of another set of rows (e.g. short prefixes whose
    chance rank is high) made the comparison of a method with chance biased, silently.
    """
    scores, candidates = scores_and_positions(scores, candidates, ranked_as="candidates")  # the baseline ranks the same candidates
    rr = reciprocal_rank(scores, evidence, candidates)
    rand = random_reciprocal_rank(evidence, candidates)
    valid = ~rr.isnan()
    if not valid.any():
        raise argument_error("scores", "no row has both an evidence token and candidates of different scores (a "
                             "ranking), so MRR is undefined", "Check the evidence masks and that the explanations are "
                             "not all zero (or all equal)")
    # the rows with a rank have evidence, so their baseline is a number: both means over the rows `valid` selects
    return MRRResult(mrr=float(rr[valid].mean()), random=float(rand[valid].mean()), n=int(valid.sum()),
                     n_skipped=int((~valid).sum()), reciprocal_ranks=rr)


def probability_gap(
    logits: Float[Tensor, "batch vocab"],
    target: Int[Tensor, " batch"],
    foil: Int[Tensor, " batch"],
) -> Float[Tensor, " batch"]:
    """``softmax(logits)[target] - softmax(logits)[foil]`` per row (next-token logits at one position)."""
    # -inf is a legitimate logit (a token the model rules out); NaN and +inf are not.
    logits = require_tensor("logits", logits, kind="float", finite=False)
    if logits.ndim != 2:
        raise argument_error("logits", f"logits must be next-token logits of shape (batch, vocab), got "
                             f"{tuple(logits.shape)}", "Select the explained position first, e.g. "
                             "logits[rows, position]")
    if 0 in logits.shape:
        raise argument_error("logits", f"are empty (shape {tuple(logits.shape)})", "Pass (batch, vocab) logits")
    bad = logits.isnan() | (logits == float("inf"))
    bad = bad.any(1) | (logits == float("-inf")).all(1)
    if bad.any():
        raise argument_error("logits", f"contain NaN, +inf or only -inf in {bad_rows(bad)}",
                             "Check the model's output for those rows")
    target, foil = (require_row_ids(name, ids, logits.shape[0], n_ids=logits.shape[1], what="vocabulary tokens")
                    for name, ids in (("target", target), ("foil", foil)))
    probs = logits.detach().to(at_least_float32(logits.dtype)).softmax(-1)
    rows = torch.arange(logits.shape[0], device=logits.device)
    return probs[rows, target.to(logits.device)] - probs[rows, foil.to(logits.device)]


# ---------------------------------------------------------------- language-modelling ability (paper Tables 5, 6)


@dataclass
class PerplexityResult:
    """Perplexity ``exp(nll)`` of a causal LM on a set of texts.

    ``nll`` is the mean negative log-likelihood (nats) over the ``n_tokens`` predicted tokens of the
    ``n_windows`` windows the ``n_texts`` texts were cut into.
    """

    perplexity: float
    nll: float
    n_tokens: int
    n_windows: int
    n_texts: int


def _require_causal_lm(model, window: list[int], device) -> None:
    """Refuse a model whose outputs are not next-token predictions, from what it computes, not its class name.

    A classifier returns one row of logits per text; a masked LM (or an encoder without a causal mask) returns
    a row per position, but each row sees the tokens after it, so scoring them as ``p(x_t | x_<t)`` gives a
    number (3e4 for BERT) that means nothing. Changing the window's last token must leave every earlier
    position's logits unchanged.
    """
    from ..attribution.text import with_output_object
    from ..errors import argument_error

    ids = torch.tensor([window], device=device)
    name = type(model).__name__
    # with_output_object: a config.return_dict=False made the output a tuple, refused as "returns tuple ... a
    # classifier or base model" (a causal LM), or failed inside a decoder head (AttributeError); now called with
    # return_dict=True, or refused naming the config where the head cannot run with it
    out = model(**with_output_object(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
    logits = getattr(out, "logits", None)
    if not isinstance(logits, Tensor) or logits.ndim != 3 or logits.shape[:2] != ids.shape:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(out).__name__
        raise argument_error("model", f"{name} returns {shape} for one window of {len(window)} tokens, not "
                             f"next-token logits (1, {len(window)}, vocab): a classifier or base model has no "
                             "next-token distribution", "Pass a causal LM (e.g. GPT2LMHeadModel, LlamaForCausalLM)",
                             kind=BcosTypeError)
    before = logits[0, :-1].double()
    if not bool(torch.isfinite(before).all()):
        # nothing to compare (allclose failed with "atol must be greater than or equal to zero, but got -nan"): the
        # scored windows' NaN logits are refused where they are scored, naming their cause (refuse_nan_logits)
        return
    # a probe token whose input embedding is NaN made every earlier position NaN through the masked key (weight 0
    # times NaN), which read as "a model without a causal mask": the first probe that leaves the outputs finite
    for probe in (0, 1, 2):
        if probe == window[-1]:
            continue
        changed = ids.clone()
        changed[0, -1] = probe
        after = model(**with_output_object(model, {"input_ids": changed, "attention_mask": torch.ones_like(ids)}))
        after = after.logits[0, :-1].double()
        if bool(torch.isfinite(after).all()):
            break
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-4 * (1.0 + float(before.abs().max()))):
        kind = "a masked LM" if name.endswith("ForMaskedLM") else "a model without a causal mask"
        raise argument_error("model", f"{name} is {kind}: its prediction at a position changes when a later token "
                             "changes, so its outputs are not next-token predictions and their perplexity is "
                             "meaningless", "Pass a causal LM (e.g. GPT2LMHeadModel, LlamaForCausalLM; BERT's "
                             "BertLMHeadModel needs config.is_decoder=True)", kind=BcosTypeError)


def _token_rows(texts, tokenizer) -> list[list[int]]:
    from ..errors import argument_error

    if isinstance(texts, str | Tensor) and (isinstance(texts, str) or texts.ndim < 2):
        texts = [texts]
    if not isinstance(texts, Sequence | Tensor) or len(texts) == 0:
        raise argument_error("texts", f"must be a non-empty list of strings or of token-id sequences, got "
                             f"{type(texts).__name__}", "Pass e.g. held-out paragraphs", kind=BcosTypeError)
    rows = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            if tokenizer is None:
                raise argument_error("tokenizer", f"texts[{i}] is a string but no tokenizer was given",
                                     "Pass tokenizer=..., or token ids instead of strings", kind=BcosTypeError)
            rows.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
            continue
        ids = torch.as_tensor(text) if not isinstance(text, Tensor) else text
        if ids.ndim == 1 and ids.numel() == 0:
            # torch reads an empty list as float32: the message named a dtype the caller never passed
            raise argument_error("texts", f"texts[{i}] is empty (no token ids): nothing to predict",
                                 "Drop empty texts")
        if ids.ndim != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise argument_error("texts", f"texts[{i}] must be a string or a 1-d sequence of integer token ids, "
                                 f"got dtype {ids.dtype} shape {tuple(ids.shape)}", "Pass one list of ids per text",
                                 kind=BcosTypeError)
        rows.append(ids.tolist())
    return rows


@torch.no_grad()
def perplexity(
    model,
    texts: Sequence[str] | Sequence[Sequence[int]] | Sequence[Tensor],
    tokenizer=None,
    *,
    bos_token_id: int | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
) -> PerplexityResult:
    """Perplexity of a causal LM (transformers ``...ForCausalLM``, B-cos or not) on held-out texts.

    Each text is tokenised (strings, with ``tokenizer``) or taken as token ids, cut into consecutive windows
    of ``max_length`` tokens (default: the model's context), each window optionally prefixed with
    ``bos_token_id``, and every token after a window's first (or after the BOS) is scored:
    ``ppl = exp(-sum log p(x_t | x_<t) / n_tokens)``. Windows do not overlap, so the first tokens of a
    window see less context than in a sliding evaluation (a higher, conservative perplexity). The model runs
    in eval mode and is put back in its previous mode. A model whose outputs are not next-token predictions
    (a masked LM, a classifier, an encoder without a causal mask) is refused: it is checked that the logits at
    a position do not change when a later token does.

    Args:
        texts: strings (with ``tokenizer``) or token-id sequences in the model's own vocabulary.
        bos_token_id: prepended to every window (e.g. GPT-2's ``<|endoftext|>``), so its first token is scored;
            texts that already start with it (ids from a tokenizer that adds it) are refused.
        max_length: window length including the BOS (>= 2).
        batch_size: windows per forward pass.
    """
    from .._checks import (
        require_int,
        unmasked_padding_keywords,
        warn_if_another_models_tokenizer,
        warn_if_unmasked_padding,
    )
    from ..attribution.text import refuse_nan_logits, refuse_stock_loaded_bcos, with_output_object
    from ..errors import argument_error

    refuse_stock_loaded_bcos(model)  # a B-cos checkpoint loaded with plain transformers: the stock model's perplexity
    batch_size = require_int("batch_size", batch_size, minimum=1)
    context = position_limit(model).context
    if max_length is None:
        if context is None:
            raise argument_error("max_length", f"{type(model).__name__} has no n_positions / "
                                 "max_position_embeddings in its config", "Pass max_length=...")
        max_length = context
    max_length = require_int("max_length", max_length, minimum=2, maximum=context)
    vocab = vocabulary_size(model)
    if bos_token_id is not None:
        bos_token_id = require_int("bos_token_id", bos_token_id, minimum=0,
                                   maximum=None if vocab is None else vocab - 1)
    rows = _token_rows(texts, tokenizer)
    if tokenizer is not None:  # ids that fit the vocabulary, read as other tokens: the perplexity of other texts
        warn_if_another_models_tokenizer(model, tokenizer)
    # a padded batch of ids passed as texts: its padding would be scored. Given as lists of one length (tokenizer(texts,
    # padding=True)["input_ids"], or list(ids)) it was scored without the tensor's warning (a perplexity of 62.3 for
    # 63.5, three padding ids counted as tokens)
    same_length_ids = len(rows) > 1 and len({len(row) for row in rows}) == 1 \
        and not any(isinstance(text, str) for text in texts)
    if isinstance(texts, Tensor) or same_length_ids:
        warn_if_unmasked_padding(texts if isinstance(texts, Tensor) else torch.tensor(rows), "texts",
                                 **unmasked_padding_keywords(getattr(model, "config", None), None))
    windows: list[list[int]] = []
    step = max_length - int(bos_token_id is not None)
    for i, row in enumerate(rows):
        if vocab is not None and any(t < 0 or t >= vocab for t in row):
            raise argument_error("texts", f"texts[{i}] has token ids outside the model's vocabulary [0, {vocab})",
                                 "Tokenise with the model's own tokenizer (or map ids to its vocabulary)")
        if bos_token_id is not None and row and row[0] == bos_token_id:
            # ids from a tokenizer that adds the BOS itself (Llama's tok(text)["input_ids"]) got a second one: the text's
            # BOS was scored as a predicted token, p(BOS | BOS), one token more and a different perplexity, silently
            raise argument_error("texts", f"texts[{i}] already starts with bos_token_id ({bos_token_id}): perplexity "
                                 "prepends it to every window, so the text's own BOS would be scored as a predicted "
                                 "token (p(BOS | BOS))", "Drop the leading BOS from the ids (tokenize with "
                                 "add_special_tokens=False), or leave bos_token_id out")
        if len(row) + int(bos_token_id is not None) < 2:
            raise argument_error("texts", f"texts[{i}] has {len(row)} token(s): nothing to predict",
                                 "Drop empty texts, or pass bos_token_id so a single token is scored")
        for start in range(0, len(row), step):
            piece = row[start:start + step]
            window = [bos_token_id, *piece] if bos_token_id is not None else piece
            if len(window) >= 2:  # a one-token tail (no BOS) has nothing to predict; its token is lost
                windows.append(window)
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64), 0
    with evaluating(model):
        _require_causal_lm(model, windows[0], device)
        for start in range(0, len(windows), batch_size):
            chunk = windows[start:start + batch_size]
            length = max(len(w) for w in chunk)
            ids = torch.zeros(len(chunk), length, dtype=torch.long)
            mask = torch.zeros(len(chunk), length, dtype=torch.long)
            for j, w in enumerate(chunk):  # right padding: positions 0..len-1 as in training
                ids[j, : len(w)] = torch.tensor(w)
                mask[j, : len(w)] = 1
            ids, mask = ids.to(device), mask.to(device)
            logits = model(**with_output_object(model, {"input_ids": ids, "attention_mask": mask})).logits
            logp = logits.double()[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            scored = mask[:, 1:].bool()
            # a NaN logit of a scored token made the perplexity NaN without a word (a padded float64 Gemma 2)
            refuse_nan_logits("perplexity", (logp.isnan() & scored).any(1), range(start, start + len(ids)),
                              "windows", logits.dtype, mask, "Pass batch_size=1 (one window per forward pass: no "
                              "padding), or the model in float32 (model.float()).", model=model, input_ids=ids)
            total -= logp[scored].sum().cpu()
            count += int(scored.sum())
    nll = float(total / count)
    return PerplexityResult(perplexity=math.exp(nll), nll=nll, n_tokens=count,
                            n_windows=len(windows), n_texts=len(rows))


@dataclass
class NextTokenContrast:
    """Target-vs-foil next-token scores of a batch (the paper's IOI / BLiMP accuracy, logit difference, gap).

    Per row: ``logit_difference = logit(target) - logit(foil)`` and ``probability_gap = p(target) - p(foil)``
    at the predicted position. ``accuracy`` is the share of rows with ``logit(target) > logit(foil)``.
    """

    logit_difference: Float[Tensor, " batch"]
    probability_gap: Float[Tensor, " batch"]

    @property
    def accuracy(self) -> float:
        return float((self.logit_difference > 0).double().mean())

    @property
    def mean_logit_difference(self) -> float:
        return float(self.logit_difference.double().mean())

    @property
    def mean_probability_gap(self) -> float:
        return float(self.probability_gap.double().mean())


@torch.no_grad()
def next_token_contrast(
    model,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    *positional,
    target: Int[Tensor, " batch"] | None = None,
    foil: Int[Tensor, " batch"] | None = None,
    batch_size: int = 64,
) -> NextTokenContrast:
    """Logit difference and probability gap of ``target`` over ``foil`` at each row's last real token.

    ``target`` and ``foil`` (required: a next-token id for every row or one per row) are keywords, as in
    :func:`bcos_plugins.explain`. Works on the batches of :func:`~bcos_plugins.data.encode_ioi` and
    :func:`~bcos_plugins.data.encode_blimp` (padding on either side): a model of the architecture registry is
    called as ``explain`` calls it (``rows_as_alone_call``: position ids count real tokens), so each row's numbers are
    those of the row alone; a model outside the registry whose forward names ``position_ids`` is given ids counting
    real tokens, as ``generate`` gives them (unless its position table counts from the padding index, RoBERTa's family,
    which counts real tokens itself); any other model is called with the batch as given.
    """
    from .._checks import require_int, require_token_batch, unmasked_padding_keywords
    from ..attribution.targets import last_real_position, warn_on_foil_equal_to_target
    from ..attribution.text import refuse_nan_logits, registry_spec, rows_as_alone_call
    from ..errors import argument_error

    if positional:  # the 0.1 signature took target and foil by position
        raise argument_error("target", "next_token_contrast takes target and foil by keyword since 0.2, got "
                             f"{len(positional)} more positional argument(s)", "Call next_token_contrast(model, "
                             "input_ids, attention_mask, target=..., foil=...)", kind=BcosTypeError)
    for name, ids in (("target", target), ("foil", foil)):
        if ids is None:
            raise argument_error(name, "is required", f"Pass {name}= with one next-token id per row",
                                 kind=BcosTypeError)
    batch_size = require_int("batch_size", batch_size, minimum=1)
    vocab = vocabulary_size(model)
    limit = position_limit(model)
    input_ids, attention_mask = require_token_batch(
        input_ids, attention_mask, vocab_size=vocab, max_length=limit.max_length, limit_name=limit.source,
        **unmasked_padding_keywords(getattr(model, "config", None), attention_mask))
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    n = input_ids.shape[0]
    target, foil = (require_row_ids(name, ids, n, n_ids=vocab, what="vocabulary tokens")
                    for name, ids in (("target", target), ("foil", foil)))
    # a hand-made minimal pair whose two continuations share their first token scored 0 and counted as wrong, silently
    warn_on_foil_equal_to_target(target, foil, predicted=False, consequence="the logit difference is 0 there, the row "
                                  "counts as wrong in accuracy and its probability gap is 0")
    last = last_real_position(attention_mask)
    spec = registry_spec(model)
    device = next(model.parameters()).device
    diffs, gaps = [], []
    with evaluating(model):
        for s in range(0, n, batch_size):
            ids, mask = input_ids[s:s + batch_size].to(device), attention_mask[s:s + batch_size].to(device)
            call = rows_as_alone_call(model, ids, mask, spec=spec, causal_lm=True)
            out = model(**call)
            logits = getattr(out, "logits", None)
            if not isinstance(logits, Tensor) or logits.ndim != 3 or logits.shape[:2] != ids.shape:
                # a classifier's (batch, classes) logits failed with an IndexError, a base model's output with an
                # AttributeError
                shape = tuple(logits.shape) if isinstance(logits, Tensor) else f"no logits ({type(out).__name__})"
                raise argument_error("model", f"{type(model).__name__} returns {shape} for input_ids of shape "
                                     f"{tuple(ids.shape)}, not next-token logits (batch, pos, vocab)", "Pass a causal "
                                     "LM (e.g. GPT2LMHeadModel, LlamaForCausalLM)", kind=BcosTypeError)
            logits = logits[torch.arange(len(ids), device=device), last[s:s + batch_size].to(device)]
            refuse_nan_logits("next_token_contrast", logits.isnan().any(-1), range(s, s + len(ids)), "rows",
                              logits.dtype, mask, "Pass the model in float32 (model.float()), or the padded rows one "
                              "at a time without padding.", model=model, input_ids=call.get("input_ids", ids))
            t, f = target[s:s + batch_size].to(device), foil[s:s + batch_size].to(device)
            rows = torch.arange(len(ids), device=device)
            # subtracted in at least float32 (float64 kept), as explain's values: a bfloat16 difference of two logits
            # is rounded to 3 significant digits (-0.20898 for -0.20874), and float64 ones were cast to float32
            wide = at_least_float32(logits.dtype)
            diffs.append((logits[rows, t].to(wide) - logits[rows, f].to(wide)).cpu())
            gaps.append(probability_gap(logits, t, f).cpu())
    return NextTokenContrast(torch.cat(diffs), torch.cat(gaps))
