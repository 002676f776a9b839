"""How far each parameter's gradient under bfloat16 autocast lies from a float64 copy's, stock models vs B-cos models.

`python benchmarks/bench_bf16_gradients.py` prints, for tiny random classifiers of two
decoders (Qwen3, Llama) and an encoder (BERT), one ``bcos_loss`` backward pass under ``torch.autocast("cpu",
torch.bfloat16)`` against the same weights and batch in float64 (no autocast). Models, all from one stock model:

- ``stock``: as initialised (weights of std 0.02, so that each block adds little to the residual stream);
- ``stock unit rows``: the same with every ``nn.Linear``'s weight rows scaled to norm 1, the scale a B-cos layer
  uses (``ŵ = w / ||w||``): the stock model whose activations are as large as the B-cos model's;
- ``bcos B=1``: :func:`bcos_plugins.bcosify` at B = 1 (unit-norm weights, no scale ``dyn``);
- ``bcos``: at B = 1.25 (the fused training path), and ``bcos reference``: the same on
  :func:`bcos_plugins.nn.reference_path` (step-by-step maths differentiated by autograd).

Per parameter two errors: ``max share`` ``max |g - g64| / max |g64|`` (what tests/test_device_paths.py bounds) and
``rel`` ``||g - g64|| / ||g64||``, which one outlying element does not dominate (``g64`` on the float64 reference path,
which equals the fused path's float64 gradients to rounding); a row gives the worst and the
median over the model's parameters, each the mean over ``--seeds`` batches. Parameters whose float64 gradient is 0
up to rounding (BERT's key biases: softmax ignores a shift) are left out. ``--diagnose`` adds, per B-cos model,
``||G|| / ||G - ŵ <G, ŵ>||`` per layer (``G`` the gradient of the unit-norm weight: how much the weight
normalisation's gradient cancels) and the float64 gradients' change when every module's output is multiplied by
``1 + 2^-9 n`` (``n`` standard normal: one bfloat16 rounding's size) in the forward pass, or every module's input
gradient so in the backward pass. Deterministic; one thread (the models are tiny). docs/benchmarks.md#bf16-gradients
holds the measured numbers and what they show.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import transformers as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from bcos_plugins import bcos_loss, bcosify  # noqa: E402
from bcos_plugins.nn import reference_path  # noqa: E402

VOCAB = 64
B = 1.25
ROUNDING = 2.0**-9  # a bfloat16 rounding's relative size (half an ulp; 8 significant bits)


def _rotary(config_class, width: int, **extra):
    return config_class(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=2 * width, max_position_embeddings=128, num_labels=3,
                        pad_token_id=0, bos_token_id=2, eos_token_id=2, **extra)


# family -> (stock classifier class, config for a hidden width)
FAMILIES: dict[str, tuple[type, Callable[[int], object]]] = {
    "qwen3": (T.Qwen3ForSequenceClassification, lambda w: _rotary(T.Qwen3Config, w, head_dim=w // 4)),
    "llama": (T.LlamaForSequenceClassification, lambda w: _rotary(T.LlamaConfig, w)),
    "bert": (T.BertForSequenceClassification, lambda w: T.BertConfig(
        vocab_size=VOCAB, hidden_size=w, num_hidden_layers=2, num_attention_heads=4, intermediate_size=2 * w,
        max_position_embeddings=128, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
}
MODELS = ("stock", "stock unit rows", "bcos B=1", "bcos", "bcos reference")


def stock_model(family: str, width: int = 32, seed: int = 0) -> torch.nn.Module:
    """A tiny random stock classifier of ``family`` (2 layers, ``width`` wide), dropout off."""
    model_class, config = FAMILIES[family]
    torch.manual_seed(seed)
    return model_class(config(width)).eval()


def with_unit_rows(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` weights have rows of norm 1 (a B-cos layer's ``ŵ``)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.div_(module.weight.norm(dim=1, keepdim=True))
    return model


def models(family: str, width: int = 32, seed: int = 0) -> dict[str, tuple[torch.nn.Module, bool]]:
    """``{name: (model, on the reference path)}`` for :data:`MODELS`, all from one stock model."""
    stock = stock_model(family, width, seed)
    bcos = bcosify(copy.deepcopy(stock), b=B, verbose=False)
    return {"stock": (stock, False), "stock unit rows": (with_unit_rows(stock), False),
            "bcos B=1": (bcosify(copy.deepcopy(stock), b=1.0, verbose=False), False), "bcos": (bcos, False),
            "bcos reference": (bcos, True)}


def batch(rows: int = 4, tokens: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (no padding, ids 3 and up), their all-ones mask, and class labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, tokens), generator=g)
    return ids, torch.ones_like(ids), torch.arange(rows) % 3


def gradients(model: torch.nn.Module, ids, mask, labels, *, bf16: bool, reference: bool = False) -> dict:
    """Every parameter's gradient (float64) of ``bcos_loss`` for one batch, under bfloat16 autocast if ``bf16``."""
    model.zero_grad(set_to_none=True)
    with (reference_path() if reference else nullcontext()), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = bcos_loss(model(input_ids=ids, attention_mask=mask), labels)
    loss.backward()
    grads = {n: p.grad.detach().double() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def errors(actual: dict, expected: dict) -> dict[str, tuple[float, float]]:
    """Per parameter whose reference gradient is not 0 up to rounding: (max share, Frobenius relative error)."""
    largest = max(g.abs().max().item() for g in expected.values())
    out = {}
    for name, g64 in expected.items():
        scale = g64.abs().max().item()
        if scale <= 1e-9 * largest:  # (0 in exact arithmetic: its "error" is a quotient of roundings)
            continue
        diff = actual[name] - g64
        out[name] = (diff.abs().max().item() / scale, (diff.norm() / g64.norm()).item())
    return out


def measure(family: str, width: int = 32, rows: int = 4, tokens: int = 16, seeds: int = 1,
            names: tuple[str, ...] = MODELS) -> dict[str, dict[str, tuple[float, float]]]:
    """``{model name: {parameter: (max share, rel)}}`` under bfloat16 autocast against float64, the mean over
    ``seeds`` batches (seeds 1, 2, ...) of one model (seed 0)."""
    built = models(family, width)
    result: dict[str, dict[str, tuple[float, float]]] = {}
    for name in names:
        model, reference = built[name]
        wide = copy.deepcopy(model).double()
        per_seed = []
        for seed in range(1, seeds + 1):
            ids, mask, labels = batch(rows, tokens, seed)
            # the float64 reference path for every model: the step-by-step maths, independent of the fused kernels
            expected = gradients(wide, ids, mask, labels, bf16=False, reference=True)
            per_seed.append(errors(gradients(model, ids, mask, labels, bf16=True, reference=reference), expected))
        result[name] = {p: (statistics.fmean(e[p][0] for e in per_seed), statistics.fmean(e[p][1] for e in per_seed))
                        for p in per_seed[0]}
    return result


def median_rel(per_param: dict[str, tuple[float, float]]) -> float:
    """The median over parameters of the Frobenius relative error."""
    return statistics.median(v[1] for v in per_param.values())


def summary(per_param: dict[str, tuple[float, float]]) -> str:
    shares = [v[0] for v in per_param.values()]
    rels = [v[1] for v in per_param.values()]
    return (f"{max(shares):.4f} / {statistics.median(shares):.4f} | "
            f"{max(rels):.4f} / {statistics.median(rels):.4f}")


@contextmanager
def _unit_weight_gradients() -> Iterator[list[torch.Tensor]]:
    """Inside, on the reference path, the unit-norm weights of the B-cos layers keep their gradients ``G``: the
    list fills with them as the forward pass makes them."""
    import bcos_plugins.nn.linear as linear

    made: list[torch.Tensor] = []
    original = linear.cached_unit_norm

    def keeping(weight, *args, **kwargs):
        unit = original(weight, *args, **kwargs)
        if unit.requires_grad:
            unit.retain_grad()
            made.append(unit)
        return unit

    linear.cached_unit_norm = keeping
    try:
        yield made
    finally:
        linear.cached_unit_norm = original


def radial_shares(family: str, width: int = 32, b: float = B, seed: int = 1) -> list[float]:
    """Per B-cos layer (float64, reference path), ``||G|| / ||G - ŵ <G, ŵ>||`` over all its units: 1 where the
    normalisation's gradient cancels nothing, large where ``G`` is mostly radial."""
    model = bcosify(stock_model(family, width), b=b, verbose=False).double()
    ids, mask, labels = batch(seed=seed)
    with _unit_weight_gradients() as units:
        gradients(model, ids, mask, labels, bf16=False, reference=True)
    shares = []
    for unit in units:
        g = unit.grad.reshape(-1, unit.shape[-1])
        u = unit.detach().reshape(-1, unit.shape[-1])
        shares.append((g.norm() / (g - u * (g * u).sum(1, keepdim=True)).norm()).item())
    return shares


def perturbation_sensitivity(model: torch.nn.Module, where: str, seed: int = 1) -> dict[str, tuple[float, float]]:
    """Per parameter, how far the float64 gradients move when every leaf module's output (``where="forward"``) or
    input gradient (``"backward"``) is multiplied by ``1 + 2^-9 n``, ``n`` standard normal (fixed seed)."""
    model = copy.deepcopy(model).double()
    ids, mask, labels = batch(seed=seed)
    clean = gradients(model, ids, mask, labels, bf16=False)
    noise = torch.Generator().manual_seed(0)

    def rounded(t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        return t * (1 + ROUNDING * torch.randn(t.shape, generator=noise, dtype=t.dtype))

    handles = []
    for module in model.modules():
        if list(module.children()) or isinstance(module, torch.nn.Embedding):
            continue
        if where == "forward":
            handles.append(module.register_forward_hook(lambda m, args, out: rounded(out)))
        else:
            handles.append(module.register_full_backward_hook(
                lambda m, grad_in, grad_out: tuple(rounded(g) for g in grad_in)))
    try:
        return errors(gradients(model, ids, mask, labels, bf16=False), clean)
    finally:
        for handle in handles:
            handle.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--widths", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=8, help="batches (seeds 1..N) each error is averaged over")
    parser.add_argument("--per-param", action="store_true", help="print every parameter's errors")
    parser.add_argument("--diagnose", action="store_true", help="print the cancellation and perturbation checks")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.tokens < 1 or args.seeds < 1 or min(args.widths) < 4 or any(w % 4 for w in args.widths):
        parser.error("--rows, --tokens and --seeds must be >= 1 and every --widths a multiple of 4 (4 heads)")
    torch.set_num_threads(1)
    print(f"# bfloat16 autocast gradients against float64 (CPU, B = {B}, {args.rows} x {args.tokens} tokens, "
          f"mean over {args.seeds} batches)\n")
    print("| model | width | variant | max share: worst / median | rel: worst / median | rel median / stock unit rows |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        for width in args.widths:
            result = measure(family, width, args.rows, args.tokens, args.seeds)
            baseline = median_rel(result["stock unit rows"])
            for name, per_param in result.items():
                print(f"| {family} | {width} | {name} | {summary(per_param)} | {median_rel(per_param) / baseline:.2f}x |")
            if args.per_param:
                for param in sorted(result["bcos"]):
                    print(f"    {param}: " + " | ".join(
                        f"{name} {result[name][param][1]:.4f}" for name in result if param in result[name]))
    if args.diagnose:
        print("\n| model | width | ||G|| / ||G tangential|| per B-cos layer: min-max | gradient moved by one rounding "
              "per module, forward: stock / stock unit rows / bcos (rel median) | backward: same |")
        print("|---|---|---|---|---|")
        for family in args.families:
            for width in args.widths:
                shares = radial_shares(family, width)
                built = models(family, width)
                moved = {where: " / ".join(
                    f"{median_rel(perturbation_sensitivity(built[name][0], where)):.4f}"
                    for name in ("stock", "stock unit rows", "bcos")) for where in ("forward", "backward")}
                print(f"| {family} | {width} | {min(shares):.2f}-{max(shares):.2f} | {moved['forward']} | "
                      f"{moved['backward']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
