"""inseq quickstart: exact, signed B-cos attributions with inseq's own API, written to an HTML page.

    make inseq-quickstart                # offline, a few minutes on a shared CPU
    python examples/inseq_quickstart.py --model gpt2   # a hub model instead (needs the network)

1. A B-cos GPT-2: ``bcosify(model, b=1.1)``, then a short fine-tune (``train_causal_lm``). Offline, the model is
   a tiny GPT-2 built from a config with the shipped GPT-2 tokenizer and trained for a moment on the shipped
   TinyStories slice, so its text is childish at best; the plumbing is what this shows.
2. ``import bcos_plugins.adapters.inseq`` registers "bcos"; ``inseq.load_model(model, "bcos")`` and inseq's
   ``attribute`` do the rest. Scores are contributions to each generated token's *logit*: per column they sum to
   it (the error is inseq's ``deltas`` step score), and they are signed (red pushes the logit up, blue down).
3. A B-cos classifier (here a tiny random BERT, just to show the API) through ``load_classifier``: one column
   per class, each summing to that class logit.

Output: outputs/inseq_quickstart/attributions.html (both views) and generation.json (inseq's own save format;
``inseq.FeatureAttributionOutput.load`` reads it back once bcos_plugins.adapters.inseq is imported).
Environment: QUICKSTART_STEPS (training steps, default 80), QUICKSTART_THREADS (torch threads, default 1), each a
whole number >= 1; any other value stops the script before any work, naming the variable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import bcos_plugins.adapters.inseq as bcos_inseq  # registers the "bcos" method
import inseq
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Tokenizer,
)

from bcos_plugins import bcosify
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.train_decoder import train_causal_lm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import env_int

DATA = SHIPPED_DATA
OUT = Path("outputs/inseq_quickstart")


def bcos_language_model(name: str | None, steps: int):
    if name:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = bcosify(AutoModelForCausalLM.from_pretrained(name), b=1.1)
    else:
        tokenizer = GPT2Tokenizer.from_pretrained(DATA / "gpt2_tokenizer")  # vocab + merges only
        torch.manual_seed(0)
        model = bcosify(GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4,
                                                   n_positions=64, n_ctx=64)), b=1.1, verbose=False)
    # B-cos models must be fine-tuned after conversion; a short run on the shipped TinyStories slice here.
    stories = (DATA / "tinystories" / "tinystories_val_head_400k.txt").read_text().split("\n\n")
    train = [{"input_ids": ids} for ids in tokenizer(stories[:2000], truncation=True, max_length=32)["input_ids"]]
    train_causal_lm(model, train, str(OUT / "trainer"), pad_token_id=tokenizer.eos_token_id, max_steps=steps,
                    per_device_train_batch_size=8, learning_rate=3e-3, logging_steps=max(steps // 5, 1),
                    disable_tqdm=True)
    return model, tokenizer


class QuickstartSettings(NamedTuple):
    steps: int
    threads: int


def quickstart_settings() -> QuickstartSettings:
    """The QUICKSTART_* variables (module docstring); a bad value stops the script before any work, naming the
    variable, the value and the fix."""
    return QuickstartSettings(env_int("QUICKSTART_STEPS", 80, minimum=1), env_int("QUICKSTART_THREADS", 1, minimum=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="hub id or folder of a causal LM (default: offline tiny GPT-2)")
    parser.add_argument("--prompt", default="Once upon a time, there was a little")
    parser.add_argument("--continuation", default=" girl named Lily. She loved to play outside.")
    args = parser.parse_args()
    if args.model is not None and not Path(args.model).expanduser().exists() and (
            args.model.startswith(("/", ".", "~")) or "\\" in args.model or args.model.count("/") > 1):
        # a folder that is not there was read as a hub id: transformers' "Repo id must use alphanumeric chars"
        parser.error(f"--model: no folder {args.model!r}; pass the folder of a saved causal LM (save_pretrained) or a "
                     "hub id such as gpt2 (needs the network), or leave --model out for the offline tiny GPT-2")
    steps, threads = quickstart_settings()
    torch.set_num_threads(threads)
    OUT.mkdir(parents=True, exist_ok=True)

    model, tokenizer = bcos_language_model(args.model, steps)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=tokenizer)  # default target: the logit
    # Forced decoding: explain the logits the model gives a continuation of our choice, token by token. Leave
    # the second argument out to explain the model's own generation (then pass generation_args=...).
    out = attribution_model.attribute(args.prompt, args.prompt + args.continuation,
                                      step_scores=["logit", "probability"], clean_special_chars=True,
                                      show_progress=False)
    seq = out.sequence_attributions[0]
    print("explained:", out.info["generated_texts"][0])
    print("completeness |sum - logit| per token (the 'deltas' step score):",
          [f"{d:.1e}" for d in seq.step_scores["deltas"].abs().tolist()])
    html = out.show(display=False, return_html=True)  # signed sum over the embedding dim, not normalised
    out.save(OUT / "generation.json", overwrite=True)

    # Classifiers are outside inseq; load_classifier gives the same output objects, one column per class.
    torch.manual_seed(0)
    bert = bcosify(BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, num_labels=2)).eval(), b=1.25, verbose=False)
    classifier = bcos_inseq.load_classifier(bert, tokenizer, label_names=["negative", "positive"])
    per_class = classifier.attribute(["What a lovely, sunny day in the park."])
    html += "<h2>B-cos classifier (random tiny BERT): one column per class</h2>"
    html += per_class.show(display=False, return_html=True)

    page = OUT / "attributions.html"
    page.write_text(f"<html><head><meta charset='utf-8'><title>B-cos x inseq</title></head><body>"
                    f"<h1>B-cos attributions with inseq</h1><p>{out.info['generated_texts'][0]}</p>{html}"
                    "</body></html>")
    print(f"wrote {page} and {OUT / 'generation.json'}")


if __name__ == "__main__":
    main()
