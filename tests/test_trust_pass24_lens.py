"""Trust pass 24, TransformerLens and sae-lens (helper-180): TransformerLens' own cache calls (``logit_attrs`` with
token tensors of other shapes, ids and dtypes), a ``HookedTransformer``'s ``cfg`` edited after it was built, and SAE
features read inside a bridge's gate branch, each checked against an independent computation (the logits the forward
returned, gathered at the tokens; sae-lens' own encode of the cached activation)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import random_standard_sae
from sae_lens import StandardSAE, StandardSAEConfig
from test_conformance import B, _stock

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosError

warnings.filterwarnings("ignore", category=DeprecationWarning)

_BUILT: dict = {}
# batch 3 and 3 positions: a (batch,) token tensor broadcast against a (batch, pos) stack lines up with the positions
SQUARE = torch.tensor([[5, 6, 7], [11, 12, 13], [20, 21, 22]])
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def _hf(name: str, bcos: bool = True):
    if (name, bcos) not in _BUILT:
        stock = _stock(name)
        _BUILT[name, bcos] = (bcosify(stock, b=B, verbose=False) if bcos else stock).eval()
    return _BUILT[name, bcos]


def _model(kind: str, name: str = "GPT2LMHeadModel", bcos: bool = True):
    """A fresh HookedTransformer (``"hooked"``) or TransformerBridge (``"bridge"``) of the (B-cos) ``name``."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf, transformer_bridge_from_hf

    build = hooked_transformer_from_hf if kind == "hooked" else transformer_bridge_from_hf
    return build(_hf(name, bcos))


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_logit_attrs_refuses_one_token_per_row_against_a_stack_with_positions(kind):
    """``cache.logit_attrs(stack, tokens=(batch,))`` on a stack that still has its position axis: TransformerLens
    broadcasts the (batch, d_model) directions against the stack's trailing (pos, d_model), so row b's token was read
    at position b of every row: with batch == pos the attributions summed to logits 0.41 off each row's token logit,
    without a word (another batch size failed inside torch's broadcasting). Refused naming ``tokens`` and the shapes;
    the shapes that line up keep TransformerLens' values: (batch, pos), (batch, 1), and (batch,) with the positions
    sliced, each summing to the logits the forward returned."""
    model = _model(kind)
    logits, cache = model.run_with_cache(SQUARE)
    stack = cache.decompose_resid()
    per_row = torch.tensor([1, 2, 3])
    with pytest.raises(BcosError, match=r"tokens: has shape \(3,\).*\(3, 3\).*\(batch, pos\).*pos_slice"):
        cache.logit_attrs(stack, tokens=per_row)
    with pytest.raises(BcosError, match=r"incorrect_tokens: has shape \(3,\)"):
        cache.logit_attrs(stack, tokens=per_row[:, None], incorrect_tokens=per_row)
    rows = torch.arange(3)
    wanted = logits[rows[:, None], torch.arange(3)[None, :], per_row[:, None]]
    torch.testing.assert_close(cache.logit_attrs(stack, tokens=per_row[:, None]).sum(0), wanted, atol=1e-6, rtol=0)
    grid = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    torch.testing.assert_close(cache.logit_attrs(stack, tokens=grid).sum(0),
                               logits.gather(-1, grid[..., None])[..., 0], atol=1e-6, rtol=0)
    last = cache.decompose_resid(pos_slice=-1)
    torch.testing.assert_close(cache.logit_attrs(last, tokens=per_row, pos_slice=-1).sum(0),
                               logits[rows, -1, per_row], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache.logit_attrs(stack, tokens=4).sum(0), logits[..., 4], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
@pytest.mark.parametrize("tokens, problem", [
    (-1, r"ids must lie in \[0, \d+\), got \[-1\]"),
    (torch.tensor([[3], [-100], [4]]), r"ids must lie in \[0, \d+\), got \[-100\]"),
    (torch.tensor([[1.0], [2.0], [3.0]]), "must be an integer tensor, got dtype torch.float32"),
    (torch.tensor([[True], [False], [True]]), "must be an integer tensor, got dtype torch.bool"),
])
def test_logit_attrs_refuses_token_ids_that_are_not_ids_of_the_vocabulary(kind, tokens, problem):
    """A negative id (-1, or the -100 of an ignored label) was read from the end of the vocabulary (W_U[:, -1]: the
    last token's logit, without a word); a boolean tensor indexed W_U as a mask and a float one failed inside
    TransformerLens with an IndexError. Refused naming the argument, for ``incorrect_tokens`` too."""
    model = _model(kind)
    _, cache = model.run_with_cache(SQUARE)
    stack = cache.decompose_resid()
    with pytest.raises(BcosError, match=rf"^tokens: {problem}"):
        cache.logit_attrs(stack, tokens=tokens)
    with pytest.raises(BcosError, match=rf"^incorrect_tokens: {problem}"):
        cache.logit_attrs(stack, tokens=torch.zeros_like(tokens, dtype=torch.long)
                          if isinstance(tokens, torch.Tensor) else 0, incorrect_tokens=tokens)



def _logit_explanations(model):
    """The totals of explain_logits and of token_component_decomposition's table at position -1, target 3."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    return explain_logits(model, TOKENS, target=3).total, \
        token_component_decomposition(model, TOKENS, target=3).table.sum((1, 2))


def _feature_explanation(model):
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=model.cfg.d_model, d_sae=8))
    sae.cfg.metadata.hook_name = "blocks.1.hook_resid_mid"
    return explain_sae_feature(model, TOKENS, sae, 2)


@pytest.mark.parametrize("name, bcos, field, value", [
    ("GPT2LMHeadModel", True, "output_logits_soft_cap", 0.5),
    ("LlamaForCausalLM", False, "output_logits_soft_cap", 0.5),
    ("LlamaForCausalLM", False, "clip_qkv", 0.01),
])
def test_an_option_set_on_the_cfg_after_the_model_was_built_is_refused_where_it_breaks_the_sums(name, bcos, field,
                                                                                                 value):
    """TransformerLens reads ``cfg.output_logits_soft_cap`` and ``cfg.clip_qkv`` at every forward, so setting them on
    a built model (``model.cfg.output_logits_soft_cap = 30.0``, as a Gemma config has it) changes its logits; the
    options make_explainable refuses at construction were not looked at again: explain_logits' contributions missed
    the capped logit by 0.019 (a B-cos GPT-2) and the clipped one by 0.006 (a plain Llama), cache.logit_attrs of the
    stack summed to the uncapped logit (0.010 off), without a word. Refused now, naming the option; the explanations
    of the unedited model are exact, and an SAE feature read inside the model is still explained under a cap (which
    bends only the logits), not under clipped values."""
    model = _model("hooked", name, bcos)
    logits = model(TOKENS)[:, -1, 3]
    for total in _logit_explanations(model):
        torch.testing.assert_close(total, logits, atol=1e-6, rtol=0)
    setattr(model.cfg, field, value)
    assert not torch.allclose(model(TOKENS)[:, -1, 3], logits, atol=1e-4)  # the option does change the logits
    refusal = rf"^model: its cfg .*changed after the model was built.*{field}={value}"
    with pytest.raises(BcosError, match=refusal):
        _logit_explanations(model)
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition

    with pytest.raises(BcosError, match=refusal):
        token_component_decomposition(model, TOKENS, target=3)
    _, cache = model.run_with_cache(TOKENS)
    if field == "output_logits_soft_cap":
        with pytest.raises(BcosError, match=r"soft-caps its logits \(0.5 \* tanh"):
            cache.logit_attrs(cache.decompose_resid(), tokens=3)
        feature = _feature_explanation(model)
        torch.testing.assert_close(feature.total, feature.explained, atol=1e-5, rtol=0)
    else:
        with pytest.raises(BcosError, match=refusal):
            _feature_explanation(model)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                  "Gemma2ForCausalLM"])
def test_explain_sae_feature_reads_a_bridges_gate_projection_input(name):
    """An SAE on a bridge's ``blocks.L.mlp.gate.hook_in`` (the input of a gated MLP's gate projection, the same vector
    as ``mlp.hook_in``): in explanation mode the gate branch runs without autograd (it is the dynamic weight), so the
    SAE's encode there had no graph and explain_sae_feature failed with "the explained value does not depend on the
    attribution point (no gradient path); the function ignores its input". The feature is linear in the tokens there as
    anywhere on the MLP's input: its pre-activation is sae-lens' own encode of the cached activation, and the
    contributions sum to it less its bias terms."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    bridge = _model("bridge", name)
    hook = "blocks.1.mlp.gate.hook_in"
    sae = random_standard_sae(bridge.cfg.d_model, hook)
    _, cache = bridge.run_with_cache(TOKENS)
    torch.testing.assert_close(cache[hook], cache["blocks.1.mlp.hook_in"], atol=0, rtol=0)
    explanation = explain_sae_feature(bridge, TOKENS, sae, 5)
    own = (sae.process_sae_in(cache[hook]) @ sae.W_enc + sae.b_enc)[:, -1, 5]
    torch.testing.assert_close(explanation.pre_activation, own.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(explanation.total + explanation.bias_terms, own.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
@pytest.mark.parametrize("options", [
    {"layer": 0, "incl_embeds": False},
    {"layer": 0, "mode": "attn", "incl_embeds": False, "pos_slice": -1},
    {"layer": 0, "mode": "mlp", "incl_embeds": False, "mlp_input": True, "apply_ln": True},
    {"layer": 0, "mode": "all", "incl_embeds": False, "pos_slice": [0, 3]},
])
def test_decompose_resid_with_no_component_before_the_layer_is_an_empty_stack(kind, options):
    """``decompose_resid(layer=0, incl_embeds=False)`` (no component lies before block 0 but the embeddings), and
    ``mode="mlp"`` with ``mlp_input=True`` there: TransformerLens stacked an empty list and failed with torch's "stack
    expects a non-empty TensorList". The residual stream there has no such components: an empty stack of the shape the
    others have, as ``stack_head_results(layer=0)`` / ``stack_neuron_results(layer=0)`` give, and no labels; it sums to
    zero, and the stack of layer 1 (its one attention / MLP output) to that output."""
    model = _model(kind)
    _, cache = model.run_with_cache(TOKENS)
    stack, labels = cache.decompose_resid(**options, return_labels=True)
    position_axes = cache.stack_head_results(layer=0, pos_slice=options.get("pos_slice")).shape[1:]
    assert tuple(stack.shape) == (0, *position_axes) and labels == []
    assert stack.dtype == cache["blocks.0.hook_resid_pre"].dtype and stack.device == cache["hook_embed"].device
    one = cache.decompose_resid(**{**options, "layer": 1, "apply_ln": False, "mlp_input": False})
    mode = options.get("mode", "all")
    wanted = sum(cache[f"blocks.0.hook_{part}_out"] for part in ("attn", "mlp") if mode in ("all", part))
    from transformer_lens.utilities import Slice

    torch.testing.assert_close(one.sum(0), Slice(options.get("pos_slice")).apply(wanted, dim=-2), atol=0, rtol=0)


_LAYER_CALLS = {
    "decompose_resid": lambda cache, layer: cache.decompose_resid(layer=layer),
    "accumulated_resid": lambda cache, layer: cache.accumulated_resid(layer=layer),
    "stack_head_results": lambda cache, layer: cache.stack_head_results(layer=layer),
    "stack_neuron_results": lambda cache, layer: cache.stack_neuron_results(layer=layer),
    "get_full_resid_decomposition": lambda cache, layer: cache.get_full_resid_decomposition(layer=layer),
    "apply_ln_to_stack": lambda cache, layer: cache.apply_ln_to_stack(cache.decompose_resid(), layer=layer),
}


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
@pytest.mark.parametrize("call", list(_LAYER_CALLS))
def test_a_layer_transformer_lens_does_not_read_as_a_block_index_is_refused(kind, call):
    """TransformerLens reads ``layer`` as a block index in [0, n_layers], with -1 and None for n_layers (the final
    residual stream); any other negative layer (-2, the Python way to say "the input of the last block") ran
    ``range(-2)``: decompose_resid gave the embeddings alone, stack_head_results / stack_neuron_results an empty stack,
    get_full_resid_decomposition the embeddings and biases, without a word (accumulated_resid failed with "stack
    expects a non-empty TensorList"); True was read as block 1, and a layer past n_layers or a float failed with a
    KeyError or an empty AssertionError. Refused naming ``layer`` and the range; the layers it reads keep their values
    (-1 and None are n_layers)."""
    model = _model(kind)
    _, cache = model.run_with_cache(TOKENS)
    run = _LAYER_CALLS[call]
    for layer in (-2, -3, 3, True, 2.0, "1"):
        with pytest.raises(BcosError, match=r"^layer: must be (an int|in \[0, 2\]).*-1 or None"):
            run(cache, layer)
    final = run(cache, 2)
    for same in (-1, None):
        torch.testing.assert_close(run(cache, same), final, atol=0, rtol=0)
    assert run(cache, 1).shape[1:] == final.shape[1:]


def _edit(model, kind: str, what: str) -> None:
    """Change one weight of ``model`` in place (as a head ablation or a fine-tuning step does), or its dtype."""
    with torch.no_grad():
        if what == "double":
            model.double()
        elif kind == "hooked":
            {"W_O": lambda: model.blocks[0].attn.W_O[0].mul_(0.1), "W_out": lambda: model.blocks[0].mlp.W_out[:10].mul_(
                0.1), "W_U": lambda: model.unembed.W_U.mul_(0.5)}[what]()
        else:
            {"W_O": lambda: model.blocks[0].attn.o.original_component.weight[:, :8].mul_(0.1),
             "W_out": lambda: model.blocks[0].mlp.out.original_component.weight[:, :10].mul_(0.1),
             "W_U": lambda: model.unembed.original_component.weight.mul_(0.5)}[what]()


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
@pytest.mark.parametrize("what, call", [
    ("W_O", lambda cache: cache.stack_head_results(layer=1)),
    ("W_out", lambda cache: cache.stack_neuron_results(layer=1)),
    ("W_U", lambda cache: cache.logit_attrs(cache.decompose_resid(), tokens=3)),
    ("W_O", lambda cache: cache.get_full_resid_decomposition()),
    ("double", lambda cache: cache.stack_head_results(layer=1)),
])
def test_a_cache_whose_models_weights_changed_since_its_run_is_refused(kind, what, call):
    """A cache holds the activations of one run, and TransformerLens combines them with the model's weights as they
    are at the call: after a weight was changed in place (a head's W_O scaled, as an ablation; an optimiser step) the
    per-head results no longer summed to the cached attention output (0.73 off on a tiny B-cos GPT-2), the per-neuron
    ones to the MLP output (0.16 off) and logit_attrs to the run's logits (0.12 off), without a word; after
    ``.double()`` the head results failed with "expected scalar type Double but found Float". Refused naming the
    changed weights; a cache of a run after the change decomposes as before."""
    model = _model(kind, "GPT2LMHeadModel" if kind == "hooked" else "LlamaForCausalLM")
    _, cache = model.run_with_cache(TOKENS)
    _edit(model, kind, what)
    with pytest.raises(BcosError, match=r"^cache: .*the model's weights changed since the run that filled it \(.+\)"):
        call(cache)
    logits, fresh = model.run_with_cache(TOKENS.clone())
    call(fresh)
    torch.testing.assert_close(fresh.stack_head_results(layer=1).sum(0), fresh["blocks.0.hook_attn_out"],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(fresh.logit_attrs(fresh.decompose_resid(), tokens=3).sum(0), logits[..., 3],
                               atol=1e-5, rtol=0)


def test_effective_weight_of_a_cache_whose_models_weights_changed_is_refused():
    """``effective_weight`` combines a cache's B-cos scales with the weights as they are now: after an edit it gave a
    weight the run never applied (x @ it did not reproduce the cached projection), silently."""
    from bcos_plugins.adapters.transformer_lens import effective_weight

    model = _model("hooked")
    _, cache = model.run_with_cache(TOKENS)
    effective_weight(cache, 0, "W_O")
    _edit(model, "hooked", "W_O")
    with pytest.raises(BcosError, match=r"^cache: .*blocks\.0\.attn\.W_O"):
        effective_weight(cache, 0, "W_O")


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
@pytest.mark.parametrize("tokens", [TOKENS[:1], torch.tensor([[5, 6], [7, 8]])], ids=["batch1", "batch2_pos2"])
def test_a_norm_scale_sliced_otherwise_than_the_stack_is_refused(kind, tokens):
    """``apply_ln_to_stack`` (and so ``logit_attrs``) divides the stack by the cached norm scale sliced by ``pos_slice``,
    which TransformerLens assumes the stack was sliced by too. A full stack with ``logit_attrs(..., pos_slice=-1)``
    divided every position by the last one's scale on a batch of one (same shape as the right answer, other values)
    and paired a 2 x 2 batch's rows with its positions; a stack sliced at -1 with no ``pos_slice`` gave a
    (components, pos) table of each component over every position's scale; without a word. Refused naming
    ``pos_slice`` and both shapes; the same slice on both gives the logits."""
    model = _model(kind)
    logits, cache = model.run_with_cache(tokens)
    full, last = cache.decompose_resid(), cache.decompose_resid(pos_slice=-1)
    with pytest.raises(BcosError, match=r"^pos_slice: .*cached norm scale.*\(.*\).*the residual stack.*\(.*\)"):
        cache.logit_attrs(full, tokens=3, pos_slice=-1)
    if tokens.shape[0] == 1:
        with pytest.raises(BcosError, match=r"^pos_slice: "):
            cache.logit_attrs(last, tokens=3)
    torch.testing.assert_close(cache.logit_attrs(last, tokens=3, pos_slice=-1).sum(0), logits[:, -1, 3],
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(cache.logit_attrs(full, tokens=3).sum(0), logits[..., 3], atol=1e-6, rtol=0)
    # a stack without its batch dimension on a batch of one (has_batch_dim=False) lines up with the scale as before
    if tokens.shape[0] == 1:
        torch.testing.assert_close(cache.logit_attrs(full[:, 0], tokens=3, has_batch_dim=False).sum(0),
                                   logits[0, :, 3], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_get_neuron_results_reads_a_negative_layer_as_transformer_lens_does(kind):
    """TransformerLens' ``get_neuron_results(layer)`` reads ``layer`` as Python does (its cache and ``model.blocks``
    both take -1 for the last block), but the exact per-neuron results looked up ``blocks.-1.mlp.hook_bcos_scale_out``
    and refused, saying the scale was left out of the cache (a names_filter) when it was there (a bridge said its
    cache lacked hook_mlp_out); a layer past the blocks failed with a KeyError or an IndexError. Negative layers are
    read from the end, others refused naming ``layer``; the results sum to the block's MLP output."""
    model = _model(kind)
    _, cache = model.run_with_cache(TOKENS)
    for layer in (-1, -2):
        torch.testing.assert_close(cache.get_neuron_results(layer), cache.get_neuron_results(layer % 2), atol=0, rtol=0)
        torch.testing.assert_close(cache.get_neuron_results(layer).sum(-2), cache[f"blocks.{layer % 2}.hook_mlp_out"],
                                   atol=1e-5, rtol=0)
    for layer in (2, -3, True, 1.0):
        with pytest.raises(BcosError, match=r"^layer: must be (an int|in \[-2, 1\])"):
            cache.get_neuron_results(layer)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_stack_activation_takes_the_layers_the_decompositions_take(kind):
    """``stack_activation(name, layer=k)`` stacks the activation of the blocks before ``k`` (-1: all): ``layer=0``
    stacked an empty list and a negative layer other than -1 ran ``range(-2)``, both failing with "stack expects a
    non-empty TensorList". ``layer=0`` is an empty stack, and a layer TransformerLens does not read is refused naming
    it, as for the decompositions."""
    model = _model(kind)
    _, cache = model.run_with_cache(TOKENS)
    empty = cache.stack_activation("resid_post", layer=0)
    assert tuple(empty.shape) == (0, *cache["blocks.0.hook_resid_post"].shape)
    torch.testing.assert_close(cache.stack_activation("resid_post", layer=1)[0], cache["blocks.0.hook_resid_post"],
                               atol=0, rtol=0)
    with pytest.raises(BcosError, match=r"^layer: must be in \[0, 2\]"):
        cache.stack_activation("resid_post", layer=-2)


def test_effective_weight_names_a_cache_it_cannot_read():
    """``effective_weight`` reads a HookedTransformer's cache (its blocks' W_Q ... W_out and B-cos scales): a bridge's
    cache failed with "'PositionEmbeddingsAttentionBridge' object has no attribute 'cfg'", and the plain dict of
    ``run_with_cache(..., return_cache_object=False)`` with "'dict' object has no attribute 'model'". Refused naming
    ``cache`` and the fix; a HookedTransformer's cache reproduces the cached projection."""
    from bcos_plugins.adapters.transformer_lens import effective_weight

    _, bridge_cache = _model("bridge", "LlamaForCausalLM").run_with_cache(TOKENS)
    with pytest.raises(BcosError, match=r"^cache: .*TransformerBridge.*hooked_transformer_from_hf"):
        effective_weight(bridge_cache, 0, "W_O")
    model = _model("hooked", "LlamaForCausalLM")
    _, cache_dict = model.run_with_cache(TOKENS, return_cache_object=False)
    with pytest.raises(BcosError, match=r"^cache: .*dict.*BcosActivationCache\(cache_dict, model\)"):
        effective_weight(cache_dict, 0, "W_O")
    _, cache = model.run_with_cache(TOKENS)
    produced = torch.einsum("bphd,bphdm->bpm", cache["blocks.1.attn.hook_z"], effective_weight(cache, 1, "W_O"))
    torch.testing.assert_close(produced, cache["blocks.1.hook_attn_out"], atol=1e-5, rtol=0)
