"""``dynamic_linear_copy``: a conventional model with its non-linearities held constant, biases kept.

The copy must compute the stock model's outputs; in explanation mode it must be affine in the combined
embedding, so that the token contributions plus the biases' own contributions (each bias times the gradient
w.r.t. it, an independent computation) sum to the logit; and the user's model must stay as it was.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bcos_plugins import BcosTypeError, BcosValueError, bcosify, explain, explanation_mode
from bcos_plugins.attribution import capture_point
from bcos_plugins.convert import DYNAMIC_LINEAR_ARCHITECTURES, dynamic_linear_copy
from bcos_plugins.convert.dynamic_linear import AffineDetachableLayerNorm, DetachableTanh
from bcos_plugins.nn import DetachableActivation, has_dynamic_weights

SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32)


def _random_biases(model: torch.nn.Module) -> torch.nn.Module:
    # transformers initialises biases to 0 (LayerNorm beta too): non-zero ones make the bias share visible; and
    # weights of std 0.02 give near-uniform attention, whose gradient would be too small for a test to see
    # whether the attention probabilities are held constant: larger query/key weights make them peaked
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif any(k in name for k in ("query.weight", "key.weight", "q_lin.weight", "k_lin.weight")):
                p.normal_(0.0, 0.5)
    return model.eval()


def _bert_classifier(attn: str = "eager") -> T.BertForSequenceClassification:
    torch.manual_seed(0)
    return _random_biases(T.BertForSequenceClassification(T.BertConfig(**SIZES, num_labels=3,
                                                                       attn_implementation=attn)))


def _inputs():
    torch.manual_seed(2)
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_copy_computes_the_stock_logits_in_and_out_of_explanation_mode(attn):
    model = _bert_classifier(attn)
    ids, mask = _inputs()
    copy = dynamic_linear_copy(model)
    with torch.no_grad():
        stock = model(input_ids=ids, attention_mask=mask).logits
        plain = copy(input_ids=ids, attention_mask=mask).logits
        with explanation_mode(copy):
            explaining = copy(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(plain, stock, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(explaining, plain, rtol=0, atol=0)


def test_token_contributions_plus_the_bias_share_sum_to_the_logit():
    model = _bert_classifier()
    ids, mask = _inputs()
    copy = dynamic_linear_copy(model)
    exp = explain(copy, ids, mask, target=torch.tensor([0, 1, 2]))
    assert exp.attribution_point.startswith("combined embedding")
    torch.testing.assert_close(exp.explained, model(input_ids=ids, attention_mask=mask).logits[
        torch.arange(3), torch.tensor([0, 1, 2])].detach(), rtol=1e-5, atol=1e-5)
    # independent: with every dynamic weight constant the logit is linear in (embedding, biases) jointly, so
    # the embedding's and every bias's input x gradient together are complete
    biases = [p for name, p in copy.named_parameters() if name.endswith("bias")]
    with explanation_mode(copy), capture_point(copy.bert.embeddings.LayerNorm, "input") as leaves:
        logits = copy(input_ids=ids, attention_mask=mask).logits
    bias_share = torch.zeros(3)
    for row, target in enumerate([0, 1, 2]):
        grads = torch.autograd.grad(logits[row, target], [leaves[0], *biases], retain_graph=True,
                                    allow_unused=True)
        assert torch.equal(grads[0][torch.arange(3) != row], torch.zeros_like(grads[0][1:])), "rows interact"
        bias_share[row] = sum((b * g).sum() for b, g in zip(biases, grads[1:], strict=True) if g is not None)
    torch.testing.assert_close(exp.total + bias_share, exp.explained, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(-exp.delta, bias_share, rtol=1e-4, atol=1e-5)
    # the biases carry a real share, so the explanation is not complete (and reports it)
    assert (exp.completeness_error > 1e-2).all()


def test_without_biases_the_copy_explains_completely():
    model = _bert_classifier()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    ids, mask = _inputs()
    exp = explain(dynamic_linear_copy(model), ids, mask)
    assert (exp.completeness_error < 1e-4).all()


def _bert_masked_lm() -> T.BertForMaskedLM:
    torch.manual_seed(0)
    return _random_biases(T.BertForMaskedLM(T.BertConfig(**SIZES, attn_implementation="eager")))


def test_masked_lm_copy_matches_the_stock_logits_and_its_tokens_plus_the_bias_share_sum_to_the_logit():
    # before: refused ("its forward has not been checked"); its head is dense -> GELU module -> LayerNorm ->
    # decoder tied to the word embeddings, every non-linearity a module the copy holds constant
    model = _bert_masked_lm()
    ids, mask = _inputs()
    copy = dynamic_linear_copy(model)
    head = copy.cls.predictions
    assert isinstance(head.transform.transform_act_fn, DetachableActivation)
    assert isinstance(head.transform.LayerNorm, AffineDetachableLayerNorm) and type(head.decoder) is torch.nn.Linear
    # the decoder stays tied to the copy's own word embeddings, and its vocabulary bias to the head's bias
    assert head.decoder.weight is copy.bert.embeddings.word_embeddings.weight and head.decoder.bias is head.bias
    assert head.decoder.weight is not model.cls.predictions.decoder.weight
    with torch.no_grad():
        stock = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(copy(input_ids=ids, attention_mask=mask).logits, stock, rtol=1e-5, atol=1e-5)
    rows, position, target = torch.arange(3), torch.tensor([2, 4, 0]), torch.tensor([7, 50, 99])
    exp = explain(copy, ids, mask, target=target, position=position)
    torch.testing.assert_close(exp.explained, stock[rows, position, target], rtol=1e-5, atol=1e-5)
    # independent: the embedding's and every bias's input x gradient together are complete (the decoder's
    # vocabulary bias counted once: named_parameters lists a tied parameter once)
    biases = [p for name, p in copy.named_parameters() if name.endswith("bias")]
    assert sum(name.startswith("cls.") for name, _ in copy.named_parameters() if name.endswith("bias")) == 3
    with explanation_mode(copy), capture_point(copy.bert.embeddings.LayerNorm, "input") as leaves:
        logits = copy(input_ids=ids, attention_mask=mask).logits
    bias_share = torch.zeros(3)
    for row in range(3):
        grads = torch.autograd.grad(logits[row, position[row], target[row]], [leaves[0], *biases],
                                    retain_graph=True, allow_unused=True)
        assert torch.equal(grads[0][rows != row], torch.zeros_like(grads[0][1:])), "rows interact"
        bias_share[row] = sum((b * g).sum() for b, g in zip(biases, grads[1:], strict=True) if g is not None)
    torch.testing.assert_close(exp.total + bias_share, exp.explained, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(-exp.delta, bias_share, rtol=1e-4, atol=1e-5)
    assert (exp.completeness_error > 1e-2).all()
    # without biases the token contributions alone sum to the logit
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    exact = explain(dynamic_linear_copy(model), ids, mask, target=target, position=position)
    assert (exact.completeness_error < 1e-4).all()
    torch.testing.assert_close(exact.total, exact.explained, rtol=1e-4, atol=1e-6)


def test_the_users_model_is_left_unmodified():
    model = _bert_classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    copy = dynamic_linear_copy(model)
    assert [type(m) for m in model.modules()] == classes and not has_dynamic_weights(model)
    assert not hasattr(model.config, "bcos") and model.config is not copy.config
    assert copy.state_dict().keys() == before.keys(), "a checkpoint of the copy loads into the stock class"
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(1.0)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items()), "parameters are shared"


@pytest.mark.parametrize("name", ["BertModel", "RobertaModel", "DistilBertModel"])
def test_base_models_match_and_decompose_a_hidden_unit(name):
    if name == "DistilBertModel":
        config = T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                    max_position_embeddings=32)
    else:
        config = getattr(T, name.replace("Model", "Config"))(**SIZES)
    torch.manual_seed(0)
    model = _random_biases(getattr(T, name)(config))
    ids, mask = _inputs()
    copy = dynamic_linear_copy(model)
    with torch.no_grad():
        torch.testing.assert_close(copy(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   rtol=1e-5, atol=1e-5)
    exp = explain(copy, ids, mask, target=3)
    assert torch.isfinite(exp.input_contributions).all() and (exp.completeness_error > 1e-3).any()


def test_refusals_name_the_argument_and_the_fix():
    with pytest.raises(BcosTypeError, match="model: expected a transformers model"):
        dynamic_linear_copy("bert")
    roberta = T.RobertaForSequenceClassification(T.RobertaConfig(**SIZES, num_labels=2))
    with pytest.raises(BcosTypeError, match="inline.*pass one of BertForMaskedLM, BertForSequenceClassification"):
        dynamic_linear_copy(roberta)
    bcos = bcosify(_bert_classifier(), b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match="is a B-cos model.*explain it with bcos_plugins.explain"):
        dynamic_linear_copy(bcos)
    model = _bert_classifier()
    model.bert.encoder.layer[0].intermediate.intermediate_act_fn = torch.nn.Softplus()
    with pytest.raises(BcosTypeError, match="intermediate_act_fn' .*Softplus.*cannot be held constant"):
        dynamic_linear_copy(model)
    assert isinstance(model.bert.embeddings.LayerNorm, torch.nn.LayerNorm)  # a refusal touches nothing
    assert set(DYNAMIC_LINEAR_ARCHITECTURES) >= {"BertForSequenceClassification", "BertModel"}


@pytest.mark.parametrize(("name", "reason"), [
    ("RobertaForSequenceClassification", r"its classifier applies tanh between dense and out_proj inline"),
    ("DistilBertForSequenceClassification", r"its forward applies ReLU to pre_classifier's output inline"),
    ("GPT2LMHeadModel", r"its query, key and value come from one fused projection, attn\.c_attn \(a Conv1D\), whose "
                        r"output cannot be held constant for the query and key alone"),
    ("LlamaForCausalLM", r"its gated MLP multiplies two input-dependent branches .* RMSNorm is no LayerNorm"),
    ("BertForTokenClassification", r"it is not in the architecture registry"),
])
def test_a_refused_class_is_refused_with_its_own_reason(name, reason):
    # before: every class was refused with "RoBERTa's and DistilBERT's classifiers apply tanh / ReLU inline"
    from conftest import tiny_model

    with pytest.raises(BcosTypeError, match=rf"^model: transformers\.models\.\w+\.modeling_\w+\.{name} is not "
                                            rf"supported by dynamic_linear_copy: {reason}.*\. pass one of "
                                            "BertForMaskedLM, BertForSequenceClassification, BertModel, "
                                            "DistilBertModel, RobertaModel"):
        dynamic_linear_copy(tiny_model(name))


def test_a_class_whose_forward_was_not_read_is_refused_by_default():
    from bcos_plugins.convert.architectures import ArchitectureSpec

    spec = ArchitectureSpec("encoder", "", {}, ("embeddings.LayerNorm", "input"))
    assert spec.dynamic_linear_refusal.startswith("its forward has not been checked for non-linearities applied "
                                                  "outside a module")


def test_tanh_gate_at_and_near_zero():
    x = torch.tensor([0.0, 1e-8, -1e-4, 9.99e-4, 1e-3, -0.5, 3.0, 40.0], dtype=torch.float64, requires_grad=True)
    tanh = DetachableTanh()
    torch.testing.assert_close(tanh(x), torch.tanh(x), rtol=1e-12, atol=1e-15)
    with explanation_mode(tanh):
        y = tanh(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(grad).all() and grad[0] == 1.0  # the gate's limit at 0
    torch.testing.assert_close(x.detach() * grad, torch.tanh(x.detach()), rtol=1e-12, atol=1e-15)
