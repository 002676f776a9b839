"""Scale-out: B-cos fine-tuning and B-cos masked-LM pre-training run unchanged under torchrun (2 CPU processes,
gloo), as multi-GPU training would; the saved models reload and explain completely."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import padded_batch

from bcos_plugins import explain, load_bcos_model

WORKER = Path(__file__).with_name("distributed_recipe_worker.py")


def test_bcos_training_runs_under_torchrun_with_two_processes(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
           str(tmp_path)]
    # own session: on a timeout the workers are killed with torchrun, not left running
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        raise AssertionError(f"torchrun did not finish in 120 s; ranks done: "
                             f"{sorted(p.name for p in tmp_path.glob('rank*.json'))}\n{stderr[-8000:]}") from None
    assert proc.returncode == 0, stderr[-8000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(reports):
        assert report["rank"] == rank and report["world_size"] == 2 and report["backend"] == "gloo"
        # 32 rows, 4 per process and step, 2 epochs: 8 steps when the data is split over the 2 processes
        # (16 in one process); 16 texts, 4 per process: 2 masked-LM steps
        assert report["steps"] == 8 and report["mlm_steps"] == 2
    # gradients were averaged: both replicas end with the same weights
    assert reports[0]["classifier_checksum"] == reports[1]["classifier_checksum"]
    assert reports[0]["mlm_checksum"] == reports[1]["mlm_checksum"]

    ids, mask = padded_batch(batch=3, seed=2)
    classifier = load_bcos_model(tmp_path / "classifier")
    assert classifier.config.bcos["b"] == 1.25
    e = explain(classifier, ids, mask)
    torch.testing.assert_close(e.contributions.sum(-1), e.explained, atol=1e-5, rtol=1e-4)
    mlm = load_bcos_model(tmp_path / "mlm")
    e = explain(mlm, ids, mask, target=7, position=2)
    torch.testing.assert_close(e.contributions.sum(-1), e.explained, atol=1e-5, rtol=1e-4)
