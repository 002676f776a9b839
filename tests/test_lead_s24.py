"""Session 24, lead: load_bcos_model takes the configuration attributes that change only training (dropout rates,
problem_type) as from_pretrained does; the attributes that change an evaluation's maths stay refused
(tests/test_leftovers_s24_g.py)."""

import pytest
import torch
from test_leftovers_s24_g import _out, _saved


@pytest.mark.parametrize(("name", "settings"), [
    ("BertForSequenceClassification", {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.3,
                                       "classifier_dropout": 0.2, "problem_type": "multi_label_classification"}),
    ("GPT2LMHeadModel", {"resid_pdrop": 0.0, "embd_pdrop": 0.3, "attn_pdrop": 0.2}),
    ("LlamaForCausalLM", {"attention_dropout": 0.1}),
])
def test_load_takes_training_only_settings_and_evaluates_as_the_saved_model(tmp_path, name, settings):
    from bcos_plugins import load_bcos_model

    model = _saved(tmp_path, name).eval()
    for key, value in settings.items():  # each asks for another value than the save's (else it proves nothing)
        assert getattr(model.config, key, None) != value
    loaded = load_bcos_model(tmp_path, **settings)
    for key, value in settings.items():
        assert getattr(loaded.config, key) == value
    ids = torch.randint(3, 50, (2, 6))
    assert torch.equal(_out(loaded.eval(), ids), _out(model, ids))


def test_a_setting_that_changes_the_maths_beside_a_dropout_rate_is_still_refused(tmp_path):
    from bcos_plugins import load_bcos_model
    from bcos_plugins.errors import BcosKeywordError

    _saved(tmp_path, "BertForSequenceClassification")
    with pytest.raises(BcosKeywordError, match=r"^num_attention_heads: .*training-only ones \(dropout rates, "
                                               r"problem_type\)"):
        load_bcos_model(tmp_path, hidden_dropout_prob=0.0, num_attention_heads=1)


def test_pad_rows_reads_transformers_padding_without_the_fast_tokenizer_advice(caplog):
    """corpus.pad_rows is the one reader of transformers' undocumented pad_without_fast_tokenizer_warning: this fails
    when transformers drops it, renames it or stops silencing the advice while restoring its state."""
    import logging

    from transformers import AutoTokenizer

    from bcos_plugins.corpus import pad_rows
    from bcos_plugins.pretrained import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    tokenizer.model_input_names = ["input_ids"]  # a tokenizer that leaves the mask out unless asked
    features = [{"input_ids": [101, 7592, 102]}, {"input_ids": [101, 102]}]
    with caplog.at_level(logging.WARNING):
        padded = pad_rows(tokenizer, features, return_tensors="pt", return_attention_mask=True)
    assert padded["input_ids"].tolist() == [[101, 7592, 102], [101, 102, tokenizer.pad_token_id]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert not [r for r in caplog.records if "fast tokenizer" in r.getMessage()]
    # the advice's state is put back: not marked as given, so a later tokenizer.pad call of the user's still advises
    assert tokenizer.deprecation_warnings.get("Asking-to-pad-a-fast-tokenizer", False) is False
