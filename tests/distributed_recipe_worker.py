"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node 2`` (gloo on CPU): the same B-cos
fine-tuning and masked-LM pre-training calls a single process makes, unchanged. Each rank writes what it saw;
the main process saves both models."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers as T

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tiny_config  # noqa: E402
from test_pretrain import corpus, runs_of_words, word_tokenizer  # noqa: E402

from bcos_plugins import bcosify  # noqa: E402
from bcos_plugins.pretrain import pretrain_masked_lm  # noqa: E402
from bcos_plugins.train import fine_tune_classifier  # noqa: E402


def checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main(out: Path) -> None:
    torch.set_num_threads(1)
    tok = word_tokenizer()
    texts, labels = corpus(32)
    torch.manual_seed(0)
    classifier = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.25, verbose=False)
    trainer = fine_tune_classifier(classifier, tok, texts, labels, epochs=2, batch_size=4, learning_rate=1e-3,
                                   max_length=16, progress=False, use_cpu=True)
    torch.manual_seed(0)
    mlm_trainer = pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), tok, runs_of_words(16), b=1.25,
                                     epochs=1, batch_size=4, learning_rate=1e-3, max_length=16, progress=False,
                                     use_cpu=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    report = {"rank": rank, "world_size": trainer.args.world_size, "steps": trainer.state.global_step,
              "mlm_steps": mlm_trainer.state.global_step,
              "backend": dist.get_backend() if dist.is_initialized() else None,
              "classifier_checksum": checksum(classifier), "mlm_checksum": checksum(mlm_trainer.model)}
    trainer.save_model(str(out / "classifier"))
    mlm_trainer.save_model(str(out / "mlm"))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # Skip the interpreter's teardown: on a loaded machine the gloo process group's teardown at exit sometimes
    # aborted one rank (SIGABRT) or left it waiting forever after both ranks had finished and saved everything.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
