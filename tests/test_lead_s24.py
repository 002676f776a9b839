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
