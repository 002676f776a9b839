"""Batched prediction with a text classifier: logits and accuracy for lists of texts (or sentence pairs)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ._checks import (
    refuse_a_model_as_the_tokenizer,
    require_classifier,
    require_count,
    require_labels,
    require_model_object,
    require_text_pairs,
    require_texts,
    rows_named_as,
    warn_if_another_models_tokenizer,
)
from .attribution.text import (
    padding_named_as_tokenizers,
    refuse_nan_logits,
    registry_spec,
    rows_as_alone_call,
)
from .corpus import (
    mask_keywords,
    require_texts_with_tokens,
    require_tokenizer_ids_fit,
    truncated_token_counts,
    truncation_named,
    warn_of_truncated_texts,
)
from .encoded_texts import truncation_length
from .errors import argument_error
from .nn.dynamic import evaluating
from .nn.functional import at_least_float32

__all__ = ["accuracy", "predict"]


@torch.no_grad()
def predict(model: nn.Module, tokenizer, texts: list[str], *, text_pairs: list[str] | None = None,
            batch_size: int = 64, max_length: int | None = None) -> Tensor:
    """Logits ``(n, classes)`` for a list of texts (with ``text_pairs``: sentence pairs), batched, in eval mode,
    row ``i`` for text ``i``, on the CPU, in float32 (float64 for a float64 model).

    Texts are batched in order of length (each batch is padded to its longest text, so similar lengths waste
    less work) and the rows are put back in the input order. They are truncated to ``max_length`` tokens: by
    default 64, capped at the model's position limit; a longer one is refused. A ``UserWarning`` names the texts
    that were cut and the ``max_length`` that keeps every token, as :func:`~bcos_plugins.explain_dataset` warns. A tokenizer that pads on the left
    is refused for a classifier that reads the first column (BERT, DistilBERT, RoBERTa, ModernBERT with
    ``classifier_pooling="cls"``): a padded row's logits would be a padding token's (the error names the padded
    texts by their index in ``texts``). Models of the architecture
    registry are called as ``explain`` calls them (``rows_as_alone_call``), so a decoder classifier's rows are
    computed as alone under either padding side (position ids count real tokens). A batch of one text is encoded
    without padding, so a tokenizer without a pad token (GPT-2's) serves one text or ``batch_size=1``; for a batch
    of several texts it is refused naming the fix (``tokenizer.pad_token = tokenizer.eos_token``).
    """
    return batched_logits(model, tokenizer, texts, text_pairs=text_pairs, batch_size=batch_size, max_length=max_length)


@torch.no_grad()
def batched_logits(model: nn.Module, tokenizer, texts: list[str], *, text_pairs: list[str] | None = None,
                   batch_size: int = 64, max_length: int | None = None, default_max_length: int = 64,
                   caller: str = "predict", progress: bool = False) -> Tensor:
    """:func:`predict`, the one batch loop of the package's classifiers' predictions (``predict``, ``accuracy``,
    :func:`~bcos_plugins.space.predict_labels`): ``default_max_length`` is the caller's usual truncation length,
    ``caller`` the name its refusals and its truncation warning give (an outer :func:`truncation_named` holds),
    ``progress`` a progress bar over the batches."""
    require_model_object(model)
    refuse_a_model_as_the_tokenizer(tokenizer, call=f"{caller}(model, tokenizer, texts)")
    texts = require_texts(texts)
    text_pairs = require_text_pairs(text_pairs, len(texts))
    require_count("batch_size", batch_size)
    warn_if_another_models_tokenizer(model, tokenizer)  # ids that fit, read as other tokens: predictions of other texts
    # a batch of one text needs no padding (it is encoded without): only several texts in a batch need a pad token,
    # and transformers' own refusal came even for one text and named neither the argument nor batch_size=1
    pads = len(texts) > 1 and batch_size > 1
    if pads and hasattr(tokenizer, "pad_token") and tokenizer.pad_token is None:
        raise argument_error("tokenizer", f"has no pad token (as GPT-2's), so a batch of {min(len(texts), batch_size)} "
                             "texts cannot be padded to one length", "Set tokenizer.pad_token = tokenizer.eos_token "
                             "(the padded positions are masked), or pass one text at a time (batch_size=1)")
    max_length = truncation_length(model, max_length, default=default_max_length)
    device = next(model.parameters()).device
    spec = registry_spec(model)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]) + (len(text_pairs[i]) if text_pairs else 0))
    # each batch's texts in the caller's order, so that refusals list their indices ascending ([1, 3], not [3, 1])
    batches = [sorted(order[start : start + batch_size]) for start in range(0, len(texts), batch_size)]
    out, cut_counts = [], [None] * len(texts)
    with evaluating(model):  # each module's training flag is restored afterwards
        for rows in tqdm(batches, disable=not progress, desc=caller):
            pairs = None if text_pairs is None else [text_pairs[i] for i in rows]
            # the mask asked for (mask_keywords): a padded BERT row's logits were of its padding attended to, silently
            # the pairs only where there are pairs: predict_labels takes any callable tokenizer (a Space model's own)
            # that takes texts and transformers' padding keywords, not necessarily a second segment
            segments = {} if pairs is None else {"text_pair": pairs}
            enc = tokenizer([texts[i] for i in rows], padding=len(rows) > 1, truncation=True, max_length=max_length,
                            return_tensors="pt", **segments, **mask_keywords(tokenizer)).to(device)
            # ids past the embedding failed deep in torch (IndexError; a device-side assert on a GPU)
            require_tokenizer_ids_fit(model, tokenizer, enc)
            mask = enc.get("attention_mask")
            kept = [enc["input_ids"].shape[1]] * len(rows) if mask is None else mask.sum(1).tolist()
            require_texts_with_tokens(kept, rows, texts, "texts", "predict")
            # texts longer than max_length (64 by default) were classified from their first tokens without a word:
            # warned of as explain_dataset warns (one detection, one warning)
            for row, count in zip(rows, truncated_token_counts(tokenizer, [texts[i] for i in rows], pairs, kept,
                                                               max_length), strict=True):
                cut_counts[row] = count
            # refusals name the caller's rows, not the length-sorted batch's, and of left padding the tokenizer's
            # padding side (they named attention_mask, an argument the caller never passed); the model's own too (a
            # Space model's refusal of its encoder's left padding named the batch's rows and attention_mask)
            with rows_named_as(rows), padding_named_as_tokenizers(tokenizer):
                call = rows_as_alone_call(model, enc["input_ids"], enc.get("attention_mask"), tokenizer_outputs=enc,
                                          spec=spec)
                logits = model(**call).logits
            chunk = logits.to(at_least_float32(logits.dtype)).cpu()  # (a float64 model's logits stay float64)
            refuse_nan_logits(caller, chunk.isnan().any(-1), rows, "texts", chunk.dtype, call.get("attention_mask"),
                              "Predict in float32 (model.float()), or with batch_size=1 (no padding).", model=model,
                              input_ids=call.get("input_ids", enc["input_ids"]))  # the ids fed (padding rewritten)
            out.append(chunk)
    warn_of_truncated_texts(caller, cut_counts, max_length, model, tokenizer, text_pairs is not None,
                            outcome="classified from")
    logits = torch.cat(out)
    return logits[torch.argsort(torch.tensor([i for rows in batches for i in rows]))]


def accuracy(model: nn.Module, tokenizer, texts: list[str], labels: list[int], **kwargs) -> float:
    """Share of texts whose predicted class equals the label (``kwargs``: :func:`predict`'s, ``text_pairs``
    included)."""
    labels = require_labels(labels, require_classifier(model), n=len(require_texts(texts)))
    with truncation_named("accuracy"):  # predict's truncation warning names the call the user made
        pred = predict(model, tokenizer, texts, **kwargs).argmax(-1)
    # the count over n as a Python float (float64): a float32 mean gave 0.6666666865 for 4 of 6 and 0.85000002 for 17 of
    # 20, numbers no count of texts gives
    return int((pred == torch.as_tensor(labels)).sum()) / len(labels)
