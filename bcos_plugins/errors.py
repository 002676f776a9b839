"""The package's exception types.

Every public entry point validates its inputs before doing work and raises one of these. Each subclasses
the built-in exception users already catch (``except ValueError`` keeps working) and :class:`BcosError`, so
``except bcos_plugins.BcosError`` catches everything the package refuses on purpose. Messages follow one
pattern: the argument, what was wrong with it, and what to do instead.
"""

from __future__ import annotations

__all__ = [
    "BcosError",
    "BcosValueError",
    "BcosTypeError",
    "BcosKeywordError",
    "BcosRuntimeError",
    "BcosFileError",
    "UnmaskedPaddingWarning",
    "TruncatedRationaleWarning",
    "TokenizerMismatchWarning",
    "argument_error",
]


class BcosError(Exception):
    """Base class of every error the package raises on purpose."""


class BcosValueError(BcosError, ValueError):
    """An argument has the right type but an invalid value (shape, range, NaN, ...)."""


class BcosTypeError(BcosError, TypeError):
    """An argument has the wrong type, or a model is not one the call supports."""


class BcosKeywordError(BcosTypeError, BcosValueError):
    """A keyword argument :func:`~bcos_plugins.load_bcos_model` does not accept: one that would replace the saved
    configuration (``config``, ``bcos``) or change the saved head (``num_labels``, ``id2label``, ``label2id``), a
    ``from_pretrained`` argument it sets itself, or a misspelt one.

    A :class:`BcosTypeError` first, as Python's own refusal of an unexpected keyword is a ``TypeError`` (and the
    package's other keyword refusals are); also a :class:`BcosValueError`, because 0.2.0 raised that for the
    ``config`` / ``bcos`` / label keywords, so ``except ValueError`` written against it keeps working.
    """


class BcosRuntimeError(BcosError, RuntimeError):
    """The call is valid but cannot run in the current state (a mode, a context, a missing setup step)."""


class BcosFileError(BcosError, FileNotFoundError):
    """A path to load from is missing, empty or truncated; the message names the file."""


class UnmaskedPaddingWarning(UserWarning):
    """Token ids were passed without ``attention_mask`` but their rows look padded: they differ in the length of a
    run of ``config.pad_token_id`` at their start or end. The ids are explained as given, the padding attended to as
    tokens (exactly what ``model(ids)`` computes, rarely the input meant); pass the tokenizer's ``attention_mask``.
    Issued by the one token-batch check (:func:`bcos_plugins._checks.token_batch_and_padding`) of every path that
    takes ids without a mask: ``explain``, the Captum and TransformerLens adapters, the Space model, the metrics
    ``next_token_contrast``, ``perturbation_curves`` and (a padded tensor as ``texts``) ``perplexity``."""


class TruncatedRationaleWarning(UserWarning):
    """Truncation cut part of a row's human rationale: :func:`bcos_plugins.guided.gold_mask_from_spans` /
    :func:`~bcos_plugins.guided.gold_mask_from_words` mark the part the encoding kept, so that row's guidance and
    rationale metrics (IoU, AUPRC) use a smaller rationale than the annotators gave. The message names the rows
    and how much each lost; tokenise with a larger ``max_length`` to keep it whole, or turn this warning into an
    error (``warnings.simplefilter("error", TruncatedRationaleWarning)``) to refuse such rows."""


class TokenizerMismatchWarning(UserWarning):
    """The tokenizer passed with a model looks like another model's although every id it gives fits the model's
    vocabulary (a BERT tokenizer on a GPT-2): the model and the tokenizer were loaded from different names and none
    of the special tokens the model's config names (BOS, EOS, CLS, SEP) is a special token of the tokenizer. Its ids
    are read as the model's own tokens, so predictions and explanations are of other texts than the ones shown.
    Issued where a model and a tokenizer are passed together (``explain_dataset``, ``predict`` / ``accuracy``,
    ``predict_labels``, the inseq adapter's ``load_classifier``, ``inseq.load_model(model, "bcos", tokenizer=...)``);
    never when the names match or either is unnamed (weak evidence), and never a refusal."""


def argument_error(name: str, problem: str, fix: str, *, kind: type[BcosError] = BcosValueError) -> BcosError:
    """Build an error in the package's pattern: ``"<name>: <problem>. <fix>"``.

    Examples:
        >>> from bcos_plugins.errors import argument_error
        >>> raise argument_error("b", "must be finite and >= 1, got inf", "Use 1.25-1.5 for classifiers")
        Traceback (most recent call last):
        bcos_plugins.errors.BcosValueError: b: must be finite and >= 1, got inf. Use 1.25-1.5 for classifiers.
    """
    problem = problem.rstrip(".")
    fix = fix.rstrip(".")
    return kind(f"{name}: {problem}. {fix}.")
