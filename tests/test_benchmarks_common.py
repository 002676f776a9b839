"""benchmarks.common, the code the benchmark and example scripts share: the Captum baselines of contrastive
next-token explanations attribute where ``explain`` does, the compact vocabulary renumbers and maps back, and
the scripts reach each other's parts by import, never by loading a file."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from captum.attr import InputXGradient, Occlusion, Saliency
from transformers import GPT2Config, GPT2LMHeadModel

from bcos_plugins import bcosify
from bcos_plugins.train_decoder import real_token_positions
from benchmarks.common.decoder_baselines import CompactVocabulary, captum_scores

ROOT = Path(__file__).resolve().parents[1]
# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")


def _left_padded_batch(vocab_size: int, eos: int) -> SimpleNamespace:
    torch.manual_seed(1)
    ids = torch.randint(1, vocab_size, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids = ids.masked_fill(mask == 0, eos)  # the scripts' batches pad with end-of-text on the left
    return SimpleNamespace(input_ids=ids, attention_mask=mask, target_ids=torch.tensor([3, 5, 7]),
                           foil_ids=torch.tensor([4, 6, 8]))


def _scores_at_the_drop_input(model, batch) -> dict[str, torch.Tensor]:
    """The baselines as the scripts computed them before they used EmbeddingForward: GPT-2's word + position
    embedding fed in through a hook on ``transformer.drop``, logits of the last column (left padding)."""
    ids, mask = batch.input_ids, batch.attention_mask
    positions = real_token_positions(mask)

    def contrast(embedded, input_ids, attention_mask, position_ids, target, foil):
        handle = model.transformer.drop.register_forward_pre_hook(lambda module, args: (embedded, *args[1:]))
        try:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        finally:
            handle.remove()
        last = logits[:, -1]
        return last.gather(1, target[:, None]).squeeze(1) - last.gather(1, foil[:, None]).squeeze(1)

    def combined(token_ids):
        return (model.transformer.wte(token_ids) + model.transformer.wpe(positions)).detach()

    extra = (ids, mask, positions, batch.target_ids, batch.foil_ids)
    x = combined(ids)
    return {
        "Saliency": Saliency(contrast).attribute(x.clone().requires_grad_(), abs=True,
                                                 additional_forward_args=extra).sum(-1),
        "InputXGradient": InputXGradient(contrast).attribute(x.clone().requires_grad_(),
                                                             additional_forward_args=extra).sum(-1),
        "Occlusion": Occlusion(contrast).attribute(
            x, sliding_window_shapes=(1, x.shape[-1]), baselines=combined(torch.full_like(ids, model.config.eos_token_id)),
            additional_forward_args=extra, perturbations_per_eval=4)[..., 0],
    }


@pytest.mark.parametrize("kind", ["conventional", "bcos"])
def test_captum_baselines_are_the_scripts_earlier_scores_at_the_combined_embedding(kind):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=20, n_embd=16, n_layer=2, n_head=2, n_positions=16, n_ctx=16, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    if kind == "bcos":
        model = bcosify(model, b=1.1, verbose=False).eval()
    batch = _left_padded_batch(config.vocab_size, config.eos_token_id)
    scores, seconds = captum_scores(model, batch)
    expected = _scores_at_the_drop_input(model, batch)
    assert set(scores) == set(seconds) == set(expected)
    for method, value in expected.items():
        assert scores[method].shape == batch.input_ids.shape
        torch.testing.assert_close(scores[method], value.detach(), rtol=1e-5, atol=1e-6, msg=method)


def test_compact_vocabulary_renumbers_the_ids_in_use_and_maps_back():
    vocab = CompactVocabulary(torch.tensor([50256]), torch.tensor([[464, 3290], [464, 50256]]))
    assert len(vocab) == 3
    compact = vocab(torch.tensor([[464, 3290, 50256]]))
    assert compact.tolist() == [[0, 1, 2]]
    assert vocab.to_gpt2[compact].tolist() == [[464, 3290, 50256]]


def test_no_script_or_test_loads_a_script_by_its_file_path():
    loads = re.compile(r"spec_from_file_location|SourceFileLoader|runpy\.run_path")
    found = [str(path.relative_to(ROOT)) for folder in ("examples", "benchmarks", "tests")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if path.name != Path(__file__).name and loads.search(path.read_text(encoding="utf-8"))]
    assert not found, f"load these by import (from examples import x; from benchmarks.common import y): {found}"


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _private_imports(path: Path, source: str | None = None) -> list[str]:
    """What the script at ``path`` takes from the package or another script that is private: a module or name
    with a leading underscore, imported (``from bcos_plugins import _env``, ``from benchmarks.common.x import
    _helper``, relative imports included) or read off an imported module (``bcos_plugins.nn.functional._FLAG``)."""
    ours = ("bcos_plugins", "benchmarks", "examples")
    package = ".".join(path.relative_to(ROOT).parent.parts)
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ours:
                    bound = alias.asname or alias.name.split(".")[0]  # `import a.b` binds `a`
                    modules[bound] = alias.name if alias.asname else bound
                    if _private(alias.name):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] not in ours:
                continue
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{module}.{alias.name}"
                if _private(f"{module}.{alias.name}"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and _private(node.attr):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {modules[node.value.id]}.{node.attr}")
    return found


def test_the_scripts_import_no_private_module_of_the_package():
    # nor a private name of it, nor of each other: what two scripts share is a public name of benchmarks.common
    found = [line for folder in ("examples", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
             for line in _private_imports(path)]
    assert not found, "the scripts' shared code lives in benchmarks.common, not in a private module or name:\n" + \
        "\n".join(found)


def test_the_private_import_check_sees_each_spelling():
    script = ROOT / "benchmarks" / "common" / "settings.py"  # where the relative import is read from
    source = ("import bcos_plugins._env\nfrom bcos_plugins import _checks\nfrom bcos_plugins.nn.functional import "
              "_REFERENCE_PATH\nfrom ._helpers import x\nimport bcos_plugins.nn.functional as F\nF._FLAG\n"
              "from bcos_plugins import explain, errors\nimport torch\ntorch._C\n")
    assert [line.split(" ", 1)[1] for line in _private_imports(script, source)] == [
        "import bcos_plugins._env", "from bcos_plugins import _checks",
        "from bcos_plugins.nn.functional import _REFERENCE_PATH", "from benchmarks.common._helpers import x",
        "bcos_plugins.nn.functional._FLAG"]
