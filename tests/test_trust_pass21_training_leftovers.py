"""Trust pass 21, training and persistence, what its helper noticed and left: a B stored in float32 loaded through
``load_state_dict`` / ``from_pretrained``, the range ``require_number`` names, and the temporary folders of the
training helpers. Each is pinned where it was silently wrong or left something behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import tiny_config
from test_pretrain import QUIET, corpus, word_tokenizer

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError
from bcos_plugins.losses import cross_entropy_loss
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.pretrain import fine_tune_task_then_bcos
from bcos_plugins.train import fine_tune_classifier


def _pressures(model) -> set[float]:
    return {layer.b for layer in model.modules() if isinstance(layer, AlignmentPressure)}


def _bert(b: float = 1.1, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return bcosify(T.BertForSequenceClassification(config).eval(), b=b, verbose=False)


def _as_saved_on_mps(state: dict) -> dict:
    """A state dict as a save on MPS (no float64) holds it: every ``bcos_b`` in float32."""
    return {k: v.float() if k.endswith("bcos_b") else v for k, v in state.items()}


def test_load_state_dict_of_a_float32_b_runs_at_the_recorded_b():
    """A transformers Trainer resuming from a checkpoint saved on MPS loads it with load_state_dict: every layer ran
    at 1.100000023841858 instead of B = 1.1 (logits 1e-8 off, and a save then stored that B), silently."""
    model, fresh = _bert(seed=0), _bert(seed=1)
    fresh.load_state_dict(_as_saved_on_mps(model.state_dict()))
    assert _pressures(fresh) == {1.1}
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    assert torch.equal(fresh(input_ids=ids).logits, model(input_ids=ids).logits)
    # saved again, it stores the B it runs with (in float64), not the rounding
    assert {v.item() for k, v in fresh.state_dict().items() if k.endswith("bcos_b")} == {1.1}
    # assign=True hands the state dict's own tensors to the model: they are not written to
    state = _as_saved_on_mps(model.state_dict())
    fresh = _bert(seed=1)
    fresh.load_state_dict(state, assign=True)
    assert _pressures(fresh) == {1.1}
    assert {v.item() for k, v in state.items() if k.endswith("bcos_b")} == {torch.tensor(1.1).float().item()}


def test_a_float32_b_that_is_not_the_layers_rounding_loads_as_stored():
    """Only the float32 rounding of the layer's B is read as that B: another stored B (a save mid-way through a B
    warm-up) is the B the layer loads, as before."""
    model, fresh = _bert(b=1.1), _bert(b=1.1, seed=1)
    for layer in model.modules():
        if isinstance(layer, AlignmentPressure):
            layer.b = 1.05
    fresh.load_state_dict(_as_saved_on_mps(model.state_dict()))
    assert _pressures(fresh) == {torch.tensor(1.05).float().item()}
    # a float64 B is loaded exactly, whatever the layer's B was
    fresh.load_state_dict(model.state_dict())
    assert _pressures(fresh) == {1.05}


def test_bcos_vit_from_pretrained_of_a_float32_b_runs_at_config_b(tmp_path):
    """BcosViT.from_pretrained of a folder saved on MPS ran every layer at 1.100000023841858, not config.b = 1.1."""
    from safetensors.torch import load_file, save_file

    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    config = BcosViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32, num_labels=2, b=1.1)
    model = BcosViT(config).eval()
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file(_as_saved_on_mps(weights), tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = BcosViT.from_pretrained(tmp_path).eval()
    assert _pressures(loaded) == {1.1}
    pixels = torch.rand(2, 1, 8, 8)
    assert torch.equal(loaded(pixels).logits, model(pixels).logits)
    assert {v.item() for k, v in loaded.state_dict().items() if k.endswith("bcos_b")} == {1.1}


def test_require_number_names_the_range_it_enforces():
    """label_smoothing takes [0, 1] (0 is no smoothing), but a refusal said it must be "(0, 1]"."""
    logits, labels = torch.zeros(2, 3), torch.tensor([0, 1])
    assert cross_entropy_loss(logits, labels, label_smoothing=0.0).item() == pytest.approx(torch.log(torch.tensor(3.)))
    with pytest.raises(BcosValueError, match=r"^label_smoothing: must be finite and \[0, 1\], got 1\.5"):
        cross_entropy_loss(logits, labels, label_smoothing=1.5)
    # a range open at 0 still says so
    with pytest.raises(BcosValueError, match=r"^b_warmup: must be finite and \(0, 1\], got 0\.0"):
        fine_tune_classifier(_bert(), word_tokenizer(), *corpus(4), max_length=16, b_warmup=0.0, **QUIET)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Python's temporary folder, redirected to an empty one the test can list."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_fine_tune_classifier_removes_its_temporary_output_dir(scratch, tmp_path):
    texts, labels = corpus(4)
    trainer = fine_tune_classifier(_bert(), word_tokenizer(), texts, labels, max_length=16, max_steps=1, **QUIET)
    assert trainer.state.global_step == 1
    assert list(scratch.iterdir()) == []
    # a folder of the caller's own is theirs: kept
    fine_tune_classifier(_bert(), word_tokenizer(), texts, labels, max_length=16, max_steps=1,
                         output_dir=tmp_path / "mine", save_strategy="steps", save_steps=1, **QUIET)
    assert (tmp_path / "mine" / "checkpoint-1").is_dir()
    # checkpoints asked for without a folder are kept in the temporary one, which the trainer names
    trainer = fine_tune_classifier(_bert(), word_tokenizer(), texts, labels, max_length=16, max_steps=1,
                                   save_strategy="steps", save_steps=1, **QUIET)
    kept = Path(trainer.args.output_dir)
    assert list(scratch.iterdir()) == [kept]
    assert (kept / "checkpoint-1").is_dir()


def test_fine_tune_classifier_removes_its_temporary_output_dir_on_error(scratch, monkeypatch):
    def failing_train(self, *args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(T.Trainer, "train", failing_train)
    with pytest.raises(RuntimeError, match="out of memory"):
        fine_tune_classifier(_bert(), word_tokenizer(), *corpus(4), max_length=16, max_steps=1, **QUIET)
    assert list(scratch.iterdir()) == []
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    with pytest.raises(RuntimeError, match="out of memory"):
        fine_tune_task_then_bcos(model, word_tokenizer(), *corpus(4), max_length=16, max_steps=1, **QUIET)
    assert list(scratch.iterdir()) == []


def test_fine_tune_task_then_bcos_removes_the_first_stage_folder(scratch, tmp_path):
    """The conventional stage trained in a temporary folder that stayed behind, with its checkpoints when
    save_strategy (which goes to both stages) asked for some; they cannot be resumed (resume_from_checkpoint is
    refused), so nothing of it is kept."""
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    trainer = fine_tune_task_then_bcos(model, word_tokenizer(), *corpus(4), max_length=16, max_steps=1,
                                       output_dir=tmp_path / "bcos_stage", save_strategy="steps", save_steps=1,
                                       **QUIET)
    assert trainer.state.global_step == 1
    assert list(scratch.iterdir()) == []
    assert (tmp_path / "bcos_stage" / "checkpoint-1").is_dir()


def test_pretrain_masked_lm_removes_its_temporary_output_dir(scratch):
    """pretrain_masked_lm made its temporary folder with the same helper, and left it behind too."""
    from test_pretrain import runs_of_words

    from bcos_plugins.pretrain import pretrain_masked_lm

    torch.manual_seed(0)
    trainer = pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), runs_of_words(4),
                                 max_length=12, max_steps=1, **QUIET)
    assert trainer.state.global_step == 1
    assert list(scratch.iterdir()) == []
