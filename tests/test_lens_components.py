"""Token x component decomposition (beyond TransformerLens): exact on B-cos and bilinear models.

Runs under TransformerLens 3.x (HookedTransformer models and bridges) and 4.x (bridges only; the model list
is built from what the installed TransformerLens offers, so nothing is skipped).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import (
    HAS_HOOKED_TRANSFORMER,
    plot_token_components,
    token_component_decomposition,
    transformer_bridge_from_hf,
)
from conftest import VOCAB, tiny_config, tiny_model

from bcos_plugins import BcosError, bcosify
from bcos_plugins.attribution import Direction

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bilinear_llama():
    config = tiny_config("llama")
    config.hidden_act = "linear"
    torch.manual_seed(0)
    return T.LlamaForCausalLM(config).eval()


HF = {
    "bcos_gpt2": lambda: bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False),
    "bcos_llama": lambda: bcosify(tiny_model("LlamaForCausalLM"), b=1.1, verbose=False),
    "bilinear_llama": _bilinear_llama,
}
MODELS = {f"bridge_{name}": (lambda make=make: transformer_bridge_from_hf(make())) for name, make in HF.items()}
if HAS_HOOKED_TRANSFORMER:
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    MODELS.update({f"hooked_{name}": (lambda make=make: hooked_transformer_from_hf(make())) for name, make in HF.items()})
_BUILT: dict = {}


def model_named(name):
    if name not in _BUILT:
        _BUILT[name] = MODELS[name]()
    return _BUILT[name]


def ids(seed: int = 1, batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def explain_through_hooks(model, tokens, target, position):
    leaves = {}

    def capture(activation, hook):
        leaves[hook.name] = activation.detach().requires_grad_(True)
        return leaves[hook.name]

    from bcos_plugins import explanation_mode

    names = [n for n in ("hook_embed", "hook_pos_embed") if n in model.hook_dict]
    rows = torch.arange(tokens.shape[0])
    with explanation_mode(model), torch.enable_grad():
        explained = model.run_with_hooks(tokens, fwd_hooks=[(n, capture) for n in names])[rows, position, target]
        grads = torch.autograd.grad(explained.sum(), list(leaves.values()))
    return sum((leaf * g).sum(-1) for leaf, g in zip(leaves.values(), grads, strict=True)).detach()


@pytest.mark.parametrize("name", list(MODELS))
def test_table_sums_to_the_logit_and_its_margins_are_dla_and_token_contributions(name):
    model = model_named(name)
    tokens = ids()
    result = token_component_decomposition(model, tokens, target=5, position=-2)
    n_heads, n_layers = model.cfg.n_heads, model.cfg.n_layers
    assert result.labels[0] == "direct" and len(result.labels) == 1 + n_layers * (n_heads + 1)
    assert result.table.shape == (2, 7, len(result.labels))
    with torch.no_grad():
        logits = model(tokens)
    torch.testing.assert_close(result.explained, logits[:, 5, 5])  # position -2 of 7 tokens is 5
    assert result.completeness_error.max() <= 1e-4
    # column sums: the token contributions of an explanation at the embeddings
    reference = explain_through_hooks(model, tokens, 5, result.position)
    assert ((result.token_totals - reference).abs().max() / result.explained.abs().max()) <= 1e-4
    # row sums: each MLP's direct logit attribution, from the cached output and the unembedding
    _, cache = model.run_with_cache(tokens)
    scale = cache["ln_final.hook_scale"][:, 5]
    centred = model.cfg.normalization_type in ("LN", "LNPre")
    for layer in range(n_layers):
        out = cache[f"blocks.{layer}.hook_mlp_out"][:, 5]
        out = out - out.mean(-1, keepdim=True) if centred else out
        weight = model.ln_final.w if hasattr(model.ln_final, "w") else 1.0  # a bridge keeps the norm weight
        dla = ((out / scale) * weight) @ model.W_U[:, 5]
        got = result.component_totals[:, result.labels.index(f"L{layer}MLP")]
        assert ((got - dla).abs().max() / result.explained.abs().max()) <= 1e-4


@pytest.mark.parametrize("name", [n for n in MODELS if n.endswith("bcos_gpt2")])
def test_contrast_direction_padding_and_loop_agree(name):
    model = model_named(name)
    tokens = ids(seed=2, batch=3, length=8)
    mask = torch.ones_like(tokens)
    mask[1, -3:] = 0
    contrast = token_component_decomposition(model, tokens, target=4, foil=9, attention_mask=mask)
    assert contrast.position.tolist() == [7, 4, 7]
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask)
    rows = torch.arange(3)
    torch.testing.assert_close(contrast.explained, logits[rows, contrast.position, 4] - logits[rows, contrast.position, 9])
    assert contrast.completeness_error.max() <= 1e-4
    assert contrast.table[1, 5:].abs().max() == 0  # padding after the explained position contributes nothing
    vector = torch.zeros(VOCAB)
    vector[4], vector[9] = 1.0, -1.0
    direction = token_component_decomposition(model, tokens, target=Direction(vector), attention_mask=mask)
    torch.testing.assert_close(direction.table, contrast.table, rtol=1e-4, atol=1e-6)
    loop = token_component_decomposition(model, tokens, target=4, foil=9, attention_mask=mask, batched=False)
    torch.testing.assert_close(loop.table, contrast.table, rtol=1e-4, atol=1e-6)


def test_heatmap_and_errors(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    name = next(iter(MODELS))
    model = model_named(name)
    result = token_component_decomposition(model, ids())
    image = plot_token_components(result, row=1, token_labels=[f"t{i}" for i in range(7)])
    assert image.get_array().shape == (len(result.labels), 7)
    image.figure.savefig(tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").stat().st_size > 0
    with pytest.raises(BcosError, match="row: 2 is outside the batch of 2"):
        plot_token_components(result, row=2)
    with pytest.raises(BcosError, match="token_labels: 3 labels for 7 tokens"):
        plot_token_components(result, token_labels=["a", "b", "c"])
    with pytest.raises(BcosError, match=r"tokens: token ids must be integers, got torch\.float32\. Pass the "
                                       r"tokenizer's ids \(TransformerLens: model\.to_tokens"):
        token_component_decomposition(model, ids().float())
    with pytest.raises(BcosError, match=rf"tokens: has ids outside the vocabulary \[0, {VOCAB}\) at rows \[0, 1\]: .*"
                                       "Tokenise with the model's own tokenizer"):
        token_component_decomposition(model, ids() + VOCAB)
    with pytest.raises(BcosError, match="target: ids must lie in"):
        token_component_decomposition(model, ids(), target=VOCAB)
    with pytest.raises(BcosError, match="attention_mask: shape"):
        token_component_decomposition(model, ids(), attention_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(BcosError, match="not detachable"):
        token_component_decomposition(torch.nn.Linear(2, 2), ids())
