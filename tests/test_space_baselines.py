"""The Space example's head-only baselines on tiny models: the model's own head reproduced on cached encoder
states (so the 'native' baseline is exactly what transformers builds), and the HateXplain label mapping."""

import json

import pytest
import torch
from conftest import padded_batch, tiny_model

from examples import space_sst2 as space_example


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


def test_the_command_line_is_checked_before_any_work(capsys):
    args = space_example.parse_settings([])
    assert (args.train, args.test, args.rt, args.epochs, args.n_latent, args.threads) == (2000, 600, 500, 20, 8, 0)
    for argv, message in ((["--epochs", "0"], "--epochs: must be >= 1, got 0"),
                          (["--n-latent", "-2"], "--n-latent: must be >= 1, got -2"),
                          (["--threads", "-1"], "--threads: must be >= 0 (0: torch's default), got -1"),
                          (["--intra-paper-weight", "nan"], "--intra-paper-weight: must be a number >= 0, got nan")):
        with pytest.raises(SystemExit) as excinfo:
            space_example.parse_settings(argv)
        assert excinfo.value.code == 2 and message in capsys.readouterr().err
