"""Zero-shot cross-dataset evaluation (the Space Model paper's generalisability test).

Train a classifier on one binary dataset, then evaluate it unchanged on another whose labels mean the same
thing (SST-2 -> rt_polarity: 0 = negative, 1 = positive in both). Works for any sequence classifier that
returns ``logits`` (Space Model, stock or B-cos transformers classifiers), so baselines are measured the same
way. Accuracy and macro F1 are reported, as in the paper (macro F1 matters on imbalanced targets).
"""

from __future__ import annotations

import csv
import numbers
from collections.abc import Mapping, Sequence, Sized
from pathlib import Path

from torch import nn

from .._checks import (
    refuse_unordered,
    require_int,
    require_texts,
)
from ..corpus import truncation_named
from ..errors import BcosFileError, BcosTypeError, argument_error
from ..prediction import batched_logits

__all__ = ["read_sst2_tsv", "read_rt_polarity", "predict_labels", "classification_scores",
           "zero_shot_evaluation"]


def _existing_file(name: str, path) -> Path:
    if not isinstance(path, str | Path):
        raise argument_error(name, f"must be a path, got {type(path).__name__}", "Pass the file's path",
                             kind=BcosTypeError)
    if not Path(path).is_file():
        raise BcosFileError(f"{name}: {path} is not a file. Pass the path of an existing file.")
    return Path(path)


def read_sst2_tsv(path: str | Path, limit: int | None = None) -> tuple[list[str], list[int]]:
    """Texts and labels of a GLUE-style SST-2 ``.tsv`` (header ``sentence<TAB>label``); at most ``limit`` rows."""
    if limit is not None:
        # limit=0 used to return one row and a negative limit one row too.
        limit = require_int("limit", limit, minimum=0)
        if limit == 0:
            return [], []
    path = _existing_file("path", path)
    texts, labels = [], []
    # utf-8-sig: a byte-order mark (a file saved by a spreadsheet) made the header "\ufeffsentence", refused
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if reader.fieldnames is None or not {"sentence", "label"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: expected a header with 'sentence' and 'label' columns; got {reader.fieldnames}")
        for row in reader:
            # a row without a label failed on "int() argument must be ... not 'NoneType'", a label such as
            # "positive" on "invalid literal for int()", neither naming the file's line
            sentence, label = row["sentence"], row["label"]
            try:
                label_id = int(label) if sentence is not None else None
            except (TypeError, ValueError):
                label_id = None
            if label_id is None:
                raise argument_error("path", f"{path} line {reader.line_num}: expected a sentence and an integer "
                                     f"label separated by a tab, got sentence={sentence!r}, label={label!r}",
                                     "Fix that line (GLUE's SST-2 labels are 0 and 1)")
            texts.append(sentence.strip())
            labels.append(label_id)
            if limit is not None and len(texts) >= limit:
                break
    return texts, labels


def read_rt_polarity(folder: str | Path, limit_per_class: int | None = None) -> tuple[list[str], list[int]]:
    """Texts and labels (0 = negative, 1 = positive) from ``rt-polarity.neg`` / ``rt-polarity.pos``."""
    if limit_per_class is not None:
        # A negative limit used to drop rows from the end (a slice), silently.
        limit_per_class = require_int("limit_per_class", limit_per_class, minimum=0)
    if not isinstance(folder, str | Path):
        raise argument_error("folder", f"must be a path, got {type(folder).__name__}",
                             "Pass the folder holding rt-polarity.neg and rt-polarity.pos", kind=BcosTypeError)
    folder = Path(folder)
    texts, labels = [], []
    for label, name in ((0, "rt-polarity.neg"), (1, "rt-polarity.pos")):
        path = folder / name
        if not path.is_file():
            raise BcosFileError(f"folder: {path} not found. Pass the folder holding rt-polarity.neg and "
                                "rt-polarity.pos.")
        lines = [line.strip() for line in _read_text(path).splitlines() if line.strip()]
        lines = lines[:limit_per_class] if limit_per_class is not None else lines
        texts += lines
        labels += [label] * len(lines)
    return texts, labels


def _read_text(path: Path) -> str:
    """UTF-8, else Latin-1: Cornell's rt-polaritydata v1.0 files are Latin-1 (``caf\xe9``), on which a UTF-8 read
    failed with a UnicodeDecodeError; every byte string is valid Latin-1, and the shipped slice is UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def predict_labels(model, tokenizer, texts: Sequence[str], batch_size: int = 32, max_length: int | None = None,
                   progress: bool = False) -> list[int]:
    """Arg-max class of each text: :func:`~bcos_plugins.train.predict`'s logits (its one batch loop,
    :func:`~bcos_plugins.prediction.batched_logits`), with its checks and answers: the model in eval mode, the texts
    batched in order of length and padded per batch, a tokenizer that pads on the left refused for a classifier that
    reads the first column (BERT's, DistilBERT's, RoBERTa's, naming the texts' indices), models of the architecture
    registry called as ``explain`` calls them (``rows_as_alone_call``), so a decoder classifier's rows are computed as
    alone under either padding side, and any other classifier (a Space model) with the tokenizer's outputs (a
    transformers model outside the registry that reads a learned position table is refused left padding). Texts are
    truncated to ``max_length`` tokens: by default 128 (``predict``'s is 64), capped at the model's position limit (a
    longer one is refused). A ``UserWarning`` names the texts that were cut and the ``max_length`` that keeps every
    token, once per call, as ``predict`` warns."""
    if not isinstance(model, nn.Module) or not callable(tokenizer):
        raise argument_error("model", f"predict_labels needs a torch classifier and its tokenizer, got "
                             f"{type(model).__name__} and {type(tokenizer).__name__}",
                             "Pass the model and tokenizer", kind=BcosTypeError)
    if isinstance(texts, str | bytes):
        # A string is a sequence too: each character would be classified as a text of its own.
        raise argument_error("texts", "is a single string", "Pass a list of texts (e.g. [text])",
                             kind=BcosTypeError)
    _refuse_unordered("texts", texts)
    # the package's texts check (a BatchEncoding or DataFrame iterates over its names): a generator failed on len(), a
    # None or a word list inside on "'NoneType' object has no attribute 'split'" in the tokenizer; no text, no prediction
    if isinstance(texts, Sized) and len(texts) == 0:
        return []
    texts = require_texts(texts)
    batch_size = require_int("batch_size", batch_size, minimum=1)
    # predict's one batch loop: a copy of it here (truncation warning, padding, rows as alone) was kept in step by hand
    logits = batched_logits(model, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                            default_max_length=128, caller="predict_labels", progress=progress)
    return logits.argmax(-1).tolist()


def _refuse_unordered(name: str, values) -> None:
    """A set has no order: the predictions (or labels) read from it could not be matched to the other list, and
    zero_shot_evaluation scored them against each other in the set's arbitrary order (the package's one rule,
    :func:`~bcos_plugins._checks.refuse_unordered`)."""
    refuse_unordered(name, values, "Pass a list in the order of the texts")


def classification_scores(labels: Sequence[int], predictions: Sequence[int], *,
                          classes: Sequence[int] | None = None) -> dict[str, float]:
    """Accuracy and macro precision / recall / F1 (scikit-learn's definitions; the macro averages are over
    ``classes``, by default the classes seen in either list)."""
    try:
        from sklearn.metrics import accuracy_score, precision_recall_fscore_support
    except ImportError:
        raise ImportError("classification_scores needs scikit-learn: pip install scikit-learn "
                          "(or the 'captum' extra)") from None

    for name, values in (("labels", labels), ("predictions", predictions)):
        if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
            raise argument_error(name, f"must be a sequence of class ids, got {type(values).__name__}",
                                 "Pass a list of ints", kind=BcosTypeError)
    labels, predictions = _class_ids("labels", labels), _class_ids("predictions", predictions)
    if len(labels) != len(predictions):
        raise argument_error("predictions", f"has {len(predictions)} entries for {len(labels)} labels",
                             "Pass one prediction per label")
    if not labels:
        raise argument_error("labels", "is empty, so the scores are undefined", "Pass at least one example")
    precision, recall, f1, _ = precision_recall_fscore_support(
        labels, predictions, labels=None if classes is None else list(classes), average="macro", zero_division=0)
    return {"accuracy": float(accuracy_score(labels, predictions)), "f1_macro": float(f1),
            "precision_macro": float(precision), "recall_macro": float(recall), "n": len(labels)}


def _class_ids(name: str, values) -> list[int]:
    """``values`` as a list of int class ids (``-1``, an unmapped prediction, included): a nested list (``[[0, 1]]``)
    was scored by scikit-learn as one multi-label row (n = 1, a macro F1 over columns), without a word."""
    values = values.tolist() if hasattr(values, "tolist") else list(values)  # tensors and arrays: Python ints
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral)), None)
    if bad is not None:
        raise argument_error(name, f"must hold one int class id per example, got {type(bad).__name__} {bad!r}",
                             "Pass a flat list of ints, e.g. [0, 1, 1]", kind=BcosTypeError)
    return [int(v) for v in values]


def _is_class_id(value) -> bool:
    """A class id as ``label_map`` holds it: an int >= 0 (a NumPy integer too), not a bool, string, float or tensor
    (a tensor key is hashed by identity, so no prediction matched it)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def zero_shot_evaluation(
    model,
    tokenizer,
    texts: Sequence[str],
    labels: Sequence[int],
    label_map: Mapping[int, int] | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Evaluate a trained classifier on another dataset without any training on it.

    ``label_map`` maps the model's class ids to the target dataset's label ids when they differ (e.g. a
    3-class model evaluated on a binary set); unmapped predictions count as errors, and the macro averages are over
    the dataset's labels and the mapped predictions' classes. ``labels`` are class ids >= 0 (an unlabelled split's
    -1, GLUE's test sets', is refused).
    """
    for name, values in (("texts", texts), ("labels", labels)):
        if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
            raise argument_error(name, f"must be a sequence, got {type(values).__name__}",
                                 "Pass a list (e.g. [text] for one text)", kind=BcosTypeError)
        _refuse_unordered(name, values)
    if label_map is not None and not isinstance(label_map, Mapping):
        raise argument_error("label_map", f"must be a mapping from model class to dataset label, got "
                             f"{type(label_map).__name__}", "Pass e.g. {0: 0, 1: 1}", kind=BcosTypeError)
    if label_map is not None:
        # class ids on both sides: a map read from JSON ({"0": 0, "1": 1}) or keyed by tensors matched no prediction,
        # so every one counted as an error (accuracy 0.0 without a word), and string labels failed inside sorted()
        label_map = dict(label_map.items())
        bad = next(((k, v) for k, v in label_map.items() if not (_is_class_id(k) and _is_class_id(v))), None)
        if bad is not None:
            raise argument_error("label_map", f"maps {bad[0]!r} to {bad[1]!r}, but its keys (the model's classes) and "
                                 "values (the dataset's labels) must be int class ids >= 0",
                                 "Convert them, e.g. {int(k): int(v) for k, v in label_map.items()} for a map read "
                                 "from JSON", kind=BcosTypeError)
        label_map = {int(k): int(v) for k, v in label_map.items()}
    if len(texts) != len(labels):
        raise argument_error("labels", f"{len(texts)} texts but {len(labels)} labels", "Pass one label per text")
    if len(texts) == 0:
        raise argument_error("texts", "nothing to evaluate: texts is empty", "Pass at least one text")
    # class ids >= 0: an unmapped prediction is written as -1 below, which an unlabelled split's -1 matched (accuracy
    # 1.0 for a model none of whose classes map)
    labels = [require_int("labels", y, minimum=0) for y in labels]
    with truncation_named("zero_shot_evaluation"):  # predict_labels' truncation warning names the call the user made
        predictions = predict_labels(model, tokenizer, texts, batch_size, max_length, progress)
    if label_map is not None:
        predictions = [label_map.get(p, -1) for p in predictions]
    # the -1 of unmapped predictions is no class: in the macro averages it was one (precision 0, pulling them down)
    classes = sorted(set(labels) | {p for p in predictions if p != -1})
    return classification_scores(labels, predictions, classes=classes)
