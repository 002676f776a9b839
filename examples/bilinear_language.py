"""SAE feature interactions in a tiny bilinear transformer trained on TinyStories (paper §5), on CPU.

1. Train a byte-level BPE tokenizer (``tokenizers``) on a 400 kB TinyStories slice shipped in
   ``bcos_plugins/data/files/tinystories`` and a 2-layer bilinear ``HookedTransformer`` (``gated_mlp=True``,
   ``act_fn="linear"``, from ``bcos_plugins.adapters.transformer_lens.bilinear_config``) on it.
2. Train two top-k SAEs with sae-lens' ``LanguageModelSAETrainingRunner`` (wandb off, no hub: the model and
   the pre-tokenised dataset are passed as ``override_model`` / ``override_dataset``): one on the last MLP's
   input (``blocks.1.ln2.hook_normalized``) and one on its output (``blocks.1.hook_mlp_out``).
3. From the weights: for output features, the top interacting input-feature pairs (``D Q(e) D^T``), with the
   tokens each feature fires on most; and the correlation, on active tokens, between every live output
   feature's activation and its approximation by its top-k eigenvectors (paper Fig. 9A/9B).

Outputs (tables, plots, the trained model and SAEs) go to ``outputs/bilinear_language``.

    python examples/bilinear_language.py [--lm-steps 400] [--sae-tokens 300000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions  # noqa: E402
from bcos_plugins.adapters.transformer_lens import bilinear_config  # noqa: E402
from datasets import Dataset  # noqa: E402
from sae_lens import (  # noqa: E402
    LanguageModelSAERunnerConfig,
    LanguageModelSAETrainingRunner,
    LoggingConfig,
    TopKTrainingSAEConfig,  # noqa: E402
)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from tqdm import trange  # noqa: E402
from transformer_lens import HookedTransformer  # noqa: E402

from bcos_plugins.data import SHIPPED_DATA  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import option_float, option_int  # noqa: E402

DATA = SHIPPED_DATA / "tinystories" / "tinystories_val_head_400k.txt"
END_OF_TEXT = "<|endoftext|>"
LAYER = 1
INPUT_HOOK, OUTPUT_HOOK = f"blocks.{LAYER}.ln2.hook_normalized", f"blocks.{LAYER}.hook_mlp_out"


def train_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return tokenizer


def tokenize(text: str, tokenizer: Tokenizer, n_ctx: int) -> torch.Tensor:
    """One stream of tokens, stories separated by <|endoftext|>, cut into rows of ``n_ctx``."""
    stories = [s.strip() for s in text.split("\n\nOnce upon a time") if s.strip()]
    stories = [s if s.startswith("Once upon a time") or i == 0 else "Once upon a time" + s
               for i, s in enumerate(stories)]
    eot = tokenizer.token_to_id(END_OF_TEXT)
    stream = []
    for encoding in tokenizer.encode_batch(stories):
        stream.extend([eot, *encoding.ids])
    n_rows = len(stream) // n_ctx
    return torch.tensor(stream[: n_rows * n_ctx]).reshape(n_rows, n_ctx)


def validation_loss(model, val_tokens) -> float:
    with torch.no_grad():
        return torch.stack([model(chunk, return_type="loss") for chunk in val_tokens.split(32)]).mean().item()


def train_language_model(cfg, train_tokens, val_tokens, steps: int, batch: int, seed: int) -> HookedTransformer:
    """AdamW with a one-cycle schedule; keeps the weights with the lowest validation loss (checked every 50
    steps): the corpus is small, so later steps mostly memorise it."""
    torch.manual_seed(seed)
    model = HookedTransformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    best = (float("inf"), 0, None)
    progress = trange(steps, desc="train bilinear LM")
    for step in progress:
        model.train()
        rows = torch.randint(0, len(train_tokens), (batch,))
        loss = model(train_tokens[rows], return_type="loss")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % 50 == 0 or step + 1 == steps:
            model.eval()
            val = validation_loss(model, val_tokens)
            progress.set_postfix(loss=f"{loss.item():.3f}", val=f"{val:.3f}")
            if val < best[0]:
                best = (val, step + 1, {k: v.clone() for k, v in model.state_dict().items()})
    model.load_state_dict(best[2])
    model.eval()
    print(f"  bilinear LM: validation loss {best[0]:.3f} at step {best[1]} of {steps} (kept), train loss at the end "
          f"{loss.item():.3f}; uniform over the vocabulary: {torch.log(torch.tensor(float(cfg.d_vocab))):.3f}")
    return model


def train_sae(model, dataset: Dataset, hook_name: str, args, out: Path):
    """sae-lens' own training runner, offline: model and tokenised dataset passed in, wandb off."""
    cfg = LanguageModelSAERunnerConfig(
        sae=TopKTrainingSAEConfig(d_in=model.cfg.d_model, d_sae=args.expansion * model.cfg.d_model, k=args.k),
        model_name="bilinear-tinystories-2l",  # a label only: the model is passed as override_model
        hook_name=hook_name,
        dataset_path="bcos_plugins/data/files/tinystories",  # a label only: the dataset is passed as override_dataset
        is_dataset_tokenized=True,
        streaming=False,
        context_size=model.cfg.n_ctx,
        prepend_bos=False,
        training_tokens=args.sae_tokens,
        train_batch_size_tokens=1024,
        store_batch_size_prompts=16,
        n_batches_in_buffer=8,
        lr=args.sae_lr,
        lr_warm_up_steps=10,
        n_eval_batches=2,
        eval_batch_size_prompts=8,
        logger=LoggingConfig(log_to_wandb=False),
        device="cpu",
        output_path=str(out / "saes" / hook_name),
        checkpoint_path=None,
        n_checkpoints=0,
        seed=args.seed,
        verbose=False,
    )
    runner = LanguageModelSAETrainingRunner(cfg, override_dataset=dataset, override_model=model)
    return runner.run().eval()


def top_tokens(activations: torch.Tensor, tokens: torch.Tensor, tokenizer: Tokenizer, feature: int, n: int = 5) -> str:
    """The tokens (with one token of context) on which ``feature`` fires most, for the table."""
    flat_tokens = tokens.reshape(-1)
    values, where = activations[:, feature].topk(n)
    shown = []
    for value, position in zip(values.tolist(), where.tolist(), strict=True):
        if value <= 0:
            break
        context = tokenizer.decode(flat_tokens[max(0, position - 1): position + 1].tolist())
        shown.append(repr(context.replace("\n", " ")))
    return ", ".join(shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/bilinear_language"))
    # bounds checked as argparse reads them, before any work: --k 0 failed inside sae-lens after minutes of training
    parser.add_argument("--vocab", type=option_int(1), default=2048)
    parser.add_argument("--d-model", type=option_int(4), default=128, help="a multiple of the 4 heads")
    parser.add_argument("--n-ctx", type=option_int(2), default=128)
    parser.add_argument("--lm-steps", type=option_int(1), default=400)
    parser.add_argument("--lm-batch", type=option_int(1), default=16)
    parser.add_argument("--sae-tokens", type=option_int(1), default=300_000)
    parser.add_argument("--sae-lr", type=option_float(0.0, exclusive_minimum=True), default=1e-3)
    parser.add_argument("--expansion", type=option_int(1), default=4, help="d_sae / d_model (paper: 4)")
    parser.add_argument("--k", type=option_int(1), default=16,
                        help="top-k of the SAEs, <= expansion * d_model (paper: 30 at d_model 512)")
    parser.add_argument("--threads", type=option_int(1), default=1, help="small matrices: one thread avoids contention")
    parser.add_argument("--seed", type=option_int(0, 2**32 - 1), default=0)
    args = parser.parse_args()
    if args.d_model % 4:
        parser.error(f"--d-model: must be a multiple of the 4 attention heads, got {args.d_model}")
    if args.k > args.expansion * args.d_model:
        parser.error(f"--k: must be <= the SAE width expansion * d_model = {args.expansion * args.d_model}, got {args.k}")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    logging.getLogger("sae_lens").setLevel(logging.ERROR)  # it warns that overrides make runs non-reproducible
    # The SAEs deliberately cycle over the small corpus several times; sae-lens warns about each new epoch.
    warnings.filterwarnings("ignore", message=".*(fewer samples|have been exhausted).*", category=UserWarning)
    torch.manual_seed(args.seed)
    started = time.perf_counter()

    text = DATA.read_text(encoding="utf-8")
    tokenizer = train_tokenizer(text, args.vocab)
    tokens = tokenize(text, tokenizer, args.n_ctx)
    n_val = max(8, len(tokens) // 10)
    train_tokens, val_tokens = tokens[:-n_val], tokens[-n_val:]
    print(f"TinyStories slice: {tokens.numel():,} tokens (BPE vocabulary {tokenizer.get_vocab_size()}), "
          f"{len(train_tokens)} train / {len(val_tokens)} validation rows of {args.n_ctx}")

    cfg = bilinear_config(d_model=args.d_model, n_layers=2, n_heads=4, d_mlp=4 * args.d_model,
                          d_vocab=tokenizer.get_vocab_size(), n_ctx=args.n_ctx, seed=args.seed)
    model = train_language_model(cfg, train_tokens, val_tokens, args.lm_steps, args.lm_batch, args.seed)
    torch.save(model.state_dict(), args.out / "bilinear_lm.pt")
    tokenizer.save(str(args.out / "tokenizer.json"))

    dataset = Dataset.from_dict({"input_ids": train_tokens.tolist()})
    saes = {}
    for hook in (INPUT_HOOK, OUTPUT_HOOK):
        sae_started = time.perf_counter()
        saes[hook] = train_sae(model, dataset, hook, args, args.out)
        print(f"  top-k SAE on {hook}: d_sae={saes[hook].cfg.d_sae}, k={args.k}, "
              f"{args.sae_tokens:,} tokens in {time.perf_counter() - sae_started:.0f} s")

    # the layer and its SAEs; BilinearSAEInteractions checks widths and hook names against the model's MLP
    # TransformerLens records ln2.hook_normalized before ln2's (trained) weight: input_norm folds it into the layer
    analysis = BilinearSAEInteractions(model.blocks[LAYER].mlp, saes[INPUT_HOOK], saes[OUTPUT_HOOK],
                                       input_norm=model.blocks[LAYER].ln2)
    with torch.no_grad():
        _, cache = model.run_with_cache(val_tokens, names_filter=[INPUT_HOOK, OUTPUT_HOOK])
        x = cache[INPUT_HOOK].reshape(-1, args.d_model)
        out_acts = analysis.output_activations(x)
        in_acts = saes[INPUT_HOOK].encode(x)
        mse = (saes[OUTPUT_HOOK](cache[OUTPUT_HOOK]) - cache[OUTPUT_HOOK]).pow(2).sum(-1).mean()
        explained = 1 - mse / (cache[OUTPUT_HOOK] - cache[OUTPUT_HOOK].mean((0, 1))).pow(2).sum(-1).mean()
    print(f"  output SAE on validation tokens: variance explained {explained:.3f}")

    # low-rank approximation of every output feature active on enough validation tokens (paper Fig. 9)
    counts = (out_acts > 0).sum(0)
    live = torch.nonzero(counts >= 20).flatten().tolist()
    ranks = [1, 2, 4, 8, 16, 32]
    result = analysis.low_rank_correlation(x, live, ranks=ranks)
    mean_corr = result.correlations.nanmean(1)
    print(f"  low-rank approximation of {len(live)} output features active on >= 20 of {len(x):,} validation tokens;"
          " mean correlation on active tokens:")
    print("    " + ", ".join(f"top-{r}: {c:.3f}" for r, c in zip(ranks, mean_corr.tolist(), strict=True)))

    fig, (ax_curve, ax_hist) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_curve.plot(ranks, mean_corr.numpy(), marker="o")
    ax_curve.set(xscale="log", xlabel="top eigenvectors kept", ylabel="mean correlation (active tokens)",
                 title="feature activation approximation")
    ax_hist.hist(result.correlations[1][~result.correlations[1].isnan()].numpy(), bins=25)
    ax_hist.set(xlabel="correlation (active only)", ylabel="output features", title="approx. by top 2 eigenvectors")
    fig.tight_layout()
    fig.savefig(args.out / "low_rank_correlation.png", dpi=120)
    plt.close(fig)

    # interaction tables for the three output features best explained by two eigenvectors
    best = result.correlations[1].nan_to_num(-2).topk(3).indices.tolist()
    flat_tokens = val_tokens.reshape(-1)
    tables = []
    for position in best:
        feature = live[position]
        spectrum = analysis.spectrum(feature).eigenvalues
        lines = [f"output feature {feature} (active on {int(counts[feature])} tokens; top-2 correlation "
                 f"{result.correlations[1, position]:.3f}; eigenvalues {spectrum[-1]:.3f} .. {spectrum[0]:.3f})",
                 f"  fires on: {top_tokens(out_acts, flat_tokens, tokenizer, feature)}",
                 "  top input-feature interactions  D Q(e) D^T:"]
        for pair in analysis.top_interactions(feature, k=8):
            lines.append(f"    {pair.value:+.4f}  in {pair.first:4d} x in {pair.second:4d}   "
                         f"[{top_tokens(in_acts, flat_tokens, tokenizer, pair.first, 3)}] x "
                         f"[{top_tokens(in_acts, flat_tokens, tokenizer, pair.second, 3)}]")
        tables.append("\n".join(lines))
    report = "\n\n".join(tables)
    print(report)
    (args.out / "interactions.txt").write_text(report + "\n", encoding="utf-8")
    (args.out / "low_rank_correlation.json").write_text(json.dumps(
        {"ranks": ranks, "features": live, "mean": mean_corr.tolist(),
         "correlations": result.correlations.tolist()}), encoding="utf-8")
    print(f"  done in {time.perf_counter() - started:.0f} s; outputs in {args.out}/")


if __name__ == "__main__":
    main()
