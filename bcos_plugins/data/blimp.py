"""BLiMP minimal pairs as contrastive next-token tasks: prefix, target, foil and evidence (B-cos LM paper §7).

Each BLiMP pair with the one-prefix method is ``prefix + good word`` vs ``prefix + bad word``; the explained
quantity is ``logit(good) - logit(bad)`` at the prefix's last token (first sub-token of each word with its
leading space, as the paper's code does: the word's first token after the prefix, which for GPT-2 is that of the word
with its space alone; pairs whose two words share that first token are dropped). A word of
several tokens is then stood for by its first piece: :func:`encode_blimp` lists those pairs in
``BlimpBatch.first_piece`` and drops them with ``multi_token="drop"``.

The paper (following Ferrando et al., 2023) uses nine paradigms and ground-truth *evidence* words: the words of
the prefix that make the good continuation right and the bad one wrong. Its evidence files are not public in
BLiMP itself, so the evidence is rebuilt here with one explicit rule per paradigm, from BLiMP's templates:

=======  ===============================================  ==================================================
id       paradigm                                         evidence (in the prefix)
=======  ===============================================  ==================================================
aga      anaphor_gender_agreement                         the antecedent: subject noun phrase (a name, or
ana      anaphor_number_agreement                         determiner + noun)
asp      animate_subject_passive                          the passive verb (the word before the first "by"),
                                                          which selects an animate agent
dna      determiner_noun_agreement_1                      the last demonstrative (this / that / these /
dnai     determiner_noun_agreement_irregular_1            those), which fixes the noun's number
dnaa     determiner_noun_agreement_with_adjective_1
dnaai    determiner_noun_agreement_with_adj_irregular_1
npi      npi_present_1                                    "Even" (the sentence-initial word every pair has)
darn     distractor_agreement_relational_noun             the subject's head noun(s): between the first
                                                          determiner and the first preposition
=======  ===============================================  ==================================================

Compound nouns after a determiner (``Some college campus``) are cut to their first word by the aga/ana rule;
the MRR uses the best-ranked evidence token, so a partial span still counts the antecedent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._checks import require_choice, require_int
from ..errors import BcosFileError, BcosTypeError, argument_error
from .contrastive import ContrastiveBatch, left_pad, word_tokens_after
from .shipped import SHIPPED_DATA, check_n, data_file, first_rows, require_one_source

__all__ = ["BLIMP_SUBSETS", "BlimpBatch", "BlimpPair", "encode_blimp", "load_blimp"]

BLIMP_SUBSETS: dict[str, str] = {
    "aga": "anaphor_gender_agreement",
    "ana": "anaphor_number_agreement",
    "asp": "animate_subject_passive",
    "dna": "determiner_noun_agreement_1",
    "dnai": "determiner_noun_agreement_irregular_1",
    "dnaa": "determiner_noun_agreement_with_adjective_1",
    "dnaai": "determiner_noun_agreement_with_adj_irregular_1",
    "npi": "npi_present_1",
    "darn": "distractor_agreement_relational_noun",
}
_PARADIGM_IDS = {paradigm: short for short, paradigm in BLIMP_SUBSETS.items()}

_DETERMINERS = {"the", "a", "an", "this", "that", "these", "those", "some", "all", "every", "each", "many", "most",
                "few", "no", "several", "any"}
_DEMONSTRATIVES = {"this", "that", "these", "those"}
_PREPOSITIONS = {"of", "about", "by", "with", "from", "for", "to", "in", "on", "at"}

Span = tuple[int, int]


@dataclass(frozen=True)
class BlimpPair:
    """One minimal pair as a contrastive next-token task.

    Attributes:
        subset: short id (``"aga"``, ...); paradigm: BLiMP's paradigm name; pair_id: BLiMP's ``pairID``.
        prefix: the shared prefix; target / foil: the good / bad next word (no leading space).
        evidence: character spans of the evidence words in ``prefix``.
    """

    subset: str
    paradigm: str
    pair_id: str
    prefix: str
    target: str
    foil: str
    evidence: tuple[Span, ...]

    @property
    def evidence_words(self) -> list[str]:
        return [self.prefix[a:b] for a, b in self.evidence]


def _words(prefix: str) -> list[tuple[str, Span]]:
    return [(m.group(), m.span()) for m in re.finditer(r"\S+", prefix)]


def _evidence_spans(subset: str, prefix: str) -> tuple[Span, ...]:
    words = _words(prefix)
    lower = [w.lower() for w, _ in words]
    if subset in ("aga", "ana"):
        n = 2 if lower[0] in _DETERMINERS and len(words) > 2 else 1
        return tuple(span for _, span in words[:n])
    if subset == "asp":
        if "by" not in lower or lower.index("by") == 0:
            return ()
        return (words[lower.index("by") - 1][1],)
    if subset in ("dna", "dnai", "dnaa", "dnaai"):
        found = [i for i, w in enumerate(lower) if w in _DEMONSTRATIVES]
        return (words[found[-1]][1],) if found else ()
    if subset == "npi":
        return (words[0][1],) if lower[0] == "even" else ()
    if subset == "darn":
        if lower[0] not in _DETERMINERS:
            return ()
        end = next((i for i in range(1, len(lower)) if lower[i] in _PREPOSITIONS), None)
        return tuple(span for _, span in words[1:end]) if end else ()
    raise AssertionError(subset)


def _resolve(subset: str) -> tuple[str, str]:
    if not isinstance(subset, str):
        raise argument_error("subset", f"must be a str, got {type(subset).__name__}",
                             "Pass one short id or paradigm name (BLIMP_SUBSETS lists them); load several subsets "
                             "one call each", kind=BcosTypeError)
    if subset in BLIMP_SUBSETS:
        return subset, BLIMP_SUBSETS[subset]
    if subset in _PARADIGM_IDS:
        return _PARADIGM_IDS[subset], subset
    raise argument_error("subset", f"unknown BLiMP subset {subset!r}",
                         "Pass a short id or a paradigm name of the nine supported (id: paradigm, also in "
                         f"bcos_plugins.data.BLIMP_SUBSETS): {', '.join(f'{k}: {v}' for k, v in BLIMP_SUBSETS.items())}")


_ONE_PREFIX_KEYS = ("one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad")


def _read_jsonl(file: Path) -> list[dict]:
    """The rows of a BLiMP ``.jsonl`` file, refusing a line that is not a JSON object by its number (a bare
    ``JSONDecodeError`` named neither the file nor the line)."""
    rows = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise argument_error("path", f"{file}, line {number} is not JSON ({err.msg})",
                                     "Pass BLiMP's own jsonl files (one JSON object per line)") from None
            if not isinstance(row, dict):
                raise argument_error("path", f"{file}, line {number} is a JSON {type(row).__name__}, not an object",
                                     "Pass BLiMP's own jsonl files (one JSON object per line)")
            rows.append(row)
    return rows


def load_blimp(subset: str, *, n: int | None = None, path: str | Path | None = None,
               source: str = "local") -> list[BlimpPair]:
    """Minimal pairs of one of the nine paradigms, with their evidence spans (see the module docstring).

    Args:
        subset: a short id (``"dna"``) or the paradigm name (``"determiner_noun_agreement_1"``).
        n: keep the first ``n`` pairs (before dropping any; more than there are: all, with a ``UserWarning``).
        path: a BLiMP ``.jsonl`` file or a folder holding ``<paradigm>.jsonl``; default: the slice shipped in
            ``bcos_plugins/data/files/blimp`` (first 300 pairs of each paradigm).
        source: ``"local"`` or ``"hub"`` (``datasets.load_dataset("nyu-mll/blimp", paradigm)``, network needed).

    Pairs without the one-prefix method, or where the rule finds no evidence, are dropped.

    Raises:
        BcosValueError: an unknown ``subset`` (the message lists the nine), a negative ``n`` or another ``source``;
            a line of the file that is not a JSON object, or a one-prefix pair without its prefix and two words (the
            line or pair named).
        BcosTypeError: ``subset`` not a str. BcosFileError: no ``<paradigm>.jsonl`` at ``path``.
    """
    short, paradigm = _resolve(subset)
    n = check_n(n)  # n=-1 kept all pairs but the last, silently (a slice)
    require_one_source(path, source, "load_blimp")
    if source == "hub":
        from datasets import load_dataset

        rows = list(load_dataset("nyu-mll/blimp", paradigm, split="train"))
    elif source == "local":
        file = data_file(path) if path is not None else SHIPPED_DATA / "blimp"
        if file.is_dir():
            file = file / f"{paradigm}.jsonl"
        if not file.exists():
            raise argument_error("path", f"{file} not found", "Pass path=... to a BLiMP jsonl file (or its folder), "
                                 "or source='hub' to load it with `datasets`", kind=BcosFileError)
        rows = _read_jsonl(file)
    else:
        raise argument_error("source", f"must be 'local' or 'hub', got {source!r}",
                             "Use 'local' (the shipped slice, or path=...) or 'hub' (datasets, network needed)")
    where = f"BLiMP's {paradigm!r} on the hub" if source == "hub" else f"the file {file}"
    pairs = []
    for row in first_rows(rows, n, "load_blimp", where, "pairs"):
        if not row.get("one_prefix_method"):
            continue
        missing = [key for key in _ONE_PREFIX_KEYS if not isinstance(row.get(key), str)]
        if missing:
            # failed with a bare KeyError naming the key alone
            raise argument_error("path", f"pair {row.get('pairID', '?')!r} has one_prefix_method but no string "
                                 f"{missing}", "Pass BLiMP's own jsonl files (each one-prefix pair has "
                                 f"{list(_ONE_PREFIX_KEYS)})")
        prefix = row["one_prefix_prefix"]
        evidence = _evidence_spans(short, prefix)
        if not evidence:
            continue
        pairs.append(BlimpPair(short, paradigm, str(row.get("pairID", len(pairs))), prefix,
                               row["one_prefix_word_good"], row["one_prefix_word_bad"], evidence))
    return pairs


@dataclass
class BlimpBatch(ContrastiveBatch):
    """Tokenised pairs, left-padded, ready for ``explain(..., target=target_ids, foil=foil_ids)``.

    ``evidence`` marks the tokens overlapping an evidence word; ``candidates`` the tokens that are ranked (real
    prefix tokens, BOS excluded). ``dropped`` lists ``(pair, reason)`` for pairs that could not be used;
    ``first_piece`` the indices (into ``pairs``) of the kept pairs whose target or foil is several tokens, so that
    its id is the word's first piece only (the paper's convention).
    """

    pairs: list[BlimpPair]
    dropped: list[tuple[BlimpPair, str]] = field(default_factory=list)
    first_piece: list[int] = field(default_factory=list)


def encode_blimp(pairs: Sequence[BlimpPair], tokenizer, *, bos_token_id: int | None = None,
                 pad_token_id: int | None = None, multi_token: str = "first") -> BlimpBatch:
    """Tokenise pairs with a fast tokenizer (character offsets are used to place the evidence).

    Args:
        bos_token_id: prepended to every prefix when given (never a candidate for ranking).
        pad_token_id: id written into padding (default: the tokenizer's pad, else its eos, else 0).
        multi_token: a target or foil of several tokens (GPT-2: " alumnus", " waitresses"): ``"first"``
            (default, the paper's convention) keeps the pair with the word's first piece as its id and lists it
            in ``first_piece``; ``"drop"`` drops it (reason in ``dropped``), so every id is a whole word.
    """
    multi_token = require_choice("multi_token", multi_token, ("first", "drop"))
    # checked as encode_ioi checks its prompts and ids: one BlimpPair was iterated ('not iterable'), a str bos id failed
    # inside torch.tensor, pad_token_id=-1 was written into the batch (an embedding lookup fails on it) and 1.5 as 1
    if isinstance(pairs, BlimpPair) or not isinstance(pairs, Sequence) or isinstance(pairs, str):
        raise argument_error("pairs", f"must be a list of BlimpPair, got {type(pairs).__name__}",
                             "Pass load_blimp(...)'s list (one pair: [pair])", kind=BcosTypeError)
    if len(pairs) == 0:
        raise argument_error("pairs", "is empty", "Pass at least one BlimpPair (load_blimp(subset, n=...))")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, BlimpPair):
            raise argument_error("pairs", f"item {i} is a {type(pair).__name__}, not a BlimpPair",
                                 "Pass load_blimp(...)'s pairs", kind=BcosTypeError)
    if not getattr(tokenizer, "is_fast", False):
        raise argument_error("tokenizer", f"encode_blimp needs a fast tokenizer (return_offsets_mapping); got "
                             f"{type(tokenizer).__name__}", "Load it with AutoTokenizer.from_pretrained(..., "
                             "use_fast=True)")
    if bos_token_id is not None:
        bos_token_id = require_int("bos_token_id", bos_token_id, minimum=0)
    if pad_token_id is None:
        pad_token_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    rows, kept, dropped, first_piece = [], [], [], []
    for pair in pairs:
        enc = tokenizer(pair.prefix, add_special_tokens=False, return_offsets_mapping=True)
        if not enc["input_ids"]:  # left_pad refuses it: a row of padding alone has no prediction to explain
            dropped.append((pair, "the prefix has no tokens"))
            continue
        # the word's tokens as the model reads them after the prefix, not " word" tokenised alone: a SentencePiece
        # tokenizer that marks the leading space itself (Llama 2's) gives ["▁", "▁word"] alone, so every target and
        # foil "shared" the bare "▁" and every pair was dropped; for GPT-2 (byte-level) both are the same ids
        target, foil = (word_tokens_after(tokenizer, pair.prefix, word, enc["input_ids"]) for word in (pair.target, pair.foil))
        if target is None or foil is None:
            dropped.append((pair, "the tokenizer merges the prefix's last token with the next word"))
            continue
        if target[0] == foil[0]:
            dropped.append((pair, "target and foil share their first token"))
            continue
        if len(target) > 1 or len(foil) > 1:
            if multi_token == "drop":
                dropped.append((pair, "target or foil is several tokens"))
                continue
            first_piece.append(len(kept))
        evidence = [any(a < e_end and e_start < b for e_start, e_end in pair.evidence)
                    for a, b in enc["offset_mapping"]]
        rows.append((list(enc["input_ids"]), evidence, target[0], foil[0]))
        kept.append(pair)
    if not rows:  # (was a bare ValueError naming no argument)
        raise argument_error("pairs", f"none of the {len(pairs)} pairs is usable with this tokenizer: "
                             f"{sorted({r for _, r in dropped})}", "Pass more pairs (load_blimp(subset, n=...)), or a "
                             "tokenizer that gives the target and foil words tokens of their own after the prefix")
    input_ids, attention_mask, evidence, candidates, _ = left_pad(
        [r[0] for r in rows], [r[1] for r in rows], pad_token_id=pad_token_id, bos_token_id=bos_token_id)
    return BlimpBatch(input_ids, attention_mask, torch.tensor([r[2] for r in rows]),
                      torch.tensor([r[3] for r in rows]), evidence, candidates, kept, dropped, first_piece)
