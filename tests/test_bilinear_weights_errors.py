"""``bilinear_weights`` (and the ``BilinearWeights`` it builds) refuse bad sources with the package's error classes,
naming the argument, the problem and the fix; the classes subclass the built-ins, so ``except ValueError`` /
``except TypeError`` keep catching them (before: plain ValueError / TypeError, outside ``except BcosError``)."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.bilinear import BilinearMLP, BilinearWeights, bilinear_weights, interaction_matrix
from bcos_plugins.errors import BcosTypeError, BcosValueError

D_IN, D_HIDDEN, D_OUT = 6, 10, 5


def _tensors():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=g) for shape in ((D_HIDDEN, D_IN), (D_HIDDEN, D_IN), (D_OUT, D_HIDDEN)))


def test_a_source_it_cannot_read_is_a_bcos_type_error_naming_source_and_what_to_pass():
    W, V, P = _tensors()
    with pytest.raises(BcosTypeError, match=r"^source: cannot read bilinear weights from Linear\. Pass a "
                                            r"BilinearMLP, .*a tuple of three tensors \(W, V, P\)") as error:
        bilinear_weights(torch.nn.Linear(3, 3))
    assert isinstance(error.value, TypeError)
    with pytest.raises(BcosTypeError, match=r"^source: cannot read bilinear weights from a tuple of 2 \(Tensor, "
                                            r"Tensor\)\. Pass "):
        bilinear_weights((W, V))
    with pytest.raises(BcosTypeError, match=r"^source: cannot read bilinear weights from a list of 3 \(Tensor, "
                                            r"Tensor, ndarray\)"):
        bilinear_weights([W, V, P.numpy()])


def test_misshapen_tensors_are_bcos_value_errors_naming_the_weight_and_the_fix():
    W, V, P = _tensors()
    with pytest.raises(BcosValueError, match=r"^P: P \(10, 5\) must be \(d_out, d_hidden\) with d_hidden=10 "
                                             r"\(rows of W\)\. If you passed TransformerLens-layout matrices "
                                             r"\(d_in, d_hidden\), transpose them\.$") as error:
        bilinear_weights((W, V, P.T))
    assert isinstance(error.value, ValueError)
    with pytest.raises(BcosValueError, match=r"^V: has shape \(10, 5\) but W has \(10, 6\)\. Pass the two branches' "
                                             r"projections of one layer \(gate and up\), each \(d_hidden, d_in\)\.$"):
        bilinear_weights((W, V[:, :-1], P))
    with pytest.raises(BcosValueError, match=r"^W: a bilinear weight must be a 2-d tensor, got \(6,\)\. Pass W "
                                             r"and V shaped \(d_hidden, d_in\) and P shaped \(d_out, d_hidden\)"):
        bilinear_weights((W[0], V, P))
    with pytest.raises(BcosValueError, match=r"^out_bias: must have shape \(5,\), got \(10,\)\. Pass one bias per "
                                             r"output, or None\.$"):
        bilinear_weights(BilinearWeights(W, V, P, out_bias=torch.zeros(D_HIDDEN)))


def test_a_gated_mlp_with_a_non_linear_gate_is_a_bcos_value_error_naming_source_and_the_conversion():
    import transformers as T

    config = T.LlamaConfig(hidden_size=8, intermediate_size=12, hidden_act="silu", num_hidden_layers=1,
                           num_attention_heads=2, vocab_size=20)
    mlp = T.LlamaForCausalLM(config).model.layers[0].mlp
    with pytest.raises(BcosValueError, match=r"^source: this gated MLP \(LlamaMLP\) has activation .* so it is not "
                                             r"bilinear .*\. Convert it with bcos_plugins\.bilinear\."
                                             r"SwishBetaToBilinear") as error:
        bilinear_weights(mlp)
    assert isinstance(error.value, ValueError)


def test_a_transformer_lens_gated_mlp_with_a_non_linear_gate_is_a_bcos_value_error():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    silu = HookedTransformer(HookedTransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=12, d_vocab=20,
                                                     n_ctx=8, act_fn="silu", gated_mlp=True))
    with pytest.raises(BcosValueError, match=r"^source: this TransformerLens GatedMLP has act_fn='silu', so it is not "
                                             r"bilinear .*\. Build the model with bcos_plugins\.adapters\."
                                             r"transformer_lens\.bilinear_config"):
        bilinear_weights(silu.blocks[0].mlp)


def test_an_analysis_of_a_layer_with_biases_is_a_bcos_value_error_naming_the_exact_fix():
    layer = BilinearMLP(D_IN, D_HIDDEN, D_OUT, bias=True)
    with pytest.raises(BcosValueError, match=r"^source: interaction_matrix needs a bias-free bilinear layer, but this "
                                             r"one has biases\. Pass bilinear_weights\(layer\)\.augmented\(\)"):
        interaction_matrix(layer, torch.ones(D_OUT))
    assert interaction_matrix(bilinear_weights(layer).augmented(), torch.ones(D_OUT)).shape == (D_IN + 1, D_IN + 1)
