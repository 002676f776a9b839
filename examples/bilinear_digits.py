"""A one-layer bilinear classifier on scikit-learn's bundled 8x8 digits, read from its weights.

Reproduces, at 8x8 scale, the image experiments of Pearce, Dooms et al. (ICLR 2025, §4):

1. train ``logits = P ((W x) * (V x))`` with dense Gaussian input noise as the regulariser (and, for
   comparison, without it);
2. eigendecompose the interaction matrix of each digit's logit, ``Q(e_c)``, and plot the top positive and
   negative eigenvectors per digit (paper Fig. 2/3) and the eigenvalue spectra;
3. the truncation-accuracy curve: accuracy when each logit keeps only its top-k eigenvectors (Fig. 5);
4. adversarial masks from the pseudo-inverse of the top positive eigenvectors (§4.4), added to test
   digits of other classes: the rate at which they flip the prediction to the mask's digit, against the
   same masks with their pixels randomly permuted and against the raw eigenvectors as masks.

The data ship with scikit-learn (``load_digits``: no download). CPU, well under a minute.

    python examples/bilinear_digits.py [--out outputs/bilinear_digits] [--noise 0.15]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from tqdm import trange  # noqa: E402

from bcos_plugins.bilinear import (  # noqa: E402
    BilinearMLP,
    adversarial_masks,
    effective_rank,
    eigendecompose,
    l1_l2_sparsity,
    truncation_curve,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import option_float, option_int  # noqa: E402


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel intensities 0..16 -> [0, 1]
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    return x_train, x_test, y_train, y_test


def train(x, y, d_hidden: int, noise: float, epochs: int, seed: int) -> BilinearMLP:
    torch.manual_seed(seed)
    model = BilinearMLP(d_in=x.shape[1], d_hidden=d_hidden, d_out=10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    for _ in trange(epochs, desc=f"train (noise std {noise})", leave=False):
        for batch in torch.randperm(len(x)).split(64):
            inputs = x[batch] + noise * torch.randn_like(x[batch])
            loss = torch.nn.functional.cross_entropy(model(inputs), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def show(ax, image, title=None):
    limit = image.abs().max().item() or 1.0
    ax.imshow(image.reshape(8, 8), cmap="RdBu", vmin=-limit, vmax=limit)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=7)


def plot_eigenvectors(eig, path: Path, per_sign: int = 3) -> None:
    fig, axes = plt.subplots(10, 2 * per_sign, figsize=(2 * per_sign * 1.1, 10 * 1.15))
    for digit in range(10):
        values, vectors = eig.eigenvalues[digit], eig.eigenvectors[digit]
        for r in range(per_sign):
            show(axes[digit, r], vectors[:, -1 - r], f"{digit}: +{values[-1 - r]:.2f}")
            show(axes[digit, per_sign + r], vectors[:, r], f"{digit}: {values[r]:.2f}")
    fig.suptitle("top positive (left) and negative (right) eigenvectors of Q(e_digit)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_spectra(spectra: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(spectra), figsize=(5 * len(spectra), 3.5), squeeze=False)
    for ax, (name, values) in zip(axes[0], spectra.items(), strict=True):
        for digit in range(10):
            ax.plot(values[digit].flip(0).numpy(), lw=1, label=str(digit))
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel="eigenvector rank (descending eigenvalue)", ylabel="eigenvalue", title=name)
    axes[0, 0].legend(ncol=5, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_truncation(curves: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, curve in curves.items():
        ax.plot(curve.ks, curve.accuracy, marker=".", label=f"{name} (full {curve.full_accuracy:.3f})")
    ax.set(xscale="log", xlabel="eigenvectors kept per digit (top |lambda|)", ylabel="test accuracy",
           title="truncation")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mask_attack(model, eig, x_test, y_test, x_train, strengths, n_random: int, seed: int) -> dict:
    """Flip rates to each digit, averaged over digits, for masks of each L2 norm in ``strengths``.

    Three masks per digit: the pseudo-inverse key of its top positive eigenvector (the set: the top positive
    eigenvector of every digit), the eigenvector itself, and the key with its pixels randomly permuted. Victims are
    correctly classified test digits of the other classes; inputs are not clipped (the paper adds the mask).
    """
    masks = adversarial_masks(eig, per_direction=1, reference=x_train.mean(0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        correct = model(x_test).argmax(-1) == y_test
    kinds = ("pseudo-inverse mask", "eigenvector as mask", "permuted mask")
    rates = {kind: torch.zeros(len(strengths), 10) for kind in kinds}
    for digit in range(10):
        victims = x_test[correct & (y_test != digit)]
        key, vector = masks.masks[digit, 0], masks.eigenvectors[digit, 0]
        vector = vector * torch.sign(vector @ key)  # the same orientation as the key
        for i, strength in enumerate(strengths):
            rates["pseudo-inverse mask"][i, digit] = flip_rate(model, victims, key, strength, digit)
            rates["eigenvector as mask"][i, digit] = flip_rate(model, victims, vector, strength, digit)
            rates["permuted mask"][i, digit] = torch.stack([
                flip_rate(model, victims, key[torch.randperm(key.numel(), generator=g)], strength, digit)
                for _ in range(n_random)]).mean()
    return {"masks": masks, "rates": rates}


def flip_rate(model, victims, mask, strength: float, digit: int) -> torch.Tensor:
    with torch.no_grad():
        return (model(victims + strength * mask / mask.norm()).argmax(-1) == digit).float().mean()


def plot_flip_rates(strengths, rates: dict, mean_norm: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind, values in rates.items():
        ax.plot(strengths, values.mean(1).numpy(), marker="o", label=kind)
    ax.set(xlabel=f"mask L2 norm (mean digit norm {mean_norm:.2f})", ylabel="flip rate to the mask's digit",
           title="adversarial masks from the weights")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mask(masks, model, x_test, y_test, digit: int, strength: float, path: Path) -> None:
    mask = strength * masks.masks[digit, 0] / masks.masks[digit, 0].norm()
    victim = x_test[y_test != digit][0]
    with torch.no_grad():
        before = model(victim[None]).argmax(-1).item()
        after = model((victim + mask)[None]).argmax(-1).item()
    fig, axes = plt.subplots(1, 4, figsize=(6.5, 2))
    show(axes[0], masks.eigenvectors[digit, 0], f"eigenvector (digit {digit})")
    show(axes[1], mask, "pseudo-inverse mask")
    axes[2].imshow(victim.reshape(8, 8), cmap="gray_r")
    axes[2].set_title(f"input: predicted {before}", fontsize=7)
    axes[3].imshow((victim + mask).reshape(8, 8), cmap="gray_r")
    axes[3].set_title(f"+ mask: predicted {after}", fontsize=7)
    for ax in axes[2:]:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/bilinear_digits"))
    # bounds checked as argparse reads them, before any work: --epochs 0 printed an untrained model's numbers,
    # --noise -1 trained with noise of std 1 and --mask-strength nan drew NaN masks, each without a word
    parser.add_argument("--noise", type=option_float(0.0), default=0.15,
                        help="std of the Gaussian input noise, >= 0 (paper: 0.15)")
    parser.add_argument("--d-hidden", type=option_int(1), default=128)
    parser.add_argument("--epochs", type=option_int(1), default=40)
    parser.add_argument("--mask-strength", type=option_float(0.0, exclusive_minimum=True), default=3.0,
                        help="L2 norm of the mask in the example plot, > 0")
    parser.add_argument("--seed", type=option_int(0, 2**32 - 1), default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # tiny matrices: more threads only add synchronisation

    x_train, x_test, y_train, y_test = load_data(args.seed)
    models = {f"noise {args.noise}": train(x_train, y_train, args.d_hidden, args.noise, args.epochs, args.seed),
              "no noise": train(x_train, y_train, args.d_hidden, 0.0, args.epochs, args.seed)}
    digits = torch.eye(10)
    eigs = {name: eigendecompose(model, digits) for name, model in models.items()}

    print(f"8x8 digits: {len(x_train)} train / {len(x_test)} test, bilinear 64 -> {args.d_hidden} -> 10")
    for name, model in models.items():
        eig = eigs[name]
        top = eig.eigenvectors[..., -1]  # the most positive eigenvector of each digit
        print(f"  {name:12s} test accuracy {accuracy(model, x_test, y_test):.3f}; "
              f"effective rank (L1/L2)^2 of the eigenvalues {effective_rank(eig.eigenvalues).mean():.1f} / 64; "
              f"top-eigenvector sparsity {l1_l2_sparsity(top).mean():.1f} / 64")

    main_name = f"noise {args.noise}"
    model, eig = models[main_name], eigs[main_name]
    plot_eigenvectors(eig, args.out / "eigenvectors.png")
    plot_spectra({name: e.eigenvalues for name, e in eigs.items()}, args.out / "eigenvalue_spectra.png")

    ks = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    curves = {name: truncation_curve(m, x_test, y_test, ks) for name, m in models.items()}
    plot_truncation(curves, args.out / "truncation_accuracy.png")
    for name, curve in curves.items():
        shown = ", ".join(f"k={k}: {a:.3f}" for k, a in zip(curve.ks, curve.accuracy, strict=True) if k in (1, 2, 4, 8))
        print(f"  truncation ({name}): {shown} (full {curve.full_accuracy:.3f})")

    strengths = [1.0, 2.0, 3.0, 4.0, 6.0]
    attack = mask_attack(model, eig, x_test, y_test, x_train, strengths, n_random=20, seed=args.seed)
    mean_norm = x_test.norm(dim=1).mean().item()
    plot_flip_rates(strengths, attack["rates"], mean_norm, args.out / "adversarial_flip_rates.png")
    plot_mask(attack["masks"], model, x_test, y_test, digit=3, strength=args.mask_strength,
              path=args.out / "adversarial_mask.png")
    print(f"  adversarial masks (flip rate to the mask's digit, mean over digits; mean ||x|| = {mean_norm:.2f}):")
    print("    mask norm          " + "".join(f"{s:8.1f}" for s in strengths))
    for kind, values in attack["rates"].items():
        print(f"    {kind:19s}" + "".join(f"{v:8.3f}" for v in values.mean(1).tolist()))
    print(f"  plots in {args.out}/")


if __name__ == "__main__":
    main()
