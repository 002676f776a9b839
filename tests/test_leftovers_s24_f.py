"""Leftovers of trust pass 23 over the explanation core (session 24, helper-170), each pinned by a test that fails
before its fix:

- A tokenizer whose ``model_input_names`` leave out the attention mask (``["input_ids"]``; here the shipped
  all-MiniLM-L6-v2 BERT tokenizer): the inseq adapter's ``BcosClassifier.attribute`` read ``enc["attention_mask"]``
  and failed with ``KeyError: 'attention_mask'``; ``fine_tune_classifier`` padded its batches without a mask, so every
  padded row was trained on with its padding attended to as tokens, silently. Both ask for the mask through
  ``corpus.mask_keywords``, as ``predict`` does. ``pretrain_masked_lm`` (``DataCollatorForLanguageModeling``) padded
  without a mask too, silently; it pads with the mask first (``pretrain.MaskedLMPadding``).
- ``predict`` / ``accuracy`` cut texts to 64 tokens by default (or to ``max_length``) without a word, where
  ``explain_dataset`` warns: both now warn through one helper (``corpus.warn_of_truncated_texts``), naming how many
  texts were cut, which, and the ``max_length`` that keeps every token.
- A tokenizer that pads on the left, for a classifier that reads the first column: ``explain_dataset`` (and
  ``predict``, ``fine_tune_classifier``, ``space.predict_labels``, the inseq ``BcosClassifier``) refused it naming
  ``attention_mask``, an argument the caller never passed.
  The refusal names the tokenizer's padding side (``attribution.text.padding_named_as_tokenizers``) and keeps the fix.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from bcos_plugins import bcosify
from bcos_plugins.pretrained import minilm_path

warnings.filterwarnings("ignore", category=DeprecationWarning)

_TEXTS = ["a gripping, well acted film", "dull", "the plot wanders but the cast holds it together", "fine"]


def _minilm_tokenizer(*, with_mask: bool):
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    if not with_mask:
        tokenizer.model_input_names = ["input_ids"]  # tokenizer(...) then returns no attention_mask, padded or not
        assert "attention_mask" not in tokenizer(_TEXTS[:2], padding=True)
    return tokenizer


def _bcos_bert(vocab: int, seed: int = 0):
    """A tiny B-cos BERT classifier over the MiniLM tokenizer's vocabulary (random weights, no dropout)."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return bcosify(BertForSequenceClassification(config).eval())


# ------------------------------------------------------------------ 1. tokenizers that return no attention mask


def test_inseq_classifier_with_a_tokenizer_that_returns_no_mask_attributes_each_text_as_alone():
    """BcosClassifier._attribute_batch read enc["attention_mask"]: KeyError: 'attention_mask'."""
    from bcos_plugins.adapters.inseq import load_classifier

    maskless, masked = _minilm_tokenizer(with_mask=False), _minilm_tokenizer(with_mask=True)
    model = _bcos_bert(len(masked))
    out = load_classifier(model, maskless).attribute(_TEXTS, batch_size=4)
    for i, text in enumerate(_TEXTS):
        alone = load_classifier(model, masked).attribute(text).sequence_attributions[0]
        row = out.sequence_attributions[i]
        assert [t.token for t in row.source] == [t.token for t in alone.source]
        torch.testing.assert_close(row.source_attributions, alone.source_attributions, rtol=1e-5, atol=1e-6)


def test_fine_tune_classifier_with_a_tokenizer_that_returns_no_mask_trains_as_with_the_mask(tmp_path):
    """The padding collator padded without a mask: each padded row was trained on with its padding attended to as
    tokens, silently (the weights after one epoch differed from the run with the mask)."""
    from bcos_plugins.fine_tuning import fine_tune_classifier

    maskless, masked = _minilm_tokenizer(with_mask=False), _minilm_tokenizer(with_mask=True)
    trained = []
    for tokenizer in (masked, maskless):
        model = _bcos_bert(len(masked))
        fine_tune_classifier(model, tokenizer, _TEXTS, [1, 0, 1, 0], epochs=1, batch_size=4, learning_rate=1e-2,
                             progress=False, output_dir=str(tmp_path / str(len(trained))), save_strategy="no",
                             report_to=[])
        trained.append(model.state_dict())
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_pretrain_masked_lm_with_a_tokenizer_that_returns_no_mask_trains_as_with_the_mask(tmp_path):
    """DataCollatorForLanguageModeling padded without a mask: each padded row was pre-trained on with its padding
    attended to as tokens, silently."""
    from transformers import BertForMaskedLM

    from bcos_plugins.pretrain import pretrain_masked_lm

    maskless, masked = _minilm_tokenizer(with_mask=False), _minilm_tokenizer(with_mask=True)
    trained = []
    for tokenizer in (masked, maskless):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(masked), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        model = bcosify(BertForMaskedLM(config), verbose=False)
        model = pretrain_masked_lm(model, tokenizer, _TEXTS * 2, epochs=1, batch_size=8, learning_rate=1e-2,
                                   mlm_probability=0.5, progress=False, output_dir=str(tmp_path / str(len(trained))),
                                   save_strategy="no", report_to=[]).model
        trained.append(model.state_dict())
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------------ 2. predict / accuracy warn of the texts they cut


def texts_cut_at(tokenizer, caller: str, max_length: int, words: tuple[int, int]) -> tuple[list[str], str]:
    """Four texts, 1 and 3 of ``words`` words (one MiniLM token each, with [CLS] and [SEP]: 2 tokens more), and the
    pattern of ``caller``'s warning that texts 1 and 3 are cut to ``max_length``, naming text 1's count as the fix
    (tests/test_leftovers_s25_d.py's predict_labels too)."""
    texts = ["short", " ".join(["word"] * words[0]), "also short", " ".join(["film"] * words[1])]
    counts = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert counts[1] == words[0] + 2 and counts[3] == words[1] + 2
    return texts, (rf"{caller}: 2 text\(s\) \[1, 3\] have more than max_length={max_length} tokens: each is classified "
                   rf"from the first tokens the tokenizer kept \(its first {max_length}, .*\)\. Pass "
                   rf"max_length={counts[1]} \(the longest text's tokens\)")


def test_predict_and_accuracy_warn_of_texts_cut_to_the_default_64_tokens():
    """A text of 80 words was classified from its first 64 tokens, silently."""
    from bcos_plugins.prediction import accuracy, predict

    tokenizer = _minilm_tokenizer(with_mask=True)
    model = _bcos_bert(len(tokenizer))
    texts, expected = texts_cut_at(tokenizer, "predict", 64, words=(80, 70))  # 82 and 72 tokens
    with pytest.warns(UserWarning, match=expected):
        logits = predict(model, tokenizer, texts, batch_size=3)
    # accuracy's warning names accuracy, the call the user made (helper-184, tests/test_leftovers_s25_c.py)
    with pytest.warns(UserWarning, match=expected.replace("predict:", "accuracy:", 1)):
        accuracy(model, tokenizer, texts, logits.argmax(-1).tolist(), batch_size=3)
    # the texts kept whole (max_length=82) are predicted without a warning, and as they were alone
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        whole = predict(model, tokenizer, texts, batch_size=3, max_length=82)
        alone = torch.cat([predict(model, tokenizer, [t], max_length=82) for t in texts])
    torch.testing.assert_close(whole, alone, rtol=1e-5, atol=1e-6)


def test_predict_names_the_models_limit_when_the_longest_text_is_beyond_it():
    from bcos_plugins.prediction import predict

    tokenizer = _minilm_tokenizer(with_mask=True)
    model = _bcos_bert(len(tokenizer))  # 128 positions
    with pytest.warns(UserWarning, match=r"predict: 1 text\(s\) \[0\] have more than max_length=8 tokens: .*Pass "
                      r"max_length=128 \(the model's limit; the longest text has 202 tokens\), or split the texts"):
        predict(model, tokenizer, [" ".join(["word"] * 200), "a b"], max_length=8)
    # cut at the model's limit already: no max_length keeps more (it named the max_length the call had used)
    with pytest.warns(UserWarning, match=r"have more than max_length=128 tokens: .*\. The model reads at most 128 "
                      r"tokens \(the longest text has 202\): split the texts$"):
        predict(model, tokenizer, [" ".join(["word"] * 200), "a b"], max_length=128)


# ------------------------------------------------------------------ 3. left padding refused naming the tokenizer


def _left_padding_tokenizer():
    tokenizer = _minilm_tokenizer(with_mask=True)
    tokenizer.padding_side = "left"
    return tokenizer


_NAMES_THE_TOKENIZER = (r"^tokenizer: pads on the left \(tokenizer\.padding_side='left'\), so row \[1\] starts with "
                        r"padding, and BertForSequenceClassification classifies from the first column's hidden state.*"
                        r"Pad on the right \(tokenizer\.padding_side = 'right'\)")


def test_explain_dataset_refuses_left_padding_naming_the_tokenizers_padding_side():
    """The refusal began "attention_mask: row [1] starts with padding", an argument explain_dataset takes no such."""
    from bcos_plugins import explain_dataset
    from bcos_plugins.errors import BcosValueError

    tokenizer = _left_padding_tokenizer()
    model = _bcos_bert(len(tokenizer))
    with pytest.raises(BcosValueError, match=_NAMES_THE_TOKENIZER) as refused:
        explain_dataset(model, tokenizer, _TEXTS[:2], batch_size=2, progress=False)
    assert "attention_mask" not in str(refused.value)


def test_predict_and_fine_tune_classifier_refuse_left_padding_naming_the_tokenizers_padding_side(tmp_path):
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.fine_tuning import fine_tune_classifier
    from bcos_plugins.prediction import predict

    tokenizer = _left_padding_tokenizer()
    model = _bcos_bert(len(tokenizer))
    with pytest.raises(BcosValueError, match=_NAMES_THE_TOKENIZER):
        predict(model, tokenizer, _TEXTS[:2])
    with pytest.raises(BcosValueError, match=_NAMES_THE_TOKENIZER):
        fine_tune_classifier(model, tokenizer, _TEXTS[:2], [1, 0], epochs=1, progress=False,
                             output_dir=str(tmp_path), report_to=[])


def test_explain_keeps_naming_attention_mask_for_the_mask_its_caller_passed():
    """Outside a path that pads texts itself the caller passed the mask: the refusal names it as before."""
    from bcos_plugins import explain
    from bcos_plugins.errors import BcosValueError

    tokenizer = _left_padding_tokenizer()
    model = _bcos_bert(len(tokenizer))
    enc = tokenizer(_TEXTS[:2], padding=True, return_tensors="pt")
    with pytest.raises(BcosValueError, match=r"^attention_mask: row \[1\] starts with padding"):
        explain(model, enc["input_ids"], enc["attention_mask"])


def test_predict_labels_and_the_inseq_classifier_refuse_left_padding_naming_the_tokenizers_padding_side():
    """Both pad their caller's texts themselves; their refusals named attention_mask, never passed."""
    from bcos_plugins.adapters.inseq import load_classifier

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.space import predict_labels

    tokenizer = _left_padding_tokenizer()
    model = _bcos_bert(len(tokenizer))
    with pytest.raises(BcosValueError, match=_NAMES_THE_TOKENIZER):
        predict_labels(model, tokenizer, _TEXTS[:2], batch_size=2)
    with pytest.raises(BcosValueError, match=_NAMES_THE_TOKENIZER):
        load_classifier(model, tokenizer).attribute(_TEXTS[:2])
