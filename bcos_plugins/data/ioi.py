"""Indirect Object Identification (IOI) prompts as contrastive next-token tasks (B-cos LM paper §7, Table 7).

An IOI prompt introduces two people and then has one of them (the subject, S) do something *to* the other (the
indirect object, IO); the prompt stops where the IO's name comes next::

    Friends Juana and Kristi found a mango at the bar. Kristi gave it to   [ Juana / Kristi ]

The explained quantity is ``logit(IO) - logit(S)`` at the last token (``target`` = IO, ``foil`` = S). The
ground-truth *evidence* for the IO over the S is the IO's earlier mention (the paper's Table 7): S occurs twice
in the prompt, IO once, and a model that solves the task has to find the name that occurs once.

Prompts are generated from templates (Wang et al., 2023: "Interpretability in the wild") in both name orders:

- ``ABBA``: the IO is named first ("Then, Juana and Kristi went ... Kristi gave ... to" -> Juana);
- ``BABA``: the S is named first ("Then, Kristi and Juana went ... Kristi gave ... to" -> Juana).

Names, objects and places are shipped as constants below. Every name is one GPT-2 token with its leading space
(checked against the tokenizer at generation time: a name that splits would make ``target``/``foil`` a mere
prefix of the name). Templates never start with a name, so every mention is the leading-space token.

Name-independent training: with a few hundred training names a small model trained from scratch learns
name-specific shortcuts (which of two familiar names tends to be the IO) that are at chance on unseen names.
:func:`ioi_name_pool` draws stand-in "names" from the tokenizer's whole vocabulary of capitalised single-token
words (thousands for GPT-2), never a held-out name nor a word of any template; filling the training prompts'
name slots from it (``make_ioi_prompts(..., names=ioi_name_pool(...))``) leaves every name too rare to
memorise, so only the generic mechanism (find the name that occurs once, copy it) pays.

Splits: ``"train"`` draws from :data:`IOI_TRAIN_TEMPLATES` and :data:`IOI_TRAIN_NAMES`, ``"heldout"`` from
:data:`IOI_HELDOUT_TEMPLATES` and :data:`IOI_HELDOUT_NAMES`; the two share no template and no name, so a model
trained on ``"train"`` prompts is tested on sentence frames and names it never saw in that role. (The held-out
names are common TinyStories names, so a model pre-trained on TinyStories has seen them as names elsewhere, as
GPT-2 has seen every IOI name in its pre-training.) Objects and places are shared.

:func:`load_ioi` reads complete IOI sentences in the public format (one sentence ending with the IO's name per
row, e.g. the ``ioi_sentences`` column of the ``fahamu/ioi`` dataset on the hub) for users with the network.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor

from .._checks import require_choice, require_int, require_seed
from ..errors import BcosFileError, BcosTypeError, BcosValueError, argument_error
from .contrastive import ContrastiveBatch, left_pad, word_tokens_after
from .shipped import SHIPPED_DATA, data_file, first_rows

__all__ = [
    "IOI_HELDOUT_NAMES",
    "IOI_HELDOUT_TEMPLATES",
    "IOI_OBJECTS",
    "IOI_PLACES",
    "IOI_TRAIN_NAMES",
    "IOI_TRAIN_TEMPLATES",
    "IOIBatch",
    "IOIPrompt",
    "corrupt_ioi",
    "encode_ioi",
    "ioi_name_pool",
    "load_ioi",
    "make_ioi_prompts",
]

# {A} and {B} are the first and second names of the introduction, {S} the subject's second mention; the IO's
# second mention is the next token to predict. {OBJECT} and {PLACE} are filled from the lists below.
IOI_TRAIN_TEMPLATES: tuple[str, ...] = (
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} were working at the {PLACE}. {S} decided to give a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "After the lunch, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Afterwards, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "One day, {A} and {B} played at the {PLACE}. {S} threw the {OBJECT} to",
    "At the {PLACE}, {A} and {B} found a {OBJECT}. {S} handed it to",
    # short frames: fewer tokens between the names and the prediction, so a small model trained from scratch
    # finds the names to attend to sooner
    "Then, {A} and {B} met. {S} waved to",
    "So {A} and {B} sat down. {S} talked to",
    "Later, {A} and {B} ate lunch. {S} said hi to",
    "Yesterday {A} and {B} played. {S} gave a {OBJECT} to",
)
IOI_HELDOUT_TEMPLATES: tuple[str, ...] = (
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "Then, {A} and {B} were thinking about going to the {PLACE}. {S} wanted to give a {OBJECT} to",
    "While {A} and {B} were walking to the {PLACE}, {S} brought a {OBJECT} to",
    "The {PLACE} {A} and {B} went to had a {OBJECT}. {S} gave it to",
)
# many training names: with few, a small model learns name-specific shortcuts that do not carry over to the
# held-out names
IOI_TRAIN_NAMES: tuple[str, ...] = (
    "Lily", "Tom", "Ben", "Tim", "Max", "Lucy", "Amy", "Bob", "Jane", "John", "Emma", "Joe", "Sarah", "Kim",
    "James", "Carl", "Billy", "Sally", "Benny", "Jill", "Ellie", "Eva", "Josh", "Mark", "Mary", "Kate", "Jim",
    "Mike", "Tony", "Alex", "Rose", "Jake", "Luke", "Leo", "Dan", "Lisa", "Paul", "Grace", "Nick", "Laura",
    "Peter", "David", "Rachel", "Jessica", "Michael", "Robert", "Daniel", "Chris", "Adam", "Ryan", "Kevin",
    "Brian", "Eric", "Jason", "Justin", "Andrew", "Matt", "Steve", "Amanda", "Julia", "Kelly", "Katie", "Anne",
    "Hannah", "Helen", "Linda", "Maria", "Elizabeth", "Jennifer", "Jon", "Alan", "Ted", "Fred", "Bill", "Frank",
    "Henry", "Charles", "George", "Edward", "Rick", "Roger", "Sean", "Greg", "Scott", "Bruce", "Lucas", "Ruby",
    "Jenny", "Tina", "Nina", "Nora", "Sophie", "Harry", "Oliver", "Charlie", "Jacob", "Ethan", "Noah", "Liam",
    "Olivia", "Kyle", "Brandon", "Tyler", "Nathan", "Victoria", "Alice", "Bella", "Beth", "Cindy", "Diana",
    "Paula", "Rita", "Clara", "Ann", "Zoe", "Molly", "Lauren", "Megan",
    # names the shipped TinyStories slice uses often, as it uses the held-out ones (most names above it never
    # uses): a model whose IOI loss is kept off the embeddings needs training names whose rows it learns
    "Sammy", "Tommy", "Johnny", "Jimmy", "Spot", "Buzz", "Rex", "Olive",
)
IOI_HELDOUT_NAMES: tuple[str, ...] = ("Sam", "Mia", "Anna", "Sue", "Jack", "Sara", "Emily", "Daisy")
# consonant-initial, so every template's "a {OBJECT}" reads right
IOI_OBJECTS: tuple[str, ...] = (
    "ball", "book", "toy", "cake", "box", "hat", "drink", "ring", "bone", "snack", "flower", "basket", "bag",
    "gift", "cookie", "doll", "mango", "kite", "cup", "card",
)
IOI_PLACES: tuple[str, ...] = (
    "park", "store", "school", "garden", "house", "beach", "kitchen", "hospital", "office", "station", "forest",
    "river", "lake", "zoo", "farm", "shop", "market", "library", "bar", "restaurant",
)

Order = Literal["ABBA", "BABA"]
Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class IOIPrompt:
    """One IOI prompt, tokenised.

    Attributes:
        text: the prompt, ending just before the IO's second mention.
        io / s: the indirect object's and the subject's names (no leading space).
        order: ``"ABBA"`` (IO named first) or ``"BABA"`` (S named first).
        template: the template it was filled from (``None`` for loaded sentences); obj / place: its fillers.
        input_ids: the prompt's token ids (no BOS).
        target_id / foil_id: the IO's / the S's name token (with its leading space).
        evidence_positions: token indices in ``input_ids`` of the IO's earlier mention (the ground truth).
        s_positions: token indices of the S's two mentions; end_position: the last token (the prediction).
    """

    text: str
    io: str
    s: str
    order: Order
    template: str | None
    obj: str | None
    place: str | None
    input_ids: tuple[int, ...]
    target_id: int
    foil_id: int
    evidence_positions: tuple[int, ...]
    s_positions: tuple[int, ...]

    @property
    def end_position(self) -> int:
        return len(self.input_ids) - 1

    @property
    def completion(self) -> str:
        """The whole sentence (prompt + IO + full stop), e.g. as language-model training text."""
        return f"{self.text} {self.io}."


@lru_cache(maxsize=1)
def _gpt2_tokenizer():
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")


def _check_tokenizer(tokenizer):
    if tokenizer is None:
        return _gpt2_tokenizer()
    if not getattr(tokenizer, "is_fast", False):
        raise argument_error("tokenizer", f"needs a fast tokenizer (character offsets), got {type(tokenizer).__name__}",
                             "Load it with AutoTokenizer.from_pretrained(..., use_fast=True)", kind=BcosTypeError)
    return tokenizer


def _name_token(tokenizer, name: str) -> int:
    # the name's tokens after a word, as the prompts place it: " Mary" alone is ["▁", "▁Mary"] for a SentencePiece
    # tokenizer that marks the leading space itself (Llama 2's), and every name was refused as two tokens
    ids = word_tokens_after(tokenizer, "and", name) or []
    if len(ids) != 1:
        raise argument_error("names", f"{name!r} is {len(ids)} tokens with its leading space for this tokenizer, "
                             "so its first token would stand for several names",
                             "Use names that are one token with a leading space (the shipped lists are, for GPT-2)")
    return ids[0]


def _tokenise(tokenizer, text: str, io: str, s: str, order: Order, template: str | None, obj: str | None,
              place: str | None, mentions: dict[str, list[tuple[int, int]]]) -> IOIPrompt:
    """Tokenise ``text`` and place the name mentions (character spans) on tokens."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    target, foil = _name_token(tokenizer, io), _name_token(tokenizer, s)

    def positions(spans, expected):
        found = []
        for start, end in spans:
            hit = [i for i, (a, b) in enumerate(offsets) if a < end and start < b]
            if len(hit) != 1 or ids[hit[0]] != expected:
                raise argument_error("text", f"the name at characters {start}-{end} of {text!r} is not the single "
                                     f"token {expected} for this tokenizer (tokens {hit})",
                                     "Put a space before every name and start no sentence with one")
            found.append(hit[0])
        return tuple(found)

    evidence, s_positions = positions(mentions["io"], target), positions(mentions["s"], foil)
    # The task is defined by the IO occurring once and the S twice: a third mention anywhere (a literal name
    # in the template, an object equal to a name, IO == S) makes the logit difference and the evidence wrong.
    for role, token, expected in (("IO", target, evidence), ("S", foil, s_positions)):
        found = tuple(i for i, t in enumerate(ids) if t == token)
        if found != tuple(sorted(expected)):
            raise argument_error("text", f"{text!r} mentions the {role} {(io if role == 'IO' else s)!r} at tokens "
                                 f"{list(found)}, the IOI slots only at {sorted(expected)}",
                                 "Use templates without literal names and distinct names for IO and S")
    return IOIPrompt(text, io, s, order, template, obj, place, tuple(ids), target, foil, evidence, s_positions)


def _fill(template: str, io: str, s: str, order: Order, obj: str, place: str) -> tuple[str, dict]:
    """The prompt text and the character spans of each name's mentions."""
    first, second = (io, s) if order == "ABBA" else (s, io)
    values = {"A": first, "B": second, "S": s, "OBJECT": obj, "PLACE": place}
    text, spans = "", {"io": [], "s": []}
    for literal, key in re.findall(r"([^{]*)(?:\{(\w+)\})?", template):
        text += literal
        if key:
            start = len(text)
            text += values[key]
            if key in ("A", "B", "S"):
                spans["io" if values[key] == io and key != "S" else "s"].append((start, len(text)))
    return text, spans


def _check_names(names: tuple) -> None:
    """Names are distinct non-empty strings: a repeated name would be drawn as both IO and S (target == foil)."""
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise argument_error("names", f"every name must be a non-empty str, got {name!r}",
                                 "Pass a list of names such as ['Tom', 'Amy']", kind=BcosTypeError)
    if len(set(names)) < 2:
        raise argument_error("names", f"need at least two distinct names, got {list(names)}", "Pass more names")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise argument_error("names", f"repeats {repeated}; a repeated name can be drawn as both the IO and the S, "
                             "whose logit difference is then always 0", "Pass each name once (e.g. "
                             "list(dict.fromkeys(names)))")


def _check_templates_name_free(templates: tuple, names: tuple) -> None:
    """Refuse a template whose fixed words (or objects / places) include a name of ``names``: that name would
    occur once more than its slots say (an IO mentioned twice is no longer the name that occurs once)."""
    name_set = set(names)
    for template in templates:
        fixed = re.sub(r"\{\w+\}", " ", template)
        words = set(re.findall(r"\w+", fixed))
        if "{OBJECT}" in template:
            words |= set(IOI_OBJECTS)
        if "{PLACE}" in template:
            words |= set(IOI_PLACES)
        clash = sorted(words & name_set)
        if clash:
            raise argument_error("templates", f"{template!r} contains the name(s) {clash[:5]} outside the {{A}} "
                                 "{B} {S} slots (or among the objects / places it draws), so a prompt could mention "
                                 "the IO or the S once more than the task allows",
                                 "Reword the template without that name, or leave it out of names")


def make_ioi_prompts(
    n: int,
    *,
    split: Split = "train",
    seed: int = 0,
    tokenizer=None,
    templates: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> list[IOIPrompt]:
    """``n`` IOI prompts, deterministic in ``seed``, alternating ABBA and BABA (so both orders are balanced).

    Args:
        n: number of prompts.
        split: ``"train"`` or ``"heldout"`` (disjoint templates and names, module docstring).
        seed: the prompts are a function of ``(n, split, seed, templates, names)`` only.
        tokenizer: a fast tokenizer; default: the GPT-2 tokenizer shipped with the package.
        templates / names: override the split's lists (templates use ``{A} {B} {S} {OBJECT} {PLACE}``).
    """
    n = require_int("n", n, minimum=1)
    seed = require_seed("seed", seed, minimum=None, maximum=None)  # Python's random takes any int
    split = require_choice("split", split, ("train", "heldout"))
    tokenizer = _check_tokenizer(tokenizer)
    templates = tuple(templates) if templates is not None else (
        IOI_TRAIN_TEMPLATES if split == "train" else IOI_HELDOUT_TEMPLATES)
    names = tuple(names) if names is not None else (IOI_TRAIN_NAMES if split == "train" else IOI_HELDOUT_NAMES)
    _check_names(names)
    for t in templates:
        keys = re.findall(r"\{(\w+)\}", t) if isinstance(t, str) else None
        if keys is None or sorted(set(keys) & {"A", "B", "S"}) != ["A", "B", "S"] or keys.count("S") != 1 \
                or set(keys) - {"A", "B", "S", "OBJECT", "PLACE"} or t.lstrip().startswith("{"):
            raise argument_error("templates", f"{t!r} is not an IOI template",
                                 "Use {A} and {B} once each for the introduction and {S} once for the subject's "
                                 "second mention, optionally {OBJECT} and {PLACE}; do not start with a name")
    _check_templates_name_free(templates, names)
    rng = random.Random(f"ioi-{split}-{seed}")
    prompts = []
    for i in range(n):
        template = rng.choice(templates)
        io, s = rng.sample(names, 2)
        obj, place = rng.choice(IOI_OBJECTS), rng.choice(IOI_PLACES)
        order: Order = "ABBA" if i % 2 == 0 else "BABA"
        text, spans = _fill(template, io, s, order, obj, place)
        prompts.append(_tokenise(tokenizer, text, io, s, order, template, obj, place, spans))
    return prompts


def ioi_name_pool(n: int = 2000, *, seed: int = 0, tokenizer=None) -> tuple[str, ...]:
    """``n`` capitalised words that are one token with a leading space, to fill training name slots.

    The candidates are the tokenizer's vocabulary entries that read as a space and a capitalised word of three or
    more letters (" Democracy", " Glover", " Toby"; 10,000 for GPT-2), less the held-out names
    (:data:`IOI_HELDOUT_NAMES`) and every capitalised word of the templates (so a stand-in name never doubles as
    a template word). The draw is a function of ``(n, seed)`` and the vocabulary only, sorted for readability.

    Why: a model trained on a few hundred real names can solve the training prompts by remembering which names
    tend to be the IO; with thousands of stand-ins each seen a few times, only the name-independent mechanism
    works, and held-out prompts (real held-out names, held-out templates) test exactly that.

    Args:
        n: pool size, at most the number of candidates (an error says how many there are).
        seed: which candidates are drawn.
        tokenizer: a fast tokenizer; default: the GPT-2 tokenizer shipped with the package.
    """
    n = require_int("n", n, minimum=2)
    seed = require_seed("seed", seed, minimum=None, maximum=None)  # Python's random takes any int
    tokenizer = _check_tokenizer(tokenizer)
    template_words = set(re.findall(r"[A-Z][a-z]+", " ".join(IOI_TRAIN_TEMPLATES + IOI_HELDOUT_TEMPLATES)))
    excluded = template_words | set(IOI_HELDOUT_NAMES)
    candidates = []
    for piece in tokenizer.get_vocab():
        # the space marker is one character ("Ġ" byte-level, "▁" sentencepiece); decoding all 50k pieces is slow
        if not re.fullmatch(r".[A-Z][a-z]{2,}", piece):
            continue
        word = tokenizer.convert_tokens_to_string([piece])
        if re.fullmatch(r" [A-Z][a-z]{2,}", word):
            word = word[1:]
        elif piece[0] == "▁" and word.lstrip("▁") == piece[1:]:
            # a SentencePiece word piece decodes to the word alone (Llama's decoder drops a first token's space) or
            # keeps its marker: both were left out, and the pool refused "0 capitalised single-token words"
            word = piece[1:]
        else:
            continue
        if word not in excluded:
            candidates.append(word)
    candidates = sorted(set(candidates))
    if n > len(candidates):
        raise argument_error("n", f"the tokenizer has {len(candidates)} capitalised single-token words to draw "
                             f"from, {n} were asked for", f"Use n <= {len(candidates)}")
    return tuple(sorted(random.Random(f"ioi-pool-{seed}").sample(candidates, n)))


def corrupt_ioi(prompts: Sequence[IOIPrompt], *, seed: int = 0, tokenizer=None,
                names: Sequence[str] | None = None) -> list[IOIPrompt]:
    """The "ABC" corruption of each prompt (Wang et al.): same template, object and place, three new names.

    The IO's mention and the S's first and second mentions get three distinct names that are not the clean
    prompt's, so no name repeats and the IO is no longer identifiable. Every name is one token, so clean and
    corrupted prompts align position by position (what activation patching needs): the corrupted prompt keeps
    the clean ``evidence_positions`` / ``s_positions`` as *slots*, and its ``target_id`` / ``foil_id`` are the
    names now in the IO slot and the first S slot.

    Args:
        names: the pool to draw from (default: the list the clean prompt's IO comes from).
    """
    seed = require_seed("seed", seed, minimum=None, maximum=None)  # Python's random takes any int
    tokenizer = _check_tokenizer(tokenizer)
    rng = random.Random(f"ioi-corrupt-{seed}")
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, IOIPrompt) or p.template is None:
            raise argument_error("prompts", f"prompt {i} has no template to refill",
                                 "Corrupt prompts made by make_ioi_prompts", kind=BcosTypeError)
        pool = tuple(names) if names is not None else (
            IOI_TRAIN_NAMES if p.io in IOI_TRAIN_NAMES else IOI_HELDOUT_NAMES)
        fresh = [x for x in dict.fromkeys(pool) if x not in (p.io, p.s)]
        if len(fresh) < 3:
            raise argument_error("names", f"need 3 names other than {p.io!r} and {p.s!r}, got {list(pool)}",
                                 "Pass a longer list of names")
        a, b, c = rng.sample(fresh, 3)
        text, spans = _fill(p.template, a, b, p.order, p.obj or "", p.place or "")
        start, end = max(spans["s"])  # the subject's second mention
        text = text[:start] + c + text[end:]
        ids = list(p.input_ids)
        slots = {p.evidence_positions[0]: a, p.s_positions[0]: b, p.s_positions[1]: c}
        for position, name in slots.items():
            ids[position] = _name_token(tokenizer, name)
        if tokenizer(text, add_special_tokens=False)["input_ids"] != ids:
            raise BcosValueError(f"corrupt_ioi: the corrupted text {text!r} does not tokenise to the clean prompt's "
                                 "tokens with the names swapped; the template's names are not single tokens there")
        if any(ids.count(ids[position]) != 1 for position in slots):
            raise argument_error("names", f"the corrupted text {text!r} mentions one of {[a, b, c]} outside its slot "
                                 "(the template or its object / place holds that word), so a name repeats",
                                 "Leave the template's own words out of names")
        out.append(IOIPrompt(text, a, b, p.order, p.template, p.obj, p.place, tuple(ids), ids[p.evidence_positions[0]],
                             ids[p.s_positions[0]], p.evidence_positions, p.s_positions))
    return out


def _parse_sentence(sentence: str) -> tuple[str, str, str, list, list] | None:
    """Prompt, IO, S and mention spans of one complete IOI sentence, or None if it is not one."""
    sentence = sentence.strip().rstrip(".").rstrip()
    match = re.search(r"\s(\w+)$", sentence)
    if not match:
        return None
    io, prompt = match.group(1), sentence[: match.start()]
    words = list(re.finditer(r"\b[A-Z]\w*\b", prompt))
    io_mentions = [m.span() for m in words if m.group() == io]
    counts: dict[str, list] = {}
    for m in words:
        if m.group() != io:
            counts.setdefault(m.group(), []).append(m.span())
    repeated = [name for name, spans in counts.items() if len(spans) == 2]
    if len(io_mentions) != 1 or len(repeated) != 1:
        return None
    s = repeated[0]
    return prompt, io, s, io_mentions, counts[s]


def _jsonl_sentence(line: str, number: int, path, column: str):
    """The ``column`` field of one jsonl line, refused naming the line where it is no JSON object holding it (a
    KeyError or json's decode error named neither the file, the line nor the ``column`` argument)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise argument_error("path", f"{path}, line {number} is not JSON ({err.msg})",
                             "Pass one JSON object per line (.jsonl), or a .txt file of sentences") from None
    if not isinstance(row, dict) or column not in row:
        fields = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise argument_error("column", f"{path}, line {number} has no field {column!r} (it holds {fields})",
                             "Pass column=<the field holding the sentences>")
    return row[column]


def load_ioi(
    path: str | Path | None = None,
    *,
    source: Literal["local", "hub"] = "local",
    column: str = "ioi_sentences",
    n: int | None = None,
    tokenizer=None,
    hub_name: str = "fahamu/ioi",
) -> list[IOIPrompt]:
    """IOI prompts from complete sentences in the public format (one sentence ending with the IO's name per row).

    Args:
        path: a ``.jsonl`` file (rows with ``column``) or a text file (one sentence per line).
        source: ``"local"`` (``path``) or ``"hub"`` (``datasets.load_dataset(hub_name)``, network needed).
        column: the sentence field of jsonl rows / hub rows.
        n: keep the first ``n`` usable sentences (fewer found: all of them, with a ``UserWarning``).

    The last word is the IO; the S is the one capitalised word occurring twice before it, and the IO's single
    earlier mention is the evidence. Sentences where that reading fails, or whose names are not single tokens,
    are skipped. The order (ABBA / BABA) is read from which name comes first.
    """
    tokenizer = _check_tokenizer(tokenizer)
    source = require_choice("source", source, ("local", "hub"))
    if n is not None:
        n = require_int("n", n, minimum=1)
    if source == "hub":
        from datasets import load_dataset

        sentences = (row[column] for row in load_dataset(hub_name, split="train", streaming=True))
    else:
        # a folder passed .exists() and failed in read_text (IsADirectoryError)
        if path is None or not data_file(path).is_file():
            raise argument_error("path", f"{path!r} is not a file",
                                 "Pass a .jsonl / .txt file of IOI sentences, or source='hub' to use `datasets`",
                                 kind=BcosFileError)
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        if str(path).endswith(".jsonl"):
            sentences = (_jsonl_sentence(line, number, path, column) for number, line in enumerate(lines, start=1)
                         if line.strip())
        else:
            sentences = (line for line in lines if line.strip())
    prompts = []
    for sentence in sentences:
        # a null sentence failed inside the parser ('NoneType' has no attribute 'strip'): like any row that is no
        # complete IOI sentence, it is skipped
        parsed = _parse_sentence(sentence) if isinstance(sentence, str) else None
        if parsed is None:
            continue
        text, io, s, io_spans, s_spans = parsed
        order: Order = "ABBA" if io_spans[0][0] < s_spans[0][0] else "BABA"
        try:
            prompts.append(_tokenise(tokenizer, text, io, s, order, None, None, None, {"io": io_spans, "s": s_spans}))
        except BcosValueError:
            continue
        if n is not None and len(prompts) == n:
            break
    if not prompts:
        raise argument_error("path" if source == "local" else "column", "no row is a complete IOI sentence",
                             f"Check the column name ({column!r}) and that sentences end with the IO's name")
    where = f"{hub_name!r} on the hub" if source == "hub" else f"the file {path}"
    return first_rows(prompts, n, "load_ioi", where, "usable sentences")


@dataclass
class IOIBatch(ContrastiveBatch):
    """Tokenised prompts, left-padded, ready for ``explain(..., target=target_ids, foil=foil_ids)``.

    ``evidence`` marks the IO's earlier mention; ``candidates`` the ranked tokens (real prompt tokens, BOS
    excluded), as :class:`~bcos_plugins.data.BlimpBatch` does, so ``mean_reciprocal_rank(scores, evidence,
    candidates)`` applies unchanged. ``s_positions`` / ``io_positions`` are column indices in the padded batch.
    """

    io_positions: Int[Tensor, " batch"]
    s_positions: Int[Tensor, "batch 2"]
    prompts: list[IOIPrompt] = field(default_factory=list)


def encode_ioi(prompts: Sequence[IOIPrompt], *, bos_token_id: int | None = None,
               pad_token_id: int = 0) -> IOIBatch:
    """Left-pad prompts into one batch (each prompt ends at the last column, where the model predicts).

    Args:
        bos_token_id: prepended to every prompt when given (never a candidate for ranking).
        pad_token_id: id written into padding (masked out by ``attention_mask``).
    """
    if isinstance(prompts, IOIPrompt) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise argument_error("prompts", "must be a non-empty list of IOIPrompt",
                             "Make them with make_ioi_prompts or load_ioi", kind=BcosTypeError)
    for i, p in enumerate(prompts):
        if not isinstance(p, IOIPrompt):
            raise argument_error("prompts", f"item {i} is a {type(p).__name__}, not an IOIPrompt",
                                 "Make them with make_ioi_prompts or load_ioi", kind=BcosTypeError)
        if len(p.input_ids) == 0:  # named here: left_pad's refusal names its own argument, rows
            raise argument_error("prompts", f"item {i} has no input_ids, so no prediction to explain",
                                 "Make them with make_ioi_prompts or load_ioi")
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    if bos_token_id is not None:
        bos_token_id = require_int("bos_token_id", bos_token_id, minimum=0)
    input_ids, attention_mask, evidence, candidates, starts = left_pad(
        [p.input_ids for p in prompts],
        [[j in p.evidence_positions for j in range(len(p.input_ids))] for p in prompts],
        pad_token_id=pad_token_id, bos_token_id=bos_token_id)
    io_positions = starts + torch.tensor([p.evidence_positions[0] for p in prompts])
    s_positions = starts[:, None] + torch.tensor([list(p.s_positions[:2]) for p in prompts])
    return IOIBatch(input_ids, attention_mask, torch.tensor([p.target_id for p in prompts]),
                    torch.tensor([p.foil_id for p in prompts]), evidence, candidates, io_positions, s_positions,
                    list(prompts))
