"""The Space example's head-only baselines on tiny models: the model's own head reproduced on cached encoder
states (so the 'native' baseline is exactly what transformers builds), and the HateXplain label mapping."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import padded_batch, tiny_model

_SPEC = importlib.util.spec_from_file_location(
    "space_sst2_example", Path(__file__).resolve().parents[1] / "examples" / "space_sst2.py")
space_example = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(space_example)


@pytest.mark.parametrize("class_name", ["BertForSequenceClassification", "DistilBertForSequenceClassification"])
def test_native_head_on_cached_states_is_the_models_own_head(class_name):
    model = tiny_model(class_name)
    ids, mask = padded_batch()
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    logits, params = space_example.native_head(model)
    assert torch.allclose(logits(hidden, mask), model(input_ids=ids, attention_mask=mask).logits, atol=1e-6)
    base = {id(p) for p in model.base_model.parameters()}
    assert params and not any(id(p) in base for p in params)  # only the head trains, the encoder stays frozen


def test_hatexplain_mapping_is_the_papers(tmp_path):
    rows = [{"post_tokens": ["a", "b"], "majority_label": "normal"},
            {"post_tokens": ["c"], "majority_label": "offensive"},
            {"post_tokens": ["d"], "majority_label": "hatespeech"},
            {"post_tokens": ["e"], "majority_label": "undecided"}]
    path = tmp_path / "hx.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert space_example.read_hatexplain_as_sentiment(path) == (["a b", "c", "d"], [1, 0, 0])
