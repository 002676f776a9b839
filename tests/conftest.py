"""Shared fixtures: tiny random-config transformers models (no hub access) and padded batches."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the scripts are the packages `examples` and `benchmarks` at the repository root: tests import them by name
REPOSITORY_ROOT = str(Path(__file__).resolve().parents[1])
if REPOSITORY_ROOT not in sys.path:
    sys.path.insert(0, REPOSITORY_ROOT)

class RecordedOps(TorchDispatchMode):
    """The names of the aten ops dispatched while active (``ops``, in dispatch order), leaving out those in
    ``skip`` (views, allocations: ops that launch no kernel, as each test defines them)."""

    def __init__(self, skip: frozenset[str] | set[str] = frozenset()) -> None:
        super().__init__()
        self.skip = skip
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.skip:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


VOCAB = 60
MAX_POS = 40


def tiny_config(family: str, num_labels: int = 3):
    if family == "bert":
        return T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=MAX_POS, num_labels=num_labels)
    if family == "distilbert":
        return T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                  max_position_embeddings=MAX_POS, num_labels=num_labels)
    if family == "roberta":
        return T.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=MAX_POS + 2, num_labels=num_labels,
                               pad_token_id=1)
    if family == "gpt2":
        # bos = eos = 2 (GPT-2's end of text is one id), inside the vocabulary like the other families' special ids
        return T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POS,
                            n_ctx=MAX_POS, num_labels=num_labels, pad_token_id=0, bos_token_id=2, eos_token_id=2)
    if family == "llama":
        return T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=MAX_POS,
                             num_labels=num_labels, pad_token_id=0)
    raise ValueError(family)


def tiny_model(class_name: str, seed: int = 0):
    family = {"Bert": "bert", "Dist": "distilbert", "Robe": "roberta", "GPT2": "gpt2", "Llam": "llama"}[
        class_name[:4]]
    torch.manual_seed(seed)
    return getattr(T, class_name)(tiny_config(family)).eval()


def tiny_bcos_model(class_name: str = "BertForSequenceClassification", b: float = 1.5):
    """:func:`tiny_model` of ``class_name`` made B-cos, in eval mode."""
    from bcos_plugins import bcosify

    return bcosify(tiny_model(class_name), b=b, verbose=False).eval()


def tiny_bcos_gpt2_and_rows(n_rows: int = 7):
    """A tiny B-cos GPT-2 LM (B = 1.5, dropout off, seed 0) and ``n_rows`` token rows of 3 to 11 ids in [5, 40) from a
    generator seeded 0: the set-up of the B warm-up training tests (tests/test_leftovers_s24.py,
    tests/test_trust_pass22_followups3.py), in one place."""
    from bcos_plugins import bcosify

    torch.manual_seed(0)
    config = tiny_config("gpt2")
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = bcosify(T.GPT2LMHeadModel(config), b=1.5, verbose=False)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(n_rows)]
    return model, rows


def with_nan_embedding_row(model: torch.nn.Module, token: int) -> torch.nn.Module:
    """A copy of ``model`` whose input embedding row ``token`` is NaN (a broken padding or real token)."""
    import copy

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_input_embeddings().weight[token] = float("nan")
    return broken


def hooked_transformer_from_hf_or_none():
    """The adapter's ``hooked_transformer_from_hf`` under TransformerLens 3.x; under TransformerLens 4, which has no
    HookedTransformer, ``None`` once the adapter is seen to refuse it naming ``transformer_bridge_from_hf``: a test
    of the HookedTransformer path checks that refusal there instead of passing without a check."""
    from bcos_plugins.adapters import transformer_lens as lens

    if lens.HAS_HOOKED_TRANSFORMER:
        return lens.hooked_transformer_from_hf
    with pytest.raises(ImportError, match=r"hooked_transformer_from_hf needs TransformerLens 3\.x.*"
                                          r"transformer_bridge_from_hf\(hf_model\)"):
        lens.hooked_transformer_from_hf  # noqa: B018
    return None


def zero_unit_projection(kind: str, b: float, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A BcosLinear (units are weight rows) or BcosConv1D (units are columns), 6 -> 5, with unit 2's weights
    all zero (its norm is clamped, so the normalisation's gradient is the plain division's there)."""
    from bcos_plugins.nn import BcosConv1D, BcosLinear

    torch.manual_seed(0)
    if kind == "linear":
        layer = BcosLinear(6, 5, b=b)
        with torch.no_grad():
            layer.weight[2] = 0.0
    else:
        conv = T.pytorch_utils.Conv1D(5, 6)
        torch.nn.init.normal_(conv.weight)
        layer = BcosConv1D.from_conv1d(conv, b=b)
        with torch.no_grad():
            layer.weight[:, 2] = 0.0
    return layer.to(dtype)


def padded_batch(seed: int = 0, batch: int = 3, length: int = 9, side: str = "right", pad_id: int = 0):
    """Token ids avoiding special ids 0-2, with rows of different lengths (row 0 unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        n_pad = min(row * 2, length - 2)
        if side == "right":
            mask[row, length - n_pad:] = 0
        else:
            mask[row, :n_pad] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    return ids, mask


def padded_rows(lengths: list[int], width: int, side: str, seed: int):
    """Rows of ``lengths`` real tokens (ids 3.., never the pad id 0) padded with 0 to ``width`` on ``side``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, width - n:] = 1
        else:
            mask[row, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture
def batch():
    return padded_batch()


@pytest.fixture(scope="module")
def minilm_bcos_bert():
    """A tiny B-cos BERT sentiment classifier over the bert-base-uncased vocabulary (the shipped MiniLM tokenizer's),
    its tokenizer, and a padded batch of two texts (tests/test_trust_pass10.py, tests/test_trust_pass22_vision_data.py)."""
    from bcos_plugins import bcosify
    from bcos_plugins.pretrained import minilm_path

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, num_labels=2)
    model = bcosify(T.BertForSequenceClassification(config).eval(), b=1.5, verbose=False)
    batch = tokenizer(["a gorgeous, witty film", "dull"], padding=True, return_tensors="pt")
    return model, tokenizer, batch


def write_seed_reports(folder: Path, labels: list[int], predictions: dict[str, dict[int, list[int]]]) -> list[Path]:
    """One guided-training JSON report per seed (``default_seed{seed}.json`` in ``folder``, the form
    ``benchmarks.common.paired_report`` reads): ``predictions[model][seed]`` are the model's predictions of
    ``labels`` on that seed; accuracy and attention IoU are placeholders (the reports read the predictions)."""
    import json

    seeds = sorted({seed for by_seed in predictions.values() for seed in by_seed})
    files = []
    for seed in seeds:
        path = folder / f"default_seed{seed}.json"
        path.write_text(json.dumps({"chance": {"iou": 0.1}, "settings": {"seed": seed}, "labels": labels, **{
            name: {"accuracy": 0.0, "predictions": by_seed[seed], "attention": {"iou": 0.2}}
            for name, by_seed in predictions.items()}}))
        files.append(path)
    return files


# the two ViT kinds of bcos_plugins.vision, tiny and random (tests/test_vision_posthoc.py, tests/test_bench_vision.py)
TINY_VIT_SHAPE = dict(image_size=16, num_channels=1, patch_size=4, hidden_size=16, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=32, tokenizer="conv", conv_channels=[4], num_labels=5)


@pytest.fixture(scope="module")
def tiny_vits():
    from bcos_plugins.vision import BcosViT, BcosViTConfig, ConventionalViT

    torch.manual_seed(0)
    bcos = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()
    conventional = ConventionalViT(BcosViTConfig(**TINY_VIT_SHAPE)).eval()
    return {"bcos": bcos, "conventional": conventional}


@pytest.fixture(scope="module")
def vit_images():
    """Three random 16x16 grey images and their targets."""
    torch.manual_seed(1)
    return torch.rand(3, 1, 16, 16), torch.tensor([0, 3, 4])


def package_reads_of(fields: set[str], allowed: set[Path]) -> list[str]:
    """Where the package's sources (bcos_plugins/, adapters/) read one of ``fields`` as an attribute or a string,
    outside the files in ``allowed`` and the TransformerLens converters (which translate a transformers config into
    a TransformerLens one): the guard of a "one function reads this" mechanism."""
    root = Path(__file__).resolve().parents[1]
    reads = []
    for folder in ("bcos_plugins", "adapters"):
        for path in sorted((root / folder).rglob("*.py")):
            if path in allowed or path.parent == root / "adapters" / "_lens" / "conversions":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                read = (node.attr if isinstance(node, ast.Attribute) else
                        node.value if isinstance(node, ast.Constant) else None)
                if read in fields:
                    reads.append(f"{path.relative_to(root)}:{node.lineno} reads {read}")
    return reads


def random_standard_sae(d_in: int, hook_name: str):
    """An sae-lens ``StandardSAE`` (``d_sae=16``) read at ``hook_name``, every parameter drawn from N(0, 0.3) after
    seed 0, so that its biases are non-zero and a lost bias term shows (tests/test_trust_pass23_lens.py,
    tests/test_trust_pass24_lens.py)."""
    from sae_lens import StandardSAE, StandardSAEConfig

    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=16))
    with torch.no_grad():
        for param in sae.parameters():
            param.normal_(0, 0.3)
    sae.cfg.metadata.hook_name = hook_name
    return sae
