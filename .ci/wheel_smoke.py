"""Smoke test of the installed wheel, run by .ci/wheel_smoke.sh inside a fresh virtual environment.

It runs from a folder outside the repository, so every import resolves to the installed wheel: the package
data (dataset slices, GPT-2 tokenizer files) must be in the wheel, every adapter must import with the
dependencies its extra declares, and one explanation per host library (inseq, Captum, TransformerLens,
sae-lens) must run on tiny models and be exact. Each check prints one line; any failure exits non-zero.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
warnings.filterwarnings("ignore", category=DeprecationWarning)

import torch  # noqa: E402
import transformers as T  # noqa: E402

torch.set_num_threads(1)
TOLERANCE = 1e-4  # relative completeness error of float32 explanations of tiny models
REPO = Path(os.environ.get("BCOS_REPO", Path(__file__).resolve().parents[1])).resolve()
checks: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        raise SystemExit(f"wheel smoke test failed: {name} {detail}")
    checks.append(name)


def installed_package() -> None:
    import bcos_plugins

    where = Path(bcos_plugins.__file__).resolve().parent
    check("bcos_plugins is imported from the installed wheel, not the repository",
          "site-packages" in where.parts and where != REPO / "bcos_plugins", str(where))
    check("the adapters are installed inside the package",
          Path(importlib.import_module("bcos_plugins.adapters").__file__).resolve().parent == where / "adapters")
    version = importlib.metadata.version("bcos-plugins")
    check("__version__ equals the installed distribution's version", bcos_plugins.__version__ == version, version)
    for name in ("inseq", "captum", "transformer_lens", "sae_lens"):
        module = importlib.import_module(f"bcos_plugins.adapters.{name}")
        check(f"adapter bcos_plugins.adapters.{name} imports", module is not None)


def shipped_data() -> None:
    from bcos_plugins.data import SHIPPED_DATA, load_ag_news, load_blimp, load_sst2

    sst2, ag = load_sst2("test", n=8), load_ag_news("test", n=8)
    check("load_sst2 / load_ag_news read the shipped slices", len(sst2) == 8 and len(ag) == 8,
          f"{sst2.label_names}, {ag.label_names}")
    pairs = load_blimp("dna", n=20)
    check("load_blimp reads the shipped BLiMP slice", len(pairs) > 0, f"{len(pairs)} pairs")
    folders = sorted(p.name for p in SHIPPED_DATA.iterdir() if p.is_dir())
    missing = [f for f in folders if not (SHIPPED_DATA / f / "SOURCE.md").exists()]
    check("every shipped dataset carries its SOURCE.md", not missing and len(folders) >= 8, ", ".join(folders))


def demo_helpers() -> None:
    from bcos_plugins.pretrained import minilm_path

    folder = minilm_path()
    check("pretrained.minilm_path() finds the MiniLM the demo extra ships", (folder / "config.json").exists(),
          str(folder))


def gpt2_tokenizer():
    from bcos_plugins.data import shipped_data as shipped

    return T.GPT2Tokenizer.from_pretrained(shipped("gpt2_tokenizer"))


def core_and_captum() -> None:
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, records_to_html

    from bcos_plugins import bcosify, explain
    from bcos_plugins.visualize import tokens_to_html

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=40, num_labels=2)
    model = bcosify(T.BertForSequenceClassification(config).eval(), b=1.5, verbose=False)
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    expl = explain(model, ids, mask)
    check("core: explain() on a B-cos BERT is complete", expl.completeness_error.max() < TOLERANCE,
          f"{expl.completeness_error.max():.1e}")
    forward = EmbeddingForward(model)
    emb = forward.embed(ids, mask)
    attr, delta = BcosAttribution(forward).attribute(emb, target=torch.tensor([0, 1]),
                                                     additional_forward_args=(mask,),
                                                     return_convergence_delta=True)
    logits = model(input_ids=ids, attention_mask=mask).logits.detach()[torch.arange(2), torch.tensor([0, 1])]
    error = ((attr.sum(dim=(1, 2)) - logits).abs() / logits.abs()).max()
    check("Captum: BcosAttribution is complete", error < TOLERANCE and delta.abs().max() < 1e-4,
          f"{error:.1e}")
    page = tokens_to_html(["a", "b"], [0.5, -0.5])
    check("visualize: token HTML renders", 'title="' in page)
    check("Captum: records_to_html is importable", callable(records_to_html))


def inseq_generation() -> None:
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq

    from bcos_plugins import bcosify

    tokenizer = gpt2_tokenizer()
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64)
    model = bcosify(T.GPT2LMHeadModel(config).eval(), b=1.1, verbose=False)
    attribution_model = inseq.load_model(model, "bcos", tokenizer=tokenizer)
    out = attribution_model.attribute("The cat sat on the", generation_args={"max_new_tokens": 2, "do_sample": False},
                                      step_scores=["logit"], show_progress=False)
    seq = out.sequence_attributions[0]
    totals = torch.nansum(seq.target_attributions, dim=(0, 2))
    logits = seq.step_scores["logit"]
    error = ((totals - logits).abs() / logits.abs()).max()
    check('inseq: inseq.load_model(model, "bcos") attributions sum to the logits', error < TOLERANCE,
          f"{error:.1e}")


def transformer_lens_explanation() -> None:
    from bcos_plugins.adapters.transformer_lens import (
        BcosHookedTransformer,
        BcosTransformerConfig,
        explain_logits,
    )

    config = BcosTransformerConfig(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=40, n_ctx=16,
                                   device="cpu", act_fn="gelu_new", normalization_type="LN",
                                   positional_embedding_type="standard", seed=0, bcos_b=1.5)
    model = BcosHookedTransformer(config).eval()
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    result = explain_logits(model, tokens, target=5, foil=7)
    check("TransformerLens: explain_logits on a B-cos HookedTransformer is complete",
          result.completeness_error.max() < TOLERANCE, f"{result.completeness_error.max():.1e}")


def sae_lens_interactions() -> None:
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from sae_lens import StandardSAE, StandardSAEConfig

    from bcos_plugins.bilinear import BilinearMLP

    torch.manual_seed(0)
    layer = BilinearMLP(8, 16, bias=False)
    saes = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        sae = StandardSAE(StandardSAEConfig(d_in=8, d_sae=24))
        with torch.no_grad():
            sae.W_enc.normal_()
            sae.W_dec.normal_()
        saes.append(sae)
    analysis = BilinearSAEInteractions(layer, *saes)
    x = torch.randn(32, 8)
    eig = analysis.spectrum(3)
    quadratic = (eig.eigenvalues * (x @ eig.eigenvectors).square()).sum(-1)
    with torch.no_grad():
        output = saes[1]
        pre = (output.process_sae_in(layer(x)) @ output.W_enc + output.b_enc)[:, 3]
    spread = (pre - quadratic).max() - (pre - quadratic).min()
    check("sae-lens: an output feature's pre-activation is its interaction spectrum's quadratic form (+ const)",
          spread < 1e-3 * pre.abs().max().clamp_min(1.0), f"spread {spread:.1e}")
    check("sae-lens: feature interactions have the SAE's width",
          analysis.feature_interactions(3).shape == (24, 24))


if __name__ == "__main__":
    for step in (installed_package, shipped_data, demo_helpers, core_and_captum, inseq_generation,
                 transformer_lens_explanation, sae_lens_interactions):
        step()
    print(f"wheel smoke test ok ({len(checks)} checks)")
    sys.exit(0)
