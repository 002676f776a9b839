"""Bilinear layer maths against brute force: interaction matrices, eigendecomposition, HOSVD, truncation, masks."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.bilinear import (
    BilinearMLP,
    BilinearWeights,
    adversarial_masks,
    augment_input,
    bilinear_tensor,
    bilinear_weights,
    effective_rank,
    eigendecompose,
    eigenvector_activations,
    hosvd,
    interaction_matrix,
    interaction_spectra,
    l1_l2_sparsity,
    pseudo_inverse_masks,
    top_eigen_indices,
    truncated_outputs,
    truncation_curve,
)
from bcos_plugins.nn import explanation_mode

D_IN, D_HIDDEN, D_OUT = 6, 10, 5


def random_weights(seed=0, d_in=D_IN, d_hidden=D_HIDDEN, d_out=D_OUT, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return BilinearWeights(*(torch.randn(*shape, generator=g, dtype=dtype)
                             for shape in ((d_hidden, d_in), (d_hidden, d_in), (d_out, d_hidden))))


def brute_force_tensor(w: BilinearWeights) -> torch.Tensor:
    """B[o, i, j] = sum_a P[o, a] (W[a, i] V[a, j] + W[a, j] V[a, i]) / 2, by explicit loops over units."""
    tensor = torch.zeros(w.d_out, w.d_in, w.d_in, dtype=w.W.dtype)
    for a in range(w.d_hidden):
        outer = torch.outer(w.W[a], w.V[a])
        tensor += w.P[:, a, None, None] * (0.5 * (outer + outer.T))
    return tensor


def test_interaction_matrix_equals_brute_force_contraction_single_and_batched():
    w = random_weights()
    brute = brute_force_tensor(w)
    g = torch.Generator().manual_seed(1)
    u = torch.randn(D_OUT, generator=g, dtype=torch.float64)
    us = torch.randn(7, D_OUT, generator=g, dtype=torch.float64)
    torch.testing.assert_close(interaction_matrix(w, u), torch.einsum("o,oij->ij", u, brute))
    for chunk in (1, 3, 8):
        torch.testing.assert_close(interaction_matrix(w, us, chunk_size=chunk), torch.einsum("ko,oij->kij", us, brute))
    torch.testing.assert_close(bilinear_tensor(w), brute)
    q = interaction_matrix(w, us)
    torch.testing.assert_close(q, q.mT)


def test_quadratic_form_gives_the_layer_output():
    w = random_weights(seed=2)
    x = torch.randn(4, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    us = torch.eye(D_OUT, dtype=torch.float64)
    q = interaction_matrix(w, us)
    torch.testing.assert_close(torch.einsum("bi,oij,bj->bo", x, q, x), w.forward(x))


def test_eigendecomposition_sorted_and_quadratic_form_identity():
    w = random_weights(seed=4)
    x = torch.randn(5, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    u = torch.randn(3, D_OUT, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    eig = eigendecompose(w, u)
    assert (eig.eigenvalues.diff(dim=-1) >= 0).all(), "eigenvalues must be ascending (last = most positive)"
    # u . out = sum_i lambda_i (v_i . x)^2
    torch.testing.assert_close(eigenvector_activations(eig, x).sum(-1), w.forward(x) @ u.T)
    # eigenvectors orthonormal and reconstruct Q
    q = interaction_matrix(w, u)
    torch.testing.assert_close(eig.eigenvectors @ torch.diag_embed(eig.eigenvalues) @ eig.eigenvectors.mT, q)
    torch.testing.assert_close(interaction_spectra(w, u, chunk_size=2), eig.eigenvalues)


def test_hosvd_reconstructs_tensor_and_matches_svd_of_unfolding():
    w = random_weights(seed=7, d_out=8)
    brute = brute_force_tensor(w)
    decomposition = hosvd(w)
    torch.testing.assert_close(decomposition.reconstruct(), brute)
    reference = torch.linalg.svdvals(brute.reshape(w.d_out, -1))
    torch.testing.assert_close(decomposition.singular_values, reference[: decomposition.singular_values.numel()])
    q = decomposition.interaction_matrices
    torch.testing.assert_close(q, q.mT)
    torch.testing.assert_close(q.flatten(1).norm(dim=1), torch.ones(q.shape[0], dtype=q.dtype))
    # rank-2 truncation = best rank-2 approximation of the unfolding (Eckart-Young)
    top2 = hosvd(w, rank=2).reconstruct().reshape(w.d_out, -1)
    u_, s_, vh_ = torch.linalg.svd(brute.reshape(w.d_out, -1), full_matrices=False)
    torch.testing.assert_close(top2, u_[:, :2] @ torch.diag(s_[:2]) @ vh_[:2])


def test_biases_via_augmented_input_are_exact():
    torch.manual_seed(0)
    layer = BilinearMLP(D_IN, D_HIDDEN, D_OUT, bias=True).double()
    x = torch.randn(4, D_IN, dtype=torch.float64)
    weights = bilinear_weights(layer)
    assert weights.has_bias
    augmented = weights.augmented()
    assert augmented.d_in == D_IN + 1 and augmented.d_hidden == D_HIDDEN + 1 and not augmented.has_bias
    torch.testing.assert_close(augmented.forward(augment_input(x)), layer(x))
    eig = eigendecompose(augmented, torch.eye(D_OUT, dtype=torch.float64))
    torch.testing.assert_close(eigenvector_activations(eig, augment_input(x)).sum(-1), layer(x).detach())
    with pytest.raises(ValueError, match="augmented"):
        interaction_matrix(weights, torch.ones(D_OUT, dtype=torch.float64))


def test_hidden_and_output_biases_fold_into_augmented_layer():
    w = random_weights(seed=8)
    g = torch.Generator().manual_seed(9)
    biased = BilinearWeights(w.W, w.V, w.P, w_bias=torch.randn(D_HIDDEN, generator=g, dtype=torch.float64),
                             v_bias=torch.randn(D_HIDDEN, generator=g, dtype=torch.float64),
                             hidden_bias=torch.randn(D_HIDDEN, generator=g, dtype=torch.float64),
                             out_bias=torch.randn(D_OUT, generator=g, dtype=torch.float64))
    x = torch.randn(3, D_IN, generator=g, dtype=torch.float64)
    torch.testing.assert_close(biased.augmented().forward(augment_input(x)), biased.forward(x))


def test_module_explanation_mode_routes_one_branch_as_constant():
    torch.manual_seed(1)
    layer = BilinearMLP(D_IN, D_HIDDEN, D_OUT).double()
    x = torch.randn(3, D_IN, dtype=torch.float64, requires_grad=True)
    y = layer(x)[:, 2].sum()
    plain = (x * torch.autograd.grad(y, x)[0]).sum()
    torch.testing.assert_close(plain, 2 * y)  # homogeneous of degree 2
    with explanation_mode(layer):
        y_explained = layer(x)[:, 2].sum()
        contributions = x * torch.autograd.grad(y_explained, x)[0]
    torch.testing.assert_close(y_explained, y)
    torch.testing.assert_close(contributions.sum(), y)  # completeness


def test_module_with_biases_completeness_misses_exactly_the_bias_share():
    torch.manual_seed(2)
    layer = BilinearMLP(D_IN, D_HIDDEN, D_OUT, bias=True).double()
    x = torch.randn(2, D_IN, dtype=torch.float64, requires_grad=True)
    with explanation_mode(layer):
        out = layer(x)
        contributions = x * torch.autograd.grad(out[:, 0].sum(), x)[0]
    bias_share = (layer.W(x) * layer.V.bias) @ layer.P.weight.T + layer.P.bias
    torch.testing.assert_close(contributions.sum(-1) + bias_share[:, 0], out[:, 0])


def test_weight_accessors_plain_tensors_and_errors():
    w = random_weights(seed=3)
    from_tuple = bilinear_weights((w.W, w.V, w.P))
    assert from_tuple.d_in == D_IN and from_tuple.d_hidden == D_HIDDEN and from_tuple.d_out == D_OUT
    with pytest.raises(ValueError, match="transpose"):
        bilinear_weights((w.W, w.V, w.P.T))
    with pytest.raises(ValueError, match=rf"^V: has shape \({D_HIDDEN}, {D_IN - 1}\) but W has \({D_HIDDEN}, {D_IN}\)"):
        bilinear_weights((w.W, w.V[:, :-1], w.P))
    with pytest.raises(TypeError, match="cannot read bilinear weights"):
        bilinear_weights(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="d_out=5"):
        interaction_matrix(w, torch.ones(D_OUT + 1, dtype=torch.float64))


def test_transformer_lens_gated_mlp_mapping_matches_its_forward():
    from bcos_plugins.adapters.transformer_lens import bilinear_config
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    model = HookedTransformer(bilinear_config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=20, n_ctx=8))
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        mlp.b_in.normal_()
        mlp.b_out.normal_()
    weights = bilinear_weights(mlp)
    assert (weights.d_in, weights.d_hidden, weights.d_out) == (8, 12, 8)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(weights.forward(x), mlp(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.augmented().forward(augment_input(x)), mlp(x), rtol=1e-5, atol=1e-5)
    # the gate branch (hook_pre) is W, the linear branch (hook_pre_linear) is V
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    resid = cache["blocks.0.ln2.hook_normalized"]
    torch.testing.assert_close(cache["blocks.0.mlp.hook_pre"], resid @ weights.W.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_pre_linear"], resid @ weights.V.T, rtol=1e-5, atol=1e-5)

    silu = HookedTransformer(HookedTransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=12, d_vocab=20,
                                                     n_ctx=8, act_fn="silu", gated_mlp=True))
    with pytest.raises(ValueError, match="not bilinear"):
        bilinear_weights(silu.blocks[0].mlp)


def test_transformers_gated_mlp_with_identity_activation():
    import transformers as T

    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=8, intermediate_size=12, hidden_act="linear", num_hidden_layers=1,
                           num_attention_heads=2, vocab_size=20)
    mlp = T.LlamaForCausalLM(config).model.layers[0].mlp
    x = torch.randn(3, 8)
    torch.testing.assert_close(bilinear_weights(mlp).forward(x), mlp(x))
    config_silu = T.LlamaConfig(hidden_size=8, intermediate_size=12, hidden_act="silu", num_hidden_layers=1,
                                num_attention_heads=2, vocab_size=20)
    with pytest.raises(ValueError, match="SwishBetaToBilinear"):
        bilinear_weights(T.LlamaForCausalLM(config_silu).model.layers[0].mlp)


def test_truncation_at_full_rank_is_exact_and_low_rank_matches_eigen_truncation():
    w = random_weights(seed=10)
    x = torch.randn(20, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    us = torch.eye(D_OUT, dtype=torch.float64)
    eig = eigendecompose(w, us)
    torch.testing.assert_close(truncated_outputs(eig, x, D_IN), w.forward(x))
    keep = top_eigen_indices(eig.eigenvalues, 2)
    for o in range(D_OUT):
        v = eig.eigenvectors[o][:, keep[o]]
        low_rank = v @ torch.diag(eig.eigenvalues[o][keep[o]]) @ v.T
        torch.testing.assert_close(truncated_outputs(eig, x, 2)[:, o], torch.einsum("bi,ij,bj->b", x, low_rank, x))
    labels = w.forward(x).argmax(-1)
    curve = truncation_curve(w, x, labels, ks=[1, D_IN])
    assert curve.full_accuracy == 1.0 and curve.accuracy[-1] == 1.0
    with pytest.raises(ValueError, match="k="):
        truncated_outputs(eig, x, D_IN + 1)


def test_l1_l2_sparsity_and_effective_rank():
    torch.testing.assert_close(effective_rank(torch.tensor([0.0, 0.0, 3.0])), torch.tensor(1.0))
    torch.testing.assert_close(effective_rank(torch.tensor([-1.0, 1.0, 1.0, -1.0])), torch.tensor(4.0))
    torch.testing.assert_close(l1_l2_sparsity(torch.zeros(3)), torch.tensor(0.0))
    w = random_weights(seed=12)
    u = torch.randn(D_OUT, dtype=torch.float64)
    assert 1.0 <= effective_rank(eigendecompose(w, u).eigenvalues).item() <= D_IN


def test_adversarial_masks_are_biorthogonal_keys():
    w = random_weights(seed=13, d_in=12, d_hidden=16, d_out=4)
    eig = eigendecompose(w, torch.eye(4, dtype=torch.float64))
    reference = torch.randn(12, dtype=torch.float64)
    result = adversarial_masks(eig, per_direction=2, reference=reference)
    assert result.masks.shape == (4, 2, 12)
    vectors = result.eigenvectors.reshape(8, 12)
    products = result.masks.reshape(8, 12) @ vectors.T
    torch.testing.assert_close(products.abs(), torch.eye(8, dtype=torch.float64))
    # orientation: adding the mask increases |v_i . reference|
    assert (torch.sign(torch.diagonal(products)) == torch.sign(vectors @ reference)).all()
    assert (result.eigenvalues > 0).all()
    with pytest.raises(ValueError, match="cannot be separated"):
        pseudo_inverse_masks(torch.randn(13, 12))
