"""What session 25's finished helpers noticed and left (helper-184): Captum's records page draws byte-level tokens as
the text they stand for, the refusal of a tokenizer's own outputs says what to do with them, the truncation warning of
fine_tune_task_then_bcos names it at the caller's line, a configuration property given to load_bcos_model is named as
one, the pass-20 "all global" ModernBERT is all global, key_mapping is refused, and a sequence classifier outside the
registry is refused left padding where which token it reads is unknown. Each failed before its change (the pass-20
case: the old configuration's layout was not the one claimed)."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_config
from test_conformance import B, _stock
from test_leftovers_s25_b import LONG_LABELS, LONG_TEXTS, _truncation_warnings
from test_pretrain import word_tokenizer
from test_trust_pass24_vision_data import byte_level_classifier  # noqa: F401 - a fixture

from bcos_plugins import bcosify, explain, load_bcos_model
from bcos_plugins.errors import BcosKeywordError, BcosTypeError, BcosValueError

# --------------------------------------------------------------- 1. Captum's records show the text, not the bytes


def test_visualization_records_show_byte_level_tokens_as_the_text_they_stand_for(byte_level_classifier):  # noqa: F811
    """The records page drew GPT-2's tokens in the byte alphabet (" café" as "ĠcafÃ©"), where the token pages draw
    the text (visualize.shown_tokens)."""
    from bcos_plugins.adapters.captum import records_to_html, visualization_records

    from bcos_plugins.visualize import shown_tokens

    model, tokenizer = byte_level_classifier
    batch = tokenizer(["naïve café", "I love 🍕"], padding=True, return_tensors="pt")
    explanation = explain(model, **batch)
    records = visualization_records(explanation, tokenizer)
    raw = explanation.tokens(tokenizer)
    for record, tokens in zip(records, raw, strict=True):
        assert record.raw_input_ids == shown_tokens(tokenizer, tokens)
    shown = [t for record in records for t in record.raw_input_ids]
    assert " café" in shown and "ïve" in shown and r" \xf0\x9f" in shown
    page = records_to_html(records)
    for alphabet in ("Ã", "ðŁ", "Ġ"):
        assert alphabet not in page, alphabet
    # the scores are the explanation's, one per token, as before
    for record, scores in zip(records, explanation.scores(), strict=True):
        assert torch.equal(record.word_attributions, scores.to(record.word_attributions.dtype))


# --------------------------------------------------------------- 2. a tokenizer's own outputs: the refusal says the fix


def test_explain_of_an_overflowing_encoding_says_to_drop_the_mapping_and_explain_each_window(byte_level_classifier):  # noqa: F811
    model, tokenizer = byte_level_classifier
    enc = tokenizer(["a long text of several words here", "short"], truncation=True, max_length=4, stride=1,
                    return_overflowing_tokens=True, padding=True, return_tensors="pt")
    assert "overflow_to_sample_mapping" in enc
    with pytest.raises(BcosTypeError, match=r"overflow_to_sample_mapping: is the text each row \(window\) came from "
                       r".*enc\.pop\('overflow_to_sample_mapping'\).*each window is a row of the batch"):
        explain(model, **enc)
    mapping = enc.pop("overflow_to_sample_mapping")
    explanation = explain(model, **enc)  # the fix runs: one explained row per window
    assert explanation.explained.shape[0] == len(mapping) > 2


@pytest.mark.parametrize("key, what", [
    ("offset_mapping", "each token's character span"), ("special_tokens_mask", "which tokens the tokenizer added"),
    ("length", "each row's token count"), ("num_truncated_tokens", "how many tokens truncation cut")])
def test_explain_names_each_tokenizer_output_it_does_not_read_with_the_fix(byte_level_classifier, key, what):  # noqa: F811
    # length= was pointed at max_length_q= (an attention kernel's argument), the others named without a fix
    model, tokenizer = byte_level_classifier
    enc = tokenizer(["naïve café", "hello"], padding=True, return_tensors="pt", return_offsets_mapping=True,
                    return_special_tokens_mask=True, return_length=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    value = enc[key] if key in enc else torch.zeros(ids.shape[0], dtype=torch.long)
    with pytest.raises(BcosTypeError, match=rf"{key}: is {what}.*returned by the tokenizer.*"
                       rf"Drop it before the call \(enc\.pop\('{key}'\)\)"):
        explain(model, input_ids=ids, attention_mask=mask, **{key: value})


# --------------------------------------------------------------- 3. the truncation warning names its caller
# (fine_tune_task_then_bcos's is checked with its once-a-call warning: tests/test_leftovers_s25_b.py)


def test_accuracy_truncation_warning_names_it_at_the_callers_line():
    from bcos_plugins.prediction import accuracy

    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        accuracy(model, word_tokenizer(), LONG_TEXTS, LONG_LABELS, max_length=6)
    cut = _truncation_warnings(record)
    assert len(cut) == 1 and str(cut[0].message).startswith("accuracy: 2 text(s) [0, 2]"), [str(w.message) for w in cut]
    assert cut[0].filename == __file__


# --------------------------------------------------------------- 4. a configuration property given to a load


def test_load_bcos_model_names_a_config_property_and_the_fields_that_set_it(tmp_path):
    """ModernBERT's sliding_window is a property (local_attention // 2): it was refused as "neither an attribute of
    the saved configuration nor an option"."""
    model = bcosify(_stock("ModernBertForSequenceClassification"), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosKeywordError, match=r"sliding_window: is a property of ModernBertConfig computed from its "
                       r"saved field\(s\) local_attention=4 \(here sliding_window=2\).*Leave sliding_window out.*"
                       r"other local_attention"):
        load_bcos_model(tmp_path, sliding_window=8)


# --------------------------------------------------------------- 5. the pass-20 "all global" ModernBERT


def test_the_pass20_all_global_modernbert_case_runs_every_layer_global():
    """Its global_attn_every_n_layers=1, set after the config was built, left layer 1 local: the case tested the
    default layout. The case now builds the layout it claims, and the pass-20 test asserts each layer's kind."""
    from test_trust_pass20_convert import _UNUSUAL

    overrides = dict(_UNUSUAL)["ModernBertForSequenceClassification"]
    kinds = [layer.attention_type for layer in _stock("ModernBertForSequenceClassification", **overrides).model.layers]
    assert kinds == ["full_attention", "full_attention"]
    # what the old case ran (global_attn_every_n_layers set after the config was built)
    old = _stock("ModernBertForSequenceClassification", classifier_pooling="cls", global_attn_every_n_layers=1)
    assert [layer.attention_type for layer in old.model.layers] == ["full_attention", "sliding_attention"]


# --------------------------------------------------------------- 6. key_mapping


def test_load_bcos_model_refuses_key_mapping(tmp_path):
    """transformers renames the weights' keys, not the bcos_b entries: swapping two layers ran each at the other's
    B, silently."""
    from bcos_plugins.nn.linear import AlignmentPressure

    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=2.0, verbose=False)
    for name, layer in model.named_modules():
        if isinstance(layer, AlignmentPressure) and ".layer.1." in name:
            layer.b = 3.0
    model.save_pretrained(tmp_path)
    swap = {r"layer\.0\.": "layer.X.", r"layer\.1\.": "layer.0.", r"layer\.X\.": "layer.1."}
    with pytest.raises(BcosKeywordError, match=r"key_mapping: .*pairs each layer's weights with the B stored under the "
                       r"same name.*rename the keys in the folder's safetensors file"):
        load_bcos_model(tmp_path, key_mapping=swap)


# --------------------------------------------------------------- 7. a classifier outside the registry, left padding


def _electra_classifier():
    torch.manual_seed(0)
    config = T.ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32, max_position_embeddings=32, num_labels=2,
                             pad_token_id=0)
    return T.ElectraForSequenceClassification(config).eval()


def test_perturbation_curves_refuse_left_padding_for_a_first_column_classifier_outside_the_registry():
    """ELECTRA's classifier reads the first column; with the caller's own position_ids the left-padded batch ran,
    and the curves scored the padding token's logits."""
    from bcos_plugins.attribution import real_token_positions
    from bcos_plugins.metrics import perturbation_curves

    model = _electra_classifier()
    ids, mask = padded_batch(side="left")
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the silent number: the padded row's logits are not the row's own
        row = int(mask[:, 0].eq(0).nonzero()[0])
        real = mask[row].bool()
        alone = model(input_ids=ids[row:row + 1, real]).logits
        padded = model(input_ids=ids, attention_mask=mask, position_ids=real_token_positions(mask)).logits[row]
    assert not torch.allclose(alone[0], padded, atol=1e-4)
    with pytest.raises(BcosValueError, match=r"attention_mask: rows? .* with padding, and ElectraForSequence"
                       r"Classification is a sequence classifier outside the architecture registry.*first column.*"
                       r"Pad on the right"):
        perturbation_curves(model, ids, mask, scores, special_tokens=mask == 0, position_ids=real_token_positions(mask))
    right_ids, right_mask = padded_batch(side="right")
    perturbation_curves(model, right_ids, right_mask, scores, special_tokens=right_mask == 0)  # right padding runs


def test_a_last_token_classifier_outside_the_registry_keeps_left_padding():
    """GPT-Neo's classifier reads each row's last token that is not padding: a real one on a left-padded row."""
    from bcos_plugins.attribution import real_token_positions
    from bcos_plugins.metrics import perturbation_curves

    torch.manual_seed(0)
    config = T.GPTNeoConfig(vocab_size=100, hidden_size=16, num_layers=1, num_heads=2, attention_types=[[["global"], 1]],
                            max_position_embeddings=32, num_labels=2, pad_token_id=0, bos_token_id=2,
                            eos_token_id=2)
    model = T.GPTNeoForSequenceClassification(config).eval()
    ids, mask = padded_batch(side="left")
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1))
    perturbation_curves(model, ids, mask, scores, special_tokens=mask == 0, position_ids=real_token_positions(mask))

