"""Self-Guided Attention in transformers models: the guidance really changes the forward pass, only in the
last L layers, only in training; lambda = 0 is the stock model; padding stays masked; Eq. 3-5 and log1p
match hand-computed attention."""

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_model
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosRuntimeError, BcosValueError
from bcos_plugins.guided import (
    GoldMaskAtEvaluationError,
    guide_attention,
    guide_scores,
    guided_layers,
    random_rationale_mask,
    register_guided_attention,
    unguide_attention,
)

CLASSES = ["BertForSequenceClassification", "RobertaForSequenceClassification",
           "DistilBertForSequenceClassification"]


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def make(class_name, implementation="eager", seed=0, sharpen=1.0):
    """A tiny model in train mode without dropout; ``sharpen`` scales the q/k/v weights so that attention
    scores are O(1) and the attention output is not negligible next to the residual stream."""
    model = no_dropout(tiny_model(class_name, seed))
    model.set_attn_implementation(implementation)
    if sharpen != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if any(s in name for s in ("query.weight", "key.weight", "value.weight", "q_lin.weight", "k_lin.weight",
                                             "v_lin.weight")):
                    p.mul_(sharpen)
    return model.train()


def batch_and_gold(class_name="Bert"):
    pad = 1 if class_name.startswith("Roberta") else 0
    ids, mask = padded_batch(pad_id=pad)
    gold = torch.zeros(ids.shape)
    gold[:, 2:5] = 1.0
    return ids, mask, gold * mask


# --- the formulas on hand-computed attention ---------------------------------------------------------------

def test_guide_scores_formulas_by_hand():
    s = torch.tensor([[[[1.0, -2.0, 0.5, 3.0]]]])
    m = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    lam = 2.0
    torch.testing.assert_close(guide_scores(s, m, "multiply", lam), torch.tensor([[[[1.0, -6.0, 1.5, 3.0]]]]))
    torch.testing.assert_close(guide_scores(s, m, "add", lam), torch.tensor([[[[1.0, 0.0, 2.5, 3.0]]]]))
    # log1p: softmax(S + log(1 + lam M)) == softmax(S) * (1 + lam M), renormalised (the reference's form)
    p = torch.softmax(s, -1) * (1 + lam * m)
    torch.testing.assert_close(torch.softmax(guide_scores(s, m, "log1p", lam), -1), p / p.sum(-1, keepdim=True))
    # replace: attention = M / sum M
    torch.testing.assert_close(torch.softmax(guide_scores(s, m, "replace", lam), -1),
                               torch.tensor([[[[0.0, 0.5, 0.5, 0.0]]]]))


def test_replace_respects_allowed_keys_and_keeps_rows_without_rationale():
    s = torch.randn(2, 1, 3, 4)
    m = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    allowed = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    out = torch.softmax(guide_scores(s, m, "replace", 1.0, allowed), -1)
    torch.testing.assert_close(out[0], torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(1, 3, 4))
    torch.testing.assert_close(guide_scores(s, m, "replace", 1.0, allowed)[1], s[1])  # no rationale: unchanged


@pytest.mark.parametrize("mode", ["multiply", "add", "log1p"])
def test_lambda_zero_is_bit_identical_on_scores(mode):
    s = torch.randn(2, 3, 5, 5)
    assert torch.equal(guide_scores(s, (torch.rand(2, 5) > 0.5).float(), mode, 0.0), s)


@pytest.mark.parametrize("mode", ["multiply", "add", "replace", "log1p"])
def test_guided_layer_attention_matches_hand_computation(mode):
    model = make("BertForSequenceClassification", sharpen=4.0)
    ids, mask, gold = batch_and_gold()
    lam = 1.5
    guide_attention(model, mode=mode, strength=lam, last_layers=1)
    out = model(input_ids=ids, attention_mask=mask, rationale_mask=gold, output_attentions=True,
                output_hidden_states=True)
    layer = model.bert.encoder.layer[-1].attention.self
    h = out.hidden_states[-2]
    b, n, _ = h.shape
    q = layer.query(h).view(b, n, 4, 8).transpose(1, 2)
    k = layer.key(h).view(b, n, 4, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / 8**0.5
    m = gold[:, None, None, :]
    pad = (1 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    if mode == "multiply":
        expected = torch.softmax(scores * (1 + lam * m) + pad, -1)
    elif mode == "add":
        expected = torch.softmax(scores + lam * m + pad, -1)
    elif mode == "log1p":
        p = torch.softmax(scores + pad, -1) * (1 + lam * m)
        expected = p / p.sum(-1, keepdim=True)
    else:
        expected = (m / m.sum(-1, keepdim=True)).expand(b, 4, n, n)
    torch.testing.assert_close(out.attentions[-1], expected, rtol=1e-5, atol=1e-6)


# --- the forward pass ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("class_name", CLASSES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_lambda_zero_gives_the_stock_logits(class_name, implementation):
    ids, mask, gold = batch_and_gold(class_name)
    stock = make(class_name, implementation)
    guided = make(class_name, implementation)
    names = guide_attention(guided, mode="multiply", strength=0.0, last_layers=2)
    assert len(names) == 2 and guided_layers(guided) == names
    a = guided(input_ids=ids, attention_mask=mask, rationale_mask=gold).logits
    b = stock(input_ids=ids, attention_mask=mask).logits
    if implementation == "eager":
        assert torch.equal(a, b)  # the guided eager path is the stock eager computation, bit for bit
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("class_name", CLASSES)
@pytest.mark.parametrize("mode", ["multiply", "add", "replace", "log1p"])
def test_guidance_changes_logits_only_from_the_guided_layers_on(class_name, mode):
    ids, mask, gold = batch_and_gold(class_name)
    model = make(class_name, sharpen=4.0)
    plain = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    guide_attention(model, mode=mode, strength=2.0, last_layers=1)
    guided = model(input_ids=ids, attention_mask=mask, rationale_mask=gold, output_hidden_states=True)
    # (the tiny random classifier maps a large change of the last hidden state to a small logit change)
    assert (guided.logits - plain.logits).abs().max() > 1e-6
    assert (guided.hidden_states[-1] - plain.hidden_states[-1]).abs().max() > 1e-2
    # hidden states before the last layer are untouched
    for before, after in zip(plain.hidden_states[:-1], guided.hidden_states[:-1], strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_stays_masked_under_guidance(implementation):
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", implementation, sharpen=4.0)
    guide_attention(model, mode="add", strength=3.0, last_layers=2)
    other_padding = ids.masked_fill(mask == 0, 7)  # change what sits at the padded positions
    a = model(input_ids=ids, attention_mask=mask, rationale_mask=gold).logits
    b = model(input_ids=other_padding, attention_mask=mask, rationale_mask=gold).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if implementation == "eager":
        att = model(input_ids=ids, attention_mask=mask, rationale_mask=gold, output_attentions=True).attentions
        for layer in att:
            assert layer[mask[:, None, None, :].expand_as(layer) == 0].abs().max() < 1e-12


def test_gradients_flow_through_guided_attention():
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    guide_attention(model, mode="multiply", strength=2.0, last_layers=1)
    loss = torch.nn.functional.cross_entropy(
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold).logits, torch.tensor([0, 1, 2]))
    loss.backward()
    grad = model.bert.encoder.layer[-1].attention.self.query.weight.grad
    assert grad is not None and grad.abs().sum() > 0


# --- masks are a training-time input only ---------------------------------------------------------------------

def test_gold_masks_are_rejected_at_evaluation_and_not_needed():
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    guide_attention(model, mode="multiply", strength=2.0, last_layers=2)
    model.eval()
    with pytest.raises(GoldMaskAtEvaluationError, match="training-time input only"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold)
    # evaluation of the guided model == the same weights without any guidance machinery
    stock = make("BertForSequenceClassification", sharpen=4.0).eval()
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits,
                       stock(input_ids=ids, attention_mask=mask).logits)


def test_training_step_without_mask_is_the_vanilla_model():
    ids, mask, _ = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    stock = make("BertForSequenceClassification", sharpen=4.0)
    guide_attention(model, mode="add", strength=5.0, last_layers=2)
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits,
                       stock(input_ids=ids, attention_mask=mask).logits)


def test_saved_guided_model_loads_as_a_plain_model(tmp_path):
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    guide_attention(model, mode="multiply", strength=2.0, last_layers=2)
    model.save_pretrained(tmp_path)
    loaded = T.BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert loaded.config._attn_implementation == "eager"
    assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits,
                       model.eval()(input_ids=ids, attention_mask=mask).logits)


def test_unguide_restores_the_implementation_and_guide_replaces_settings():
    model = make("BertForSequenceClassification", "sdpa")
    guide_attention(model, mode="add", strength=1.0, last_layers=2)
    assert model.config._attn_implementation == "bcos_guided_sdpa"
    guide_attention(model, mode="log1p", strength=1.0, last_layers=1)
    assert guided_layers(model) == ["bert.encoder.layer.1.attention.self"]
    unguide_attention(model)
    assert guided_layers(model) == [] and model.config._attn_implementation == "sdpa"


def test_bcosified_model_composes_with_guidance():
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification")
    bcosify(model, b=1.5, verbose=False)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    guide_attention(model, mode="add", strength=2.0, last_layers=1)
    guided = model(input_ids=ids, attention_mask=mask, rationale_mask=gold).logits
    assert (guided - model(input_ids=ids, attention_mask=mask).logits).abs().max() > 1e-4
    model.eval()
    e = explain(model, ids, mask)  # evaluation explains the unguided forward exactly
    assert e.completeness_error.max() < 1e-4
    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())


# --- registration and errors ----------------------------------------------------------------------------------

def test_registration_is_idempotent_and_never_clobbers():
    register_guided_attention()
    register_guided_attention()
    key = "bcos_guided_eager"
    ours_fn, ours_mask = AttentionInterface._global_mapping[key], AttentionMaskInterface._global_mapping[key]

    def foreign(*args, **kwargs):
        raise AssertionError("never called")

    AttentionInterface._global_mapping[key] = foreign
    try:
        with pytest.raises(RuntimeError, match="will not overwrite"):
            register_guided_attention()
        assert AttentionInterface._global_mapping[key] is foreign
    finally:
        AttentionInterface._global_mapping[key] = ours_fn
    assert AttentionMaskInterface._global_mapping[key] is ours_mask


def test_clear_errors():
    model = make("BertForSequenceClassification")
    with pytest.raises(ValueError, match="guidance mode must be one of"):
        guide_attention(model, mode="scale")
    with pytest.raises(ValueError, match="lambda must be >= 0"):
        guide_attention(model, strength=-1.0)
    with pytest.raises(ValueError, match=r"last_layers must be an int in \[1, 2\]"):
        guide_attention(model, last_layers=3)
    with pytest.raises(TypeError, match="BERT-family"):
        guide_attention(tiny_model("GPT2ForSequenceClassification"))
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="eager or sdpa"):
        guide_attention(model, last_layers=1)
    model.config._attn_implementation = "eager"
    guide_attention(model, mode="add", strength=1.0, last_layers=2)
    ids, mask, gold = batch_and_gold()
    with pytest.raises(ValueError, match="rationale_mask: must have shape"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold[:, :4])


# --- random control --------------------------------------------------------------------------------------------

def test_random_control_has_the_gold_sparsity_on_eligible_tokens():
    gold = torch.tensor([[0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]).float()
    eligible = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]]).bool()
    draws = [random_rationale_mask(gold, eligible, torch.Generator().manual_seed(s)) for s in range(30)]
    for r in draws:
        assert torch.equal(r.sum(1), gold.sum(1))
        assert not (r.bool() & ~eligible).any()
    assert len({tuple(r[0].tolist()) for r in draws}) > 3  # it really is random
    assert torch.equal(random_rationale_mask(gold, eligible, torch.Generator().manual_seed(5)), draws[5])
    with pytest.raises(ValueError, match="more positions than eligible"):
        random_rationale_mask(torch.ones(1, 3), torch.tensor([[1, 0, 0]]).bool())


# --- issue 15: unusual input gets a correct answer or a clear error -------------------------------------------

@pytest.mark.parametrize(("bad", "row"), [(float("nan"), 1), (-0.5, 2), (2.0, 0)])
def test_nan_negative_or_out_of_range_masks_are_refused_naming_the_row(bad, row):
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification")
    guide_attention(model, mode="multiply", strength=1.0, last_layers=2)
    gold[row, 3] = bad
    with pytest.raises(BcosValueError, match=rf"rationale_mask: must hold values in \[0, 1\].*row \[{row}\]"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold)
    with pytest.raises(BcosValueError, match=rf"rationale_mask: .*row \[{row}\]"):
        guide_scores(torch.zeros(3, 1, 9, 9), gold, "add", 1.0)


def test_gold_mask_error_is_a_package_runtime_error():
    assert issubclass(GoldMaskAtEvaluationError, BcosRuntimeError)
    assert issubclass(GoldMaskAtEvaluationError, RuntimeError)


def test_unguided_models_refuse_masks_instead_of_ignoring_them():
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", "sdpa")
    guide_attention(model, mode="add", strength=1.0, last_layers=2)
    unguide_attention(model)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(BcosRuntimeError, match="rationale_mask: was passed to a model with no guided layer"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold)
    with pytest.raises(GoldMaskAtEvaluationError, match="training-time input only"):
        model.eval()(input_ids=ids, attention_mask=mask, rationale_mask=gold)
    # a model that was never guided: unguide_attention makes it the guarded baseline of a comparison
    baseline = make("BertForSequenceClassification")
    before = baseline.eval()(input_ids=ids, attention_mask=mask).logits
    unguide_attention(baseline)
    with pytest.raises(GoldMaskAtEvaluationError):
        baseline(input_ids=ids, attention_mask=mask, rationale_mask=gold)
    assert torch.equal(baseline(input_ids=ids, attention_mask=mask).logits, before)


def test_wrong_mask_shapes_and_settings_are_named():
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification")
    guide_attention(model, mode="add", strength=1.0, last_layers=2)
    with pytest.raises(BcosValueError, match=r"rationale_mask: must have shape \(batch, key_pos\) = \(3, 9\)"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold[:2])
    with pytest.raises(BcosValueError, match="rationale_mask: must have shape"):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold[:, :, None])
    with pytest.raises(BcosValueError, match="strength: must be finite"):
        guide_attention(model, strength=float("nan"))
    with pytest.raises(BcosValueError, match="last_layers"):
        guide_attention(model, last_layers=True)
