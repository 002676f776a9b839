"""Circuit analysis of the B-cos IOI model with TransformerLens: activation patching vs exact per-head contributions.

`make ioi-circuit` (after `make bench-decoders`, which trains and caches the model; this script trains it the
same way if the cache is missing). On held-out IOI prompts of one template ("Friends {A} and {B} found a
{OBJECT} at the {PLACE}. {S} gave it to", held-out names), all of one token length so clean and corrupted runs
align position by position:

1. the B-cos GPT-2 of the IOI recipe (benchmarks/common/ioi_recipe.py) is converted with
   ``bcos_plugins.adapters.transformer_lens.hooked_transformer_from_hf`` (same logits, standard hook names);
2. **activation patching** with TransformerLens' own ``patching.get_act_patch_attn_head_out_all_pos``: each
   head's output (``hook_z``, all positions) from the clean run is patched into the run on the "ABC"-corrupted
   prompts (``bcos_plugins.data.corrupt_ioi``: three fresh names, no repeated name), scored by the IO - S logit
   difference normalised so that 0 = corrupted and 1 = clean;
3. **exact per-head contributions** (direct attribution through the cache): ``BcosActivationCache``'s
   ``get_full_resid_decomposition`` splits the final residual stream into embeddings, every head's result and
   every MLP's output, computed from the forward's own B-cos scales, and the final LayerNorm's scale is the
   cached one; projected onto ``W_U[:, IO] - W_U[:, S]`` the components sum to the logit difference exactly
   (the script prints the largest error). This is each head's *direct* effect; patching measures its total
   effect (direct and through later layers);
4. it prints the top heads of each method, their Spearman rank correlation over all heads, draws both as
   heatmaps (heads.png) and writes token contributions of the IO - S logit difference from ``explain(...,
   foil=...)`` on the B-cos model as an HTML page (tokens.html, bcos_plugins.visualize), with results.json.

Environment: CIRCUIT_PROMPTS (default 64, >= 1), CIRCUIT_SEED (0, >= 0), BENCH_THREADS (1) and the recipe's
settings (the BENCH_* variables of benchmarks/common/ioi_recipe.py); a bad value stops the run naming the
variable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from bcos_plugins import explain
from bcos_plugins.data.ioi import (
    IOI_HELDOUT_NAMES,
    IOI_HELDOUT_TEMPLATES,
    IOIPrompt,
    corrupt_ioi,
    make_ioi_prompts,
)
from bcos_plugins.visualize import explanations_to_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common import ioi_recipe
from benchmarks.common.settings import env_int, no_command_line_arguments

OUT = Path("outputs") / "ioi_circuit"
TEMPLATE = IOI_HELDOUT_TEMPLATES[0]  # the paper's Table 7 frame: "Friends {A} and {B} found a ..."


@dataclass
class CircuitPrompts:
    """Clean and corrupted token batches (model ids, BOS first, no padding) with the IO and S ids per row."""

    clean: Tensor
    corrupted: Tensor
    io: Tensor
    s: Tensor
    prompts: list[IOIPrompt]


def circuit_prompts(n: int, seed: int, tokenizer, to_model_ids: Callable[[Tensor], Tensor], bos_id: int,
                    template: str = TEMPLATE) -> CircuitPrompts:
    """``n`` held-out prompts of one template, kept at their most common token length (objects may be longer)."""
    prompts = make_ioi_prompts(n, split="heldout", seed=seed, tokenizer=tokenizer, templates=[template],
                               names=IOI_HELDOUT_NAMES)
    lengths = [len(p.input_ids) for p in prompts]
    common = max(set(lengths), key=lengths.count)
    prompts = [p for p in prompts if len(p.input_ids) == common]
    corrupted = corrupt_ioi(prompts, seed=seed, tokenizer=tokenizer)

    def tokens(ps: list[IOIPrompt]) -> Tensor:
        ids = torch.tensor([list(p.input_ids) for p in ps])
        return torch.cat([torch.full((len(ps), 1), bos_id), to_model_ids(ids)], dim=1)

    return CircuitPrompts(tokens(prompts), tokens(corrupted), to_model_ids(torch.tensor([p.target_id for p in prompts])),
                          to_model_ids(torch.tensor([p.foil_id for p in prompts])), prompts)


def logit_difference(logits: Tensor, io: Tensor, s: Tensor) -> Tensor:
    """Mean over rows of ``logit(IO) - logit(S)`` at the last position."""
    last = logits[:, -1]
    rows = torch.arange(last.shape[0], device=last.device)
    return (last[rows, io] - last[rows, s]).mean()


def head_patching(model, data: CircuitPrompts) -> tuple[Tensor, dict]:
    """Normalised IO - S logit difference after patching each head's clean output into the corrupted run."""
    from transformer_lens import patching

    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(data.clean)
        clean = float(logit_difference(clean_logits, data.io, data.s))
        corrupted = float(logit_difference(model(data.corrupted), data.io, data.s))
    if abs(clean - corrupted) < 1e-6:
        raise ValueError(f"clean and corrupted logit differences are equal ({clean:.4g}); patching is undefined")

    def metric(logits: Tensor) -> Tensor:
        return (logit_difference(logits, data.io, data.s) - corrupted) / (clean - corrupted)

    with torch.no_grad():
        effect = patching.get_act_patch_attn_head_out_all_pos(model, data.corrupted, clean_cache, metric)
    return effect.detach().cpu(), {"clean_logit_difference": clean, "corrupted_logit_difference": corrupted}


def head_direct_contributions(model, tokens: Tensor, io: Tensor, s: Tensor) -> tuple[Tensor, dict]:
    """Each head's exact direct contribution to the mean IO - S logit difference, shape (n_layers, n_heads).

    The full decomposition (embeddings, heads, MLPs, biases) sums to the logit difference; ``info`` reports it.
    """
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        components, labels = cache.get_full_resid_decomposition(pos_slice=-1, apply_ln=True, return_labels=True,
                                                                expand_neurons=False)
        direction = model.W_U[:, io] - model.W_U[:, s]  # (d_model, batch)
        per_component = torch.einsum("cbd,db->cb", components, direction)  # (component, batch)
        explained = logit_difference(logits, io, s)
    cfg = model.cfg
    heads = torch.zeros(cfg.n_layers, cfg.n_heads)
    for label, value in zip(labels, per_component.mean(1), strict=True):
        if label.startswith("L") and "H" in label:
            layer, head = label[1:].split("H")
            heads[int(layer), int(head)] = float(value)
    total = float(per_component.mean(1).sum())
    info = {"logit_difference": float(explained), "sum_of_components": total,
            "completeness_abs_error": abs(total - float(explained)),
            "components": {label: float(v) for label, v in zip(labels, per_component.mean(1), strict=True)
                           if not (label.startswith("L") and "H" in label)}}
    return heads, info


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two score tables (flattened)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a.flatten().numpy(), b.flatten().numpy()).statistic)


def top_heads(scores: Tensor, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` heads with the largest scores, as ``("L1H2", score)``."""
    n_heads = scores.shape[1]
    order = scores.flatten().argsort(descending=True)[:k].tolist()
    return [(f"L{i // n_heads}H{i % n_heads}", float(scores.flatten()[i])) for i in order]


def plot_heatmaps(patching_effect: Tensor, direct: Tensor, path: Path, rho: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2 + 0.3 * patching_effect.shape[0]))
    for ax, values, title in ((axes[0], patching_effect, "activation patching\n(normalised IO - S logit diff.)"),
                              (axes[1], direct, "exact direct contribution\nto the IO - S logit diff.")):
        bound = float(values.abs().max()) or 1.0
        image = ax.imshow(values.numpy(), cmap="RdBu", vmin=-bound, vmax=bound)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"B-cos GPT-2 heads on held-out IOI (Spearman rank correlation {rho:.2f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class ModelVocabularyTokens:
    """``convert_ids_to_tokens`` for a model whose ids are renumbered GPT-2 ids (readable, spaces kept)."""

    def __init__(self, tokenizer, to_gpt2: Tensor) -> None:
        self.tokenizer, self.to_gpt2 = tokenizer, to_gpt2

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([int(self.to_gpt2[i])]) for i in ids]


def token_contributions_html(hf_model, data: CircuitPrompts, readable, path: Path, rows: int = 12) -> float:
    """Write the IO - S token contributions of ``explain`` for the first ``rows`` prompts; returns the largest
    relative completeness error."""
    expl = explain(hf_model, data.clean[:rows], target=data.io[:rows], foil=data.s[:rows])
    names = readable.convert_ids_to_tokens(list(range(len(readable.to_gpt2))))
    page = explanations_to_html(expl, readable, label_names=[n.strip() for n in names],
                                title="B-cos GPT-2: token contributions to logit(IO) - logit(S)")
    path.write_text(page, encoding="utf-8")
    return float(expl.completeness_error.max())


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg = ioi_recipe.Settings.from_env()
    n_prompts, prompt_seed = env_int("CIRCUIT_PROMPTS", 64, minimum=1), env_int("CIRCUIT_SEED", 0, minimum=0)
    torch.set_num_threads(cfg.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    data = ioi_recipe.make_data(cfg)
    _, bcos, _ = ioi_recipe.trained_models(cfg, data)
    lens = hooked_transformer_from_hf(bcos).eval()
    prompts = circuit_prompts(n_prompts, prompt_seed, data.tokenizer, data.vocab, data.eos)
    with torch.no_grad():
        same = (lens(prompts.clean) - bcos(prompts.clean).logits).abs().max().item()
    print(f"{len(prompts.prompts)} prompts of length {prompts.clean.shape[1]}; TransformerLens vs transformers "
          f"logits: max |difference| {same:.2e}")
    effect, patch_info = head_patching(lens, prompts)
    direct, direct_info = head_direct_contributions(lens, prompts.clean, prompts.io, prompts.s)
    rho = spearman(effect, direct)
    top_patch, top_direct = top_heads(effect), top_heads(direct)
    print(f"IO - S logit difference: clean {patch_info['clean_logit_difference']:.3f}, corrupted (ABC) "
          f"{patch_info['corrupted_logit_difference']:.3f}")
    print("top heads, activation patching:  " + ", ".join(f"{h} {v:+.3f}" for h, v in top_patch))
    print("top heads, direct contribution:  " + ", ".join(f"{h} {v:+.3f}" for h, v in top_direct))
    print(f"Spearman rank correlation over {effect.numel()} heads: {rho:.3f}")
    print(f"decomposition: components sum to {direct_info['sum_of_components']:.5f}, logit difference "
          f"{direct_info['logit_difference']:.5f} (|error| {direct_info['completeness_abs_error']:.1e})")
    plot_heatmaps(effect, direct, OUT / "heads.png", rho)
    readable = ModelVocabularyTokens(data.tokenizer, data.vocab.to_gpt2)
    err = token_contributions_html(bcos, prompts, readable, OUT / "tokens.html")
    result = {"n_prompts": len(prompts.prompts), "template": TEMPLATE, "lens_vs_hf_max_abs_logit_diff": same,
              **patch_info, "patching": effect.tolist(), "direct": direct.tolist(), "spearman": rho,
              "top_heads_patching": top_patch, "top_heads_direct": top_direct,
              "decomposition": direct_info, "explain_completeness_error_max": err}
    (OUT / "results.json").write_text(json.dumps(result, indent=2))
    print(f"explain: largest relative completeness error {err:.1e}")
    print(f"wrote {OUT / 'heads.png'}, {OUT / 'tokens.html'} and {OUT / 'results.json'}")


if __name__ == "__main__":
    main()
