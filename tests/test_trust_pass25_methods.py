"""Trust pass 25 over the methods beyond B-cos layers (helper-202): bilinear MLPs read from their weights, the Space
head, rationale-guided attention. Each test failed before its fix."""

import pytest
import torch
import transformers as T

from bcos_plugins.bilinear import (
    bilinear_weights,
    eigendecompose,
    eigenvector_activations,
    interaction_matrix,
)


def _fused_gated_mlp(family: str, hidden_act: str = "linear"):
    torch.manual_seed(0)
    config = T.AutoConfig.for_model(family, vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, bos_token_id=2, eos_token_id=2,
                                    pad_token_id=0, hidden_act=hidden_act)
    return T.AutoModelForCausalLM.from_config(config).double().model.layers[0].mlp


@pytest.mark.parametrize("family", ["phi3", "glm"])
def test_a_fused_gate_up_projection_with_the_identity_activation_is_read_as_its_two_halves(family):
    """Phi-3's and GLM's gated MLP hold gate and up in one gate_up_proj (gate, up = gate_up_proj(x).chunk(2)): with
    hidden_act='linear' it is the bilinear layer the refusal ("cannot read bilinear weights from Phi3MLP. Pass ... a
    transformers gated MLP with the identity activation") asked for. Checked against a float64 recomputation from the
    raw weights and against the layer's own forward (x^T Q x == the output)."""
    mlp = _fused_gated_mlp(family)
    weights = bilinear_weights(mlp)
    x = torch.randn(5, 16, dtype=torch.float64)
    gate, up = (x @ mlp.gate_up_proj.weight.detach().T).chunk(2, dim=-1)
    by_hand = (gate * up) @ mlp.down_proj.weight.detach().T
    torch.testing.assert_close(weights.forward(x), by_hand, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.W, mlp.gate_up_proj.weight.detach()[:24], rtol=0, atol=0)  # the gate half
    u = torch.randn(16, dtype=torch.float64)
    q = interaction_matrix(mlp, u)
    torch.testing.assert_close(torch.einsum("bi,ij,bj->b", x, q, x), mlp(x).detach() @ u, rtol=0, atol=1e-12)
    eig = eigendecompose(mlp, torch.eye(16, dtype=torch.float64))
    torch.testing.assert_close(eigenvector_activations(eig, x).sum(-1), mlp(x).detach(), rtol=0, atol=1e-12)


def test_a_fused_gated_mlp_with_a_nonlinear_gate_is_refused_naming_its_activation():
    with pytest.raises(ValueError, match=r"^source: this gated MLP \(Phi3MLP\) has activation .*not bilinear"):
        bilinear_weights(_fused_gated_mlp("phi3", "silu"))


@pytest.mark.parametrize("option", ["--last-layers", "--supervision-layers"])
def test_the_guided_esnli_example_refuses_more_layers_than_minilm_has_before_any_work(option, capsys):
    """MiniLM has 6 layers: --last-layers 7 / --supervision-layers 7 passed the command-line checks and failed only when
    guide_attention built the variant that reads them, after the variants before it had trained, naming last_layers
    (guide_attention's argument), not the option."""
    from examples import guided_esnli
    assert guided_esnli.parse_settings([option, "6"])  # every layer: fine
    with pytest.raises(SystemExit) as excinfo:
        guided_esnli.parse_settings([option, "7"])
    assert excinfo.value.code == 2 and f"{option}: MiniLM has 6 layers, got 7" in capsys.readouterr().err


def test_a_mixture_of_experts_block_is_refused_naming_what_to_analyse_instead():
    """A hidden_act='linear' Qwen2-MoE block was refused with the generic "cannot read bilinear weights ... Pass ... a
    transformers gated MLP with the identity activation", which it looks like to its user; its router makes it no
    single quadratic form: the refusal says so and names one expert (its shared expert is read as is)."""
    config = T.AutoConfig.for_model("qwen2_moe", vocab_size=50, hidden_size=16, intermediate_size=24,
                                    moe_intermediate_size=12, shared_expert_intermediate_size=20, num_experts=4,
                                    num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, hidden_act="linear", bos_token_id=2, eos_token_id=2)
    block = T.AutoModelForCausalLM.from_config(config).model.layers[0].mlp
    with pytest.raises(TypeError, match=r"^source: Qwen2MoeSparseMoeBlock is a mixture-of-experts block.*shared_expert"):
        bilinear_weights(block)
    x = torch.randn(3, 16)
    torch.testing.assert_close(bilinear_weights(block.shared_expert).forward(x), block.shared_expert(x).detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_supervision_loss_of_half_precision_attentions_is_the_loss_of_their_values(dtype):
    """A bf16 / fp16 training run's attentions: the head (and layer) mean was taken in half precision before
    attention_supervision_loss widened it, so the loss was up to 3.5% (bf16) off the KL of the very attention values
    it was given (the float64 recomputation below), without a word. Now averaged in float32."""
    from bcos_plugins.guided import attention_supervision_loss, attention_token_scores

    torch.manual_seed(0)
    attentions = tuple(torch.softmax(torch.randn(3, 4, 6, 6, dtype=torch.float64), -1).to(dtype) for _ in range(2))
    gold = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 1]], dtype=torch.float64)
    scores = torch.stack([a.double()[:, :, 0, :] for a in attentions]).mean((0, 2))
    target = gold / gold.sum(1, keepdim=True)
    by_hand = (target * (torch.log(target.clamp_min(1e-8)) - torch.log(scores))).sum(1).mean()
    loss = attention_supervision_loss(attentions, gold, layers=[0, 1])
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), by_hand, rtol=1e-5, atol=0)
    torch.testing.assert_close(attention_token_scores(attentions, layers=[0, 1]).double(), scores, rtol=1e-6, atol=0)
