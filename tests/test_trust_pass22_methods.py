"""Trust pass 22, methods (helper-143): bilinear analyses, the Space head and rationale-guided attention, a second look.

Each test pins one fix: before it, the case gave a silently wrong answer or an unhelpful crash.
"""

import pytest
import torch
import transformers as T
from torch import nn

from bcos_plugins.bilinear import bilinear_weights, eigendecompose, eigenvector_activations
from bcos_plugins.errors import BcosValueError

_TINY_DECODER = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)


def _bilinear_qwen2_mlp() -> nn.Module:
    torch.manual_seed(0)
    return T.Qwen2ForCausalLM(T.Qwen2Config(hidden_act="linear", **_TINY_DECODER)).eval().model.layers[0].mlp


class _LoraLinear(nn.Module):
    """An adapter wrapper as peft's LoRA layers are: ``.weight`` / ``.bias`` are the base layer's, the forward adds a
    low-rank update."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.lora_B.weight)

    @property
    def weight(self):
        return self.base_layer.weight

    @property
    def bias(self):
        return self.base_layer.bias

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


class _ScaledLinear(nn.Linear):
    """A linear layer with a forward of its own (a quantised or scaled linear layer's pattern)."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("wrap", ["lora", "forward"])
def test_bilinear_weights_refuse_projections_whose_forward_is_not_their_weight(wrap):
    # the weights were read from .weight / .bias alone: an unmerged LoRA update or a projection's own forward was left
    # out, and every analysis described another function (the read weights' output off by the whole layer's)
    mlp = _bilinear_qwen2_mlp()
    if wrap == "lora":
        mlp.up_proj = _LoraLinear(mlp.up_proj)
    else:
        scaled = _ScaledLinear(16, 24, bias=False)
        scaled.load_state_dict(mlp.gate_proj.state_dict())
        mlp.gate_proj = scaled
    with pytest.raises(BcosValueError, match="^source: the weights read from Qwen2MLP .* do not compute its output"):
        bilinear_weights(mlp)
    with pytest.raises(BcosValueError, match="do not compute its output"):
        eigendecompose(mlp, torch.ones(16))


def test_bilinear_weights_probe_is_not_seen_by_the_layers_hooks():
    # the check runs the layer on a probe with its hooks held back: a hook recording activations records nothing, and
    # the weights describe the layer without its hooks (as they did before the check), whatever a hook does
    mlp = _bilinear_qwen2_mlp()
    recorded = []
    mlp.register_forward_hook(lambda module, inputs, output: recorded.append(output))
    mlp.gate_proj.register_forward_hook(lambda module, inputs, output: 2 * output)
    mlp.up_proj.register_forward_pre_hook(lambda module, inputs: recorded.append(inputs))
    weights = bilinear_weights(mlp)
    assert recorded == []
    assert torch.equal(weights.W, mlp.gate_proj.weight.detach())
    mlp(torch.ones(1, 16))  # the hooks are back in place
    assert len(recorded) == 2


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma2", "llama_bias"])
def test_bilinear_analyses_of_the_registry_families_gated_mlps_are_their_outputs(family):
    # what the check above must keep: a registry family's bilinear gated MLP (GQA attention beside it, Llama's
    # mlp_bias) is read as it computes, and the eigenvector activations sum to its outputs along u (float64 reference)
    torch.manual_seed(0)
    config = {"qwen2": lambda: T.Qwen2Config(hidden_act="linear", **_TINY_DECODER),
              "mistral": lambda: T.MistralConfig(hidden_act="linear", **_TINY_DECODER),
              "gemma2": lambda: T.Gemma2Config(hidden_activation="linear", hidden_act="linear", head_dim=4,
                                               **_TINY_DECODER),
              "llama_bias": lambda: T.LlamaConfig(hidden_act="linear", mlp_bias=True, **_TINY_DECODER)}[family]()
    mlp = T.AutoModelForCausalLM.from_config(config).eval().model.layers[0].mlp
    with torch.no_grad():
        for parameter in mlp.parameters():
            parameter.normal_()
    weights = bilinear_weights(mlp).to(torch.float64)
    layer, x, u = weights.augmented(), torch.randn(5, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = mlp.double()(x) @ u.T
    activations = eigenvector_activations(eigendecompose(layer, u), torch.cat([x, torch.ones(5, 1).double()], 1))
    torch.testing.assert_close(activations.sum(-1), expected, rtol=1e-9, atol=1e-9)


def test_replace_guidance_hook_keeps_a_bridges_masked_keys_masked():
    # a TransformerBridge's hook_attn_scores carries transformers' additive mask (the dtype's lowest value, not -inf),
    # which isfinite read as open: "replace" sent query 0 all its attention to the future key on the rationale
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf
    from conftest import VOCAB

    from bcos_plugins.guided import guidance_hooks

    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                        bos_token_id=2, eos_token_id=2)).eval()
    bridge = transformer_bridge_from_hf(hf)
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    gold = torch.zeros(1, 6)
    gold[0, [2, 5]] = 1.0
    patterns = {}

    def record(pattern, hook):
        patterns["last"] = pattern.detach().clone()

    name, hook = guidance_hooks(2, gold, "replace", 1.0, last_layers=1)[0]
    bridge.run_with_hooks(tokens, fwd_hooks=[(name, hook), ("blocks.1.attn.hook_pattern", record)])
    pattern = patterns["last"][0]  # (head, query, key)
    # Eq. 5 by hand: each query's attention is M / sum M over the keys it may see; a query that sees no rationale key
    # keeps its own attention, which stays causal
    assert torch.equal(pattern.triu(1), torch.zeros_like(pattern))
    torch.testing.assert_close(pattern[:, 2:5, 2], torch.ones(4, 3))
    torch.testing.assert_close(pattern[:, 5, [2, 5]], torch.full((4, 2), 0.5))


@pytest.mark.parametrize("objective", ["kl", "rank"])
@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_attention_supervision_loss_of_float64_attentions_is_the_float64_hand_value(objective):
    # the scores were cast with .float(): a float64 model's loss came back in float32, 7 digits of the hand value
    from bcos_plugins.guided import attention_supervision_loss

    generator = torch.Generator().manual_seed(0)
    attentions = [torch.softmax(torch.randn(2, 3, 5, 5, generator=generator, dtype=torch.float64), -1)]
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    scores = attentions[0][:, :, 0, :].mean(1)  # [CLS]'s attention, mean over heads
    if objective == "kl":
        target = gold / gold.sum(1, keepdim=True)
        per_row = [sum(t * (torch.log(t) - torch.log(s)) for t, s in zip(target[i], scores[i], strict=True) if t > 0)
                   for i in range(2)]
    else:  # relu(1 - (log a_g - log a_o)) over (rationale, other real token) pairs weighted gold_g * (1 - gold_o)
        per_row = []
        for i in range(2):
            # o != g: the soft token 3 (0.5) is no pair with itself (trust pass 23)
            pairs = [(gold[i, g] * (1 - gold[i, o]), torch.relu(1 - torch.log(scores[i, g] / scores[i, o])))
                     for g in range(5) for o in range(5) if attention_mask[i, o] and o != g]
            per_row.append(sum(w * h for w, h in pairs) / sum(w for w, _ in pairs))
    loss = attention_supervision_loss(attentions, gold, attention_mask, objective=objective)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, sum(per_row) / 2, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("texts", [(t for t in ["a b", "c"]), ["a b", None], ["a b", ["c", "d"]], {"a b", "c"}])
def test_predict_labels_names_texts_that_are_no_list_of_strings(texts):
    # a generator failed on len(), a None or a word list inside on "'NoneType' object has no attribute 'split'" in the
    # tokenizer, and a set on "'set' object is not subscriptable" (its order could not be matched to labels anyway)
    from test_space import _WordTokenizer, space_model

    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.space import predict_labels, zero_shot_evaluation

    model = space_model(num_labels=2)
    with pytest.raises(BcosTypeError, match="^texts: "):
        predict_labels(model, _WordTokenizer(), texts)
    assert predict_labels(model, _WordTokenizer(), []) == []
    with pytest.raises(BcosTypeError, match="^labels: is a set, which has no order"):
        zero_shot_evaluation(model, _WordTokenizer(), ["a b", "c"], {0, 1})


def test_a_guided_model_switched_to_another_attention_implementation_refuses_the_mask():
    # set_attn_implementation("sdpa") after guide_attention put the stock attention function back, which drops the
    # keyword: the guided layers kept their setting and training with rationale_mask ran unguided, without a word
    from bcos_plugins.errors import BcosRuntimeError
    from bcos_plugins.guided import guide_attention

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, attn_implementation="eager", num_labels=3, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    model = T.BertForSequenceClassification(config).train()
    ids, mask = torch.randint(5, 60, (2, 7), generator=torch.Generator().manual_seed(0)), torch.ones(2, 7).long()
    gold = torch.zeros(2, 7)
    gold[:, 2] = 1.0
    guide_attention(model, mode="add", strength=5.0, last_layers=1)
    model.set_attn_implementation("sdpa")
    with pytest.raises(BcosRuntimeError, match="^rationale_mask: the guided layers now use the attention implementation "
                       "'sdpa'"):
        model(ids, attention_mask=mask, rationale_mask=gold)
    guide_attention(model, mode="add", strength=5.0, last_layers=1)  # the fix the message names
    with torch.no_grad():
        guided = model(ids, attention_mask=mask, rationale_mask=gold).logits
        plain = model(ids, attention_mask=mask).logits
    assert (guided - plain).abs().max() > 1e-5


def test_intra_space_weight_from_paper_takes_numpy_integer_counts():
    # its own int check refused np.int64(2), a count read from an array, as "is np.int64(2), not a positive int"
    import numpy as np

    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.space import intra_space_weight_from_paper

    assert intra_space_weight_from_paper(0.001, np.int64(2), np.int32(8)) == pytest.approx(0.016)
    assert type(intra_space_weight_from_paper(0.001, np.int64(2), 8)) is float
    with pytest.raises(BcosTypeError, match="^n_spaces: must be an int, got float 2.0"):
        intra_space_weight_from_paper(0.001, 2.0, 8)
    with pytest.raises(BcosValueError, match="^n_latent: must be >= 1, got 0"):
        intra_space_weight_from_paper(0.001, 2, 0)


def test_finalize_bilinear_halves_a_down_proj_shared_by_two_mlps_once():
    # the factor 1/2 was folded once per MLP: a down_proj shared by two layers was quartered, and the "outputs
    # unchanged" finalisation changed the model's logits
    from bcos_plugins.bilinear.swish_beta import finalize_bilinear, set_swish_beta

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                             num_attention_heads=4)).eval()
    model.model.layers[1].mlp.down_proj = model.model.layers[0].mlp.down_proj
    ids = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    set_swish_beta(model, 0.0)
    with torch.no_grad():
        annealed = model(ids).logits
        finalize_bilinear(model)
        torch.testing.assert_close(model(ids).logits, annealed)


def test_truncated_outputs_warn_where_the_top_k_splits_an_eigenspace():
    # Q(u) = I for W = V = I and for W = V = R (R orthogonal): one layer function, but eigh's basis of the eigenspace
    # differs, and the top-1 truncated output was 9 for one and another number for the other, without a word
    import warnings

    from bcos_plugins.bilinear import truncated_outputs

    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    rotation = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))[0]
    for W in (torch.eye(4), rotation):
        eig = eigendecompose((W, W, torch.ones(1, 4)), torch.ones(1, 1))
        with pytest.warns(UserWarning, match=r"with k=1 \(by='magnitude'\) the top k of direction\(s\) \[0\] is not "
                          "unique"):
            truncated_outputs(eig, x, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(truncated_outputs(eig, x, 4), torch.tensor([[30.0]]))  # the whole eigenspace
    generator = torch.Generator().manual_seed(1)
    W, V, P = (torch.randn(*shape, generator=generator) for shape in ((2, 5), (2, 5), (3, 2)))
    eig = eigendecompose((W, V, P), torch.eye(3))  # rank 4 of 5: one zero eigenvalue per direction, no tie that counts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(1, 6):
            truncated_outputs(eig, torch.randn(2, 5, generator=generator), k)
