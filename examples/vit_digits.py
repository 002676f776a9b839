"""B-cos ViT vs a conventional ViT on digits: accuracy, exact explanations, grid pointing game, pixel perturbation.

Runs offline on a CPU in a few minutes (`make vit-digits`), with data made from scikit-learn's bundled 8x8
digits (no download):

1. 16x16 digit images (a digit scaled up, or at its own size somewhere on the canvas), stratified split;
2. train a B-cos ViT (B-cos CNN tokeniser, B-cos attention with a learnt additive attention prior, BCE loss
   through transformers' ``Trainer`` + ``bcos_loss``) and a conventional ViT of the same shape (softmax CE);
3. explain with the methods of ``bcos_plugins.adapters.captum_vision`` (the set ``make bench-vision`` uses): the B-cos
   ViT's inherent ``W(x) x`` (checked complete), last-layer attention, attention rollout, and Captum's
   Integrated Gradients (32 steps), Input x Gradient and GradCAM (on the last attention layer as Chefer et al.
   adapt it, and on the token grid), on both models (the gradient methods on the
   B-cos ViT also at the pixels);
4. grid pointing game on 2x2 grids of confidently and correctly classified test digits of four classes;
5. pixel perturbation (remove up to 25% of the pixels, most / least important first; area between the
   curves) on the most confidently classified test images;
6. write outputs/vit_digits/: results.md (table), results.json, explanations.png, grid_explanations.png,
   perturbation_curves.png, and the trained models.

The paper's full protocol (ratios to the best post-hoc method, the paper's logit bias in the B-cos loss, more
training views at grid-cell size) is ``make bench-vision`` (benchmarks/bench_vision.py).

Environment variables: VIT_EPOCHS (B-cos ViT epochs, default 12), VIT_BASELINE_EPOCHS (default 30: the
conventional ViT is 3x faster per epoch and needs more), VIT_GRIDS (default 60), VIT_PERTURB (images for the
perturbation metric, default 150), VIT_THREADS (torch intra-op threads, default 1), each a whole number >= 1;
VIT_PRIOR_ABLATION=1 also trains B-cos ViTs with no prior, a multiplicative prior and a position embedding, and
reports their accuracy (about 3x the training time); VIT_REUSE=1 loads the models a previous run saved in
outputs/vit_digits/ instead of training them again (to redo the metrics and figures only). Both switches are 0
(the default) or 1. They are read when the run starts (``VitDigitsSettings.from_env()`` at the start of
``main``), not when the module is imported; any other value (VIT_REUSE=yes, VIT_GRIDS=0) stops the script before
any work, naming the variable, the value and the fix.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from bcos_plugins.adapters.captum_vision import image_attribution_methods
from transformers import Trainer, TrainingArguments, set_seed
from transformers.utils import logging as hf_logging

from bcos_plugins import load_bcos_model
from bcos_plugins.metrics.image import grid_pointing_game, pixel_perturbation
from bcos_plugins.metrics.summary import Cost, measure_cost
from bcos_plugins.train import bcos_loss
from bcos_plugins.vision import BcosViT, BcosViTConfig, ConventionalViT, attribution_input, explain_image
from bcos_plugins.vision.data import DigitImages, load_digits_split, make_grids
from bcos_plugins.vision.visualize import save_explanation_figure, weight_colour_image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import env_flag, env_int, no_command_line_arguments

OUT = Path("outputs/vit_digits")


@dataclass(frozen=True)
class VitDigitsSettings:
    epochs: int = 12  # the B-cos ViT's
    baseline_epochs: int = 30  # the conventional ViT's: 3x faster per epoch, and it needs more
    n_grids: int = 60
    n_perturb: int = 150
    ablation: bool = False
    reuse: bool = False
    # The models are tiny: one intra-op thread is as fast as several on an idle machine, and on a shared,
    # oversubscribed CPU several threads spin-wait on each other (measured here: 0.23 s vs 4.1 s per step).
    threads: int = 1

    @classmethod
    def from_env(cls) -> VitDigitsSettings:
        """The VIT_* variables (module docstring), the defaults above for unset ones; a bad value stops the script
        before any work, naming the variable, the value and the fix."""
        return cls(epochs=env_int("VIT_EPOCHS", cls.epochs, minimum=1),
                   baseline_epochs=env_int("VIT_BASELINE_EPOCHS", cls.baseline_epochs, minimum=1),
                   n_grids=env_int("VIT_GRIDS", cls.n_grids, minimum=1),
                   n_perturb=env_int("VIT_PERTURB", cls.n_perturb, minimum=1),
                   ablation=env_flag("VIT_PRIOR_ABLATION", cls.ablation), reuse=env_flag("VIT_REUSE", cls.reuse),
                   threads=env_int("VIT_THREADS", cls.threads, minimum=1))


def vit_digits_settings() -> VitDigitsSettings:
    """The VIT_* variables as the run reads them at its start (``VitDigitsSettings.from_env()``)."""
    return VitDigitsSettings.from_env()


SHAPE = dict(image_size=16, num_channels=1, patch_size=4, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=96, tokenizer="conv", conv_channels=[32], num_labels=10,
             id2label={i: str(i) for i in range(10)}, label2id={str(i): i for i in range(10)})
# B = 2 and MaxOut 2 as in the paper; the logits are scaled by a constant (the paper divides by 10^3 and adds a
# logit bias; a bias would break completeness, so there is none).
BCOS = dict(b=2.0, max_out=2, logit_scale=10.0)


def train(model, data, epochs: int, loss_func=None, name: str = "model") -> float:
    """transformers Trainer on a torch Dataset of {"pixel_values", "labels"}; returns seconds."""
    args = TrainingArguments(output_dir=str(OUT / "trainer" / name), per_device_train_batch_size=64,
                             num_train_epochs=epochs, learning_rate=2e-3, weight_decay=0.01,
                             lr_scheduler_type="cosine", warmup_steps=20, report_to=[], save_strategy="no",
                             logging_steps=50, use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, compute_loss_func=loss_func)
    start = time.perf_counter()
    trainer.train()
    model.eval()
    return time.perf_counter() - start


@torch.no_grad()
def predict(model, images: torch.Tensor) -> torch.Tensor:
    return torch.cat([model(pixel_values=chunk).logits for chunk in images.split(256)])


def accuracy(model, data: DigitImages) -> float:
    return (predict(model, data.pixel_values).argmax(-1) == data.labels).float().mean().item()


def method_maps(model, images: torch.Tensor, target: torch.Tensor,
                costs: dict[str, Cost] | None = None) -> dict[str, torch.Tensor]:
    """Maps of every method; with ``costs``, also the time and peak memory of each call."""
    maps = {}
    for name, method in image_attribution_methods(model).items():
        result, cost = measure_cost(method.explain, images, target, device="cpu")
        maps[name] = result.detach()
        if costs is not None:
            costs[name] = cost
    return maps


def grid_pointing(model, grids: torch.Tensor, cell_labels: torch.Tensor) -> tuple[dict[str, float], dict]:
    scores: dict[str, list[torch.Tensor]] = {}
    first_grid = {}
    for cell in range(4):
        maps = method_maps(model, grids, cell_labels[:, cell])
        for name, m in maps.items():
            scores.setdefault(name, []).append(grid_pointing_game(m, cell))
            first_grid.setdefault(name, []).append(m[0])
    return {k: torch.cat(v).mean().item() for k, v in scores.items()}, first_grid


def perturbation(model, images: torch.Tensor, labels: torch.Tensor) -> dict[str, dict]:
    inputs, forward = attribution_input(model, images)
    results = {}
    costs: dict[str, Cost] = {}
    for name, m in method_maps(model, images, labels, costs).items():
        r = pixel_perturbation(forward, inputs, m, labels)
        results[name] = {"abc": r.area_between.mean().item(), "most_first": r.most_first.mean(0).tolist(),
                         "least_first": r.least_first.mean(0).tolist(), "fractions": list(r.fractions),
                         "ms_per_image": 1000 * costs[name].seconds / len(images),
                         "peak_mib_batch": costs[name].peak_mib}
    return results


def bcos_attribution_check(model: BcosViT, images: torch.Tensor, labels: torch.Tensor) -> str:
    """The Captum adapter's BcosAttribution on the encoded input gives the same exact map."""
    try:
        from bcos_plugins.adapters.captum import BcosAttribution
    except ImportError as err:
        return f"Captum adapter not available ({err})"
    encoded = model.encode(images)
    attr = BcosAttribution(lambda e: model(encoded_pixel_values=e).logits, model=model).attribute(encoded, target=labels)
    ours = explain_image(model, images, target=labels)
    diff = (attr.sum(1) - ours.contributions).abs().max().item()
    return f"Captum BcosAttribution vs explain_image: max |difference| {diff:.2e}"


def plot_curves(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, (model_name, per_method) in zip(axes, results.items(), strict=True):
        for i, (name, r) in enumerate(per_method.items()):
            colour = f"C{i}"
            ax.plot(r["fractions"], r["most_first"], color=colour, label=f"{name} (ABC {r['abc']:.3f})")
            ax.plot(r["fractions"], r["least_first"], color=colour, linestyle="--")
        ax.set_title(model_name, fontsize=9)
        ax.set_xlabel("fraction of pixels removed")
        ax.legend(fontsize=6)
    axes[0].set_ylabel("softmax confidence in the true class\n(solid: most important first, dashed: least)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    cfg = vit_digits_settings()  # a bad VIT_* value stops here, before any work
    hf_logging.set_verbosity_error()
    torch.set_num_threads(cfg.threads)
    set_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    train_digits, train_labels, test_digits, test_labels = load_digits_split()
    train_set = DigitImages(train_digits, train_labels, views=2, seed=0)
    test_mixed = DigitImages(test_digits, test_labels, views=2, seed=1)
    test_full = DigitImages(test_digits, test_labels, scaled_up_only=True)
    print(f"train images {len(train_set)}, test images {len(test_mixed)} (mixed views) / {len(test_full)} (full size)")

    variants = {"additive": dict(attention_prior="additive")}
    if cfg.ablation:
        variants |= {"none": dict(attention_prior="none"), "multiplicative": dict(attention_prior="multiplicative"),
                     "position embedding": dict(attention_prior="none", position_embedding=True)}
    accuracy_rows = []
    models = {}
    saved_seconds = (json.loads((OUT / "train_seconds.json").read_text())
                     if cfg.reuse and (OUT / "train_seconds.json").exists() else {})
    for name, extra in variants.items():
        set_seed(0)
        folder = OUT / f"bcos_vit_{name.replace(' ', '_')}"
        if cfg.reuse and folder.exists():
            model, seconds = load_bcos_model(folder), saved_seconds[name]  # refuses a partial folder
        else:
            model = BcosViT(BcosViTConfig(**SHAPE, **BCOS, **extra))
            seconds = train(model, train_set, cfg.epochs, loss_func=bcos_loss, name=f"bcos-{name}")
            model.save_pretrained(folder)
        saved_seconds[name] = seconds
        accuracy_rows.append((f"B-cos ViT ({name} prior)" if "embedding" not in name else "B-cos ViT (position embedding)",
                              accuracy(model, test_mixed), accuracy(model, test_full), seconds,
                              sum(p.numel() for p in model.parameters())))
        models[name] = model
        print(accuracy_rows[-1])
    bcos = models["additive"]
    set_seed(0)
    if cfg.reuse and (OUT / "conventional_vit").exists():
        conventional, seconds = ConventionalViT.from_pretrained(OUT / "conventional_vit").eval(), saved_seconds["conventional"]
    else:
        conventional = ConventionalViT(BcosViTConfig(**SHAPE))
        seconds = train(conventional, train_set, cfg.baseline_epochs, name="conventional")
        conventional.save_pretrained(OUT / "conventional_vit")
    saved_seconds["conventional"] = seconds
    (OUT / "train_seconds.json").write_text(json.dumps(saved_seconds))
    accuracy_rows.append(("conventional ViT", accuracy(conventional, test_mixed), accuracy(conventional, test_full),
                          seconds, sum(p.numel() for p in conventional.parameters())))
    print(accuracy_rows[-1])

    # Exactness of the inherent explanations on the whole test set, batched.
    exp = explain_image(bcos, test_full.pixel_values)
    completeness = exp.completeness_error.max().item()
    print(f"B-cos ViT: max relative completeness error over {len(test_full)} test images: {completeness:.2e}")
    print(bcos_attribution_check(bcos, test_full.pixel_values[:16], test_full.labels[:16]))

    model_pairs = {"B-cos ViT": bcos, "conventional ViT": conventional}
    pointing, perturb, first_grids, grids_used = {}, {}, {}, {}
    for model_name, model in model_pairs.items():
        probs = torch.softmax(predict(model, test_full.pixel_values), dim=-1)
        confidence, predicted = probs.max(-1)
        correct = predicted == test_full.labels
        # grids of the model's own confidently and correctly classified digits (each model its own grids)
        grids, cell_labels = make_grids(test_digits[correct], test_labels[correct], confidence[correct], cfg.n_grids,
                                        strict=False)
        grids_used[model_name] = (grids, cell_labels)
        start = time.perf_counter()
        pointing[model_name], first_grids[model_name] = grid_pointing(model, grids, cell_labels)
        top = confidence.masked_fill(~correct, -1).argsort(descending=True)[:cfg.n_perturb]
        perturb[model_name] = perturbation(model, test_full.pixel_values[top], test_full.labels[top])
        print(f"{model_name}: metrics in {time.perf_counter() - start:.0f} s")

    # ---- figures ----
    show = torch.arange(6) * 7
    show_images, show_labels = test_full.pixel_values[show], test_full.labels[show]
    columns = {}
    for tag, model in (("B-cos", bcos), ("conv.", conventional)):
        for name, m in method_maps(model, show_images, show_labels).items():
            columns[f"{tag}: {name}"] = m
    exp_show = explain_image(bcos, show_images, target=show_labels)
    colour = [weight_colour_image(exp_show.weights[i], exp_show.contributions[i]) for i in range(len(show))]
    save_explanation_figure(OUT / "explanations.png", show_images, columns, colour_rows=colour,
                            row_titles=[f"label {int(y)}" for y in show_labels])
    for model_name, (grids, cell_labels) in grids_used.items():
        maps = {name: torch.stack(per_cell) for name, per_cell in first_grids[model_name].items()}
        tag = "bcos" if model_name.startswith("B-cos") else "conventional"
        save_explanation_figure(OUT / f"grid_explanations_{tag}.png", grids[0:1].expand(4, -1, -1, -1), maps,
                                row_titles=[f"explain {int(c)}" for c in cell_labels[0]])
    plot_curves(perturb, OUT / "perturbation_curves.png")

    # ---- table ----
    lines = ["# B-cos ViT vs conventional ViT on digits (16x16, CPU)", "",
             "| model | test accuracy (mixed views) | test accuracy (full-size digits) | training s | parameters |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {a:.3f} | {b:.3f} | {s:.0f} | {p:,} |" for n, a, b, s, p in accuracy_rows]
    lines += ["", f"B-cos ViT completeness: max relative error {completeness:.1e} over {len(test_full)} test images.", "",
              "| model | method | grid pointing game (higher better) | pixel perturbation ABC (higher better) "
              f"| ms / image (batch of {cfg.n_perturb}) | peak MiB (batch) |",
              "|---|---|---|---|---|---|"]
    for model_name in model_pairs:
        for name in pointing[model_name]:
            r = perturb[model_name][name]
            lines.append(f"| {model_name} | {name} | {pointing[model_name][name]:.3f} | {r['abc']:.3f} | "
                         f"{r['ms_per_image']:.2f} | {r['peak_mib_batch']:.0f} |")
    lines += ["", f"Grid pointing game: {cfg.n_grids} 2x2 grids per model, each cell's class explained (mean share of "
              "positive attribution in the right cell; 0.25 = chance).",
              f"Pixel perturbation: the {cfg.n_perturb} most confidently and correctly classified test images; up to 25% "
              "of the pixels removed (B-cos: [x, 1-x] encoding zeroed; conventional: pixel set to 0); ABC = "
              "normalised area between the least- and most-important-first softmax-confidence curves.",
              "Time and peak memory (RSS above the level before the call) of computing the maps for that batch, "
              f"on this machine's CPU with {cfg.threads} thread(s)."]
    table = "\n".join(lines)
    (OUT / "results.md").write_text(table + "\n")
    (OUT / "results.json").write_text(json.dumps({
        "accuracy": [dict(zip(["model", "acc_mixed", "acc_full", "train_seconds", "parameters"], r, strict=True))
                     for r in accuracy_rows],
        "completeness_max_relative_error": completeness, "grid_pointing": pointing, "perturbation": perturb,
    }, indent=1))
    print(table)
    print(f"written to {OUT}/")


if __name__ == "__main__":
    main()
