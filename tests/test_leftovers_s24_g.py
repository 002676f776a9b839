"""Session 24 leftovers (helper-172): MRR's random baseline on the MRR's rows; load_bcos_model refuses config
overrides that change the model's maths. Each test fails before its fix."""

from __future__ import annotations

import pytest
import torch

# ------------------------------------------------ 1. MRR and its random baseline cover one selection of rows


def test_mrr_random_baseline_is_averaged_over_the_rows_the_mrr_counts():
    """A tied row (and a row of one candidate) has no rank and is left out of the MRR, but its random baseline was
    still averaged in: the baseline of 3 rows against the MRR of 1, biased towards the short prefixes' high chance."""
    from bcos_plugins.metrics import expected_random_reciprocal_rank, mean_reciprocal_rank

    scores = torch.tensor([[0.5, 0.5, 0.0, 0.0],  # tied over its 2 candidates: no rank (chance 3/4)
                           [0.1, 0.4, 0.3, 0.2],  # ranked: evidence at rank 4 among 4 (chance 25/48)
                           [0.7, 0.0, 0.0, 0.0]])  # one candidate: rank 1 for every method, no rank (chance 1)
    evidence = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    candidates = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    result = mean_reciprocal_rank(scores, evidence, candidates)
    assert (result.n, result.n_skipped) == (1, 2)
    assert result.mrr == pytest.approx(1 / 4)
    # before: (3/4 + 25/48 + 1) / 3 = 0.757 against the MRR of row 1 alone
    assert result.random == pytest.approx(expected_random_reciprocal_rank(4, 1))
    assert result.random == pytest.approx(25 / 48)


def test_mrr_random_baseline_equals_the_mean_of_the_counted_rows_baselines():
    from bcos_plugins.metrics import mean_reciprocal_rank, random_reciprocal_rank

    g = torch.Generator().manual_seed(3)
    scores = torch.rand(40, 7, generator=g)
    scores[::4] = 1.0  # every fourth row tied: all of them rows of 7 candidates
    evidence = torch.zeros(40, 7, dtype=torch.bool)
    evidence[:, 2] = True
    candidates = torch.ones(40, 7, dtype=torch.bool)
    candidates[1::2, 4:] = False  # odd rows: 4 candidates, even rows: 7 (different chance ranks)
    result = mean_reciprocal_rank(scores, evidence, candidates)
    counted = ~result.reciprocal_ranks.isnan()
    assert int(counted.sum()) == result.n == 40 - 10
    per_row = random_reciprocal_rank(evidence, candidates)
    assert result.random == pytest.approx(float(per_row[counted].mean()), abs=1e-12)


# ------------------------------------------------ 2. load_bcos_model refuses config overrides that change the maths


def _saved(tmp_path, name):
    from test_conformance import B, _stock

    from bcos_plugins import bcosify

    model = bcosify(_stock(name), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    return model


def _out(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


_MATHS_KEYWORDS = [
    # more heads of the same hidden size: every weight fits, the attention splits otherwise (logits off, silently)
    ("BertForSequenceClassification", "num_attention_heads", 1),
    ("LlamaForCausalLM", "rope_parameters", {"rope_theta": 10.0, "rope_type": "default"}),
    ("LlamaForCausalLM", "rms_norm_eps", 0.5),
    ("GPT2LMHeadModel", "scale_attn_weights", False),
    ("BertForSequenceClassification", "is_decoder", True),
]


@pytest.mark.parametrize(("name", "key", "value"), _MATHS_KEYWORDS, ids=[f"{c[0]}-{c[1]}" for c in _MATHS_KEYWORDS])
def test_load_refuses_a_config_keyword_that_builds_another_model_from_the_saved_weights(tmp_path, name, key, value):
    from bcos_plugins import load_bcos_model
    from bcos_plugins.errors import BcosKeywordError

    model = _saved(tmp_path, name)
    saved = getattr(model.config, key, None)
    assert saved is not None and saved != value  # the keyword asks for another value than the save's
    with pytest.raises(BcosKeywordError, match=rf"^{key}: is {value!r}, but .* was saved with {key}={saved!r}: the "
                                               r"saved weights would load into another model.*leave "
                                               rf"{key} out.*convert it again with bcosify"):
        load_bcos_model(tmp_path, **{key: value})


def test_load_keeps_the_run_time_keywords_and_a_keyword_that_repeats_the_saved_value(tmp_path):
    from bcos_plugins import load_bcos_model

    model = _saved(tmp_path, "BertForSequenceClassification")
    ids = torch.randint(3, 50, (2, 6))
    loaded = load_bcos_model(tmp_path, output_hidden_states=True, use_cache=False, return_dict=True,
                             num_attention_heads=model.config.num_attention_heads, dtype=torch.float32)
    assert loaded.config.output_hidden_states and loaded.config.use_cache is False
    assert torch.equal(_out(loaded, ids), _out(model, ids))
    # output_attentions may choose another attention kernel (eager): the same maths, other rounding
    assert load_bcos_model(tmp_path, output_attentions=True).config.output_attentions
