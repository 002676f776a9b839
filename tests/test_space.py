"""Space Model head: padding-free pooling, exact context attribution, losses, save/load, Captum, zero-shot."""

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_config

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.space import (
    SpaceHead,
    SpaceModelConfig,
    SpaceModelForSequenceClassification,
    classification_scores,
    context_attribution,
    inter_space_loss,
    intra_space_loss,
    intra_space_weight_from_paper,
    read_rt_polarity,
    read_sst2_tsv,
    zero_shot_evaluation,
)


def space_model(family="bert", num_labels=3, n_latent=4, seed=0, **kwargs):
    torch.manual_seed(seed)
    encoder = T.AutoModel.from_config(tiny_config(family)).eval()
    return SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=num_labels, n_latent=n_latent,
                                                            **kwargs).eval()


def test_head_pooling_ignores_padding_content_and_length():
    torch.manual_seed(0)
    head = SpaceHead(d_model=8, n_spaces=2, n_latent=3)
    hidden = torch.randn(1, 5, 8)
    mask = torch.ones(1, 5, dtype=torch.long)
    logits, _ = head(hidden, mask)
    padded = torch.cat([hidden, 100 * torch.randn(1, 4, 8)], dim=1)  # garbage at the padding
    padded_mask = torch.cat([mask, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded_logits, _ = head(padded, padded_mask)
    torch.testing.assert_close(padded_logits, logits, rtol=0, atol=1e-6)
    # The reference code's plain mean over all positions would change with the padding:
    naive = head.classifier(head.concepts(padded).mean(1).flatten(1))
    assert (naive - logits).abs().max() > 1e-2


def test_head_maths_matches_the_formula():
    torch.manual_seed(1)
    head = SpaceHead(d_model=6, n_spaces=2, n_latent=3)
    hidden, mask = torch.randn(2, 4, 6), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    logits, concepts = head(hidden, mask)
    for b in range(2):
        n = int(mask[b].sum())
        z = [torch.tanh(hidden[b, :n] @ head.projections[k]) for k in range(2)]  # (n, latent) per space
        centroid = torch.cat([zk.mean(0) for zk in z])
        torch.testing.assert_close(logits[b], head.classifier(centroid))
        torch.testing.assert_close(concepts[b, :n, 1], z[1])


def test_model_logits_do_not_depend_on_padding():
    model = space_model()
    ids, mask = padded_batch(batch=3, length=9)
    logits = model(input_ids=ids, attention_mask=mask).logits
    for row in range(3):
        n = int(mask[row].sum())
        alone = model(input_ids=ids[row:row + 1, :n], attention_mask=mask[row:row + 1, :n]).logits
        torch.testing.assert_close(logits[row:row + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_context_attribution_sums_to_logit_minus_bias(family):
    model = space_model(family)
    ids, mask = padded_batch(side="right", pad_id=1 if family == "roberta" else 0)
    logits = model(input_ids=ids, attention_mask=mask).logits
    for target in (None, 0, 2):
        e = context_attribution(model, ids, mask, target=target)
        expected_target = logits.argmax(-1) if target is None else torch.full((3,), target)
        assert torch.equal(e.target, expected_target)
        full = logits[torch.arange(3), expected_target]
        bias = model.head.classifier.bias[expected_target]
        torch.testing.assert_close(e.contributions.sum(1), full - bias, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(e.full_logits, full)
        assert e.completeness_error.max() < 1e-5
        assert (e.contributions[mask == 0] == 0).all()  # padding gets exactly nothing
        torch.testing.assert_close(e.space_contributions.sum((2, 3)), e.contributions)


def test_contrastive_attribution_bias_is_the_difference():
    model = space_model()
    ids, mask = padded_batch()
    logits = model(input_ids=ids, attention_mask=mask).logits
    e = context_attribution(model, ids, mask, target=2, foil=0)
    torch.testing.assert_close(e.contributions.sum(1) + e.bias, logits[:, 2] - logits[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(e.bias, (model.head.classifier.bias[2] - model.head.classifier.bias[0]).expand(3))


def test_model_explain_method_and_errors():
    model = space_model()
    ids, mask = padded_batch()
    assert torch.equal(model.explain(ids, mask, target=1).contributions,
                       context_attribution(model, ids, mask, target=1).contributions)
    with pytest.raises(ValueError, match="target: ids must lie in"):
        context_attribution(model, ids, mask, target=3)
    with pytest.raises(TypeError, match="SpaceModelForSequenceClassification"):
        context_attribution(T.BertForSequenceClassification(tiny_config("bert")), ids, mask)


def test_captum_layer_gradient_x_activation_reproduces_the_attribution():
    """The adapter path: Captum's LayerGradientXActivation at head.concept_activation is exact."""
    from captum.attr import LayerGradientXActivation

    model = space_model()
    ids, mask = padded_batch()

    def forward(input_ids, attention_mask):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    attribution = LayerGradientXActivation(forward, model.head.concept_activation).attribute(
        ids, target=1, additional_forward_args=(mask,))
    ours = context_attribution(model, ids, mask, target=1)
    torch.testing.assert_close(attribution.sum((2, 3)), ours.contributions, rtol=1e-5, atol=1e-6)


def test_intra_space_loss_is_bounded_when_tanh_saturates():
    saturated = torch.ones(2, 5, 3, 4, requires_grad=True)  # every token at +1: variance 0
    loss = intra_space_loss(saturated, eps=0.01)
    assert loss.item() == pytest.approx(100.0)
    loss.backward()
    assert torch.isfinite(saturated.grad).all()
    one_token = torch.rand(2, 1, 3, 4)
    assert intra_space_loss(one_token, eps=0.01).item() == pytest.approx(100.0)
    spread = torch.tensor([1.0, -1.0]).repeat(1, 1, 1, 1).permute(0, 3, 1, 2)  # (1, 2, 1, 1), variance 1
    assert intra_space_loss(spread, eps=0.01).item() == pytest.approx(1 / 1.01)
    with pytest.raises(BcosValueError, match="eps: must be > 0"):
        intra_space_loss(saturated, eps=0.0)


def test_intra_space_loss_ignores_padding():
    z = torch.tensor([0.5, -0.5, 0.9, 0.9]).view(1, 4, 1, 1)
    mask = torch.tensor([[1, 1, 0, 0]])
    assert intra_space_loss(z, mask, eps=0.01).item() == pytest.approx(1 / (0.25 + 0.01))


def test_paper_intra_weight_reproduces_the_reference_sum_over_spaces_and_latents():
    torch.manual_seed(0)
    z = torch.tanh(torch.randn(3, 6, 2, 5))  # batch 3, 6 tokens, K = 2 spaces, L = 5 latents
    variance = z.var(dim=1, unbiased=False)  # (batch, K, L), no padding
    reference = (1.0 / (variance + 0.01)).sum(dim=(1, 2)).mean()  # the reference: sum over K and L
    weight = intra_space_weight_from_paper(0.001, n_spaces=2, n_latent=5)
    assert weight == pytest.approx(0.01)
    assert (weight * intra_space_loss(z, eps=0.01)).item() == pytest.approx(0.001 * reference.item(), rel=1e-5)
    with pytest.raises(BcosValueError, match="n_latent"):
        intra_space_weight_from_paper(0.001, n_spaces=2, n_latent=0)
    with pytest.raises(BcosValueError, match="paper_weight"):
        intra_space_weight_from_paper(-1.0, n_spaces=2, n_latent=5)


def test_inter_space_loss_hand_values():
    labels = torch.tensor([0, 1])
    ideal = torch.full((2, 3, 2, 4), -1.0)
    ideal[0, :, 0] = 1.0
    ideal[1, :, 1] = 1.0
    assert inter_space_loss(ideal, labels).item() == pytest.approx(0.0)
    assert inter_space_loss(torch.zeros(2, 3, 2, 4), labels).item() == pytest.approx(1.0)
    # Padding positions hold the worst values but are masked out.
    padded = torch.cat([ideal, -ideal], dim=1)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]] * 2)
    assert inter_space_loss(padded, labels, mask).item() == pytest.approx(0.0)
    with pytest.raises(BcosValueError, match=r"labels: ids must lie in \[0, 2\), got \[2\] at row \[1\]\. "
                                             r"Pass ids in \[0, 2\) \(there are 2 concept spaces"):
        inter_space_loss(ideal, torch.tensor([0, 2]))


def test_loss_is_the_weighted_sum_and_frozen_encoder_gets_no_gradient():
    model = space_model(inter_space_weight=0.3, intra_space_weight=0.01).train()
    ids, mask = padded_batch()
    labels = torch.tensor([0, 1, 2])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    t = out.loss_terms
    torch.testing.assert_close(out.loss, t["cross_entropy"] + 0.3 * t["inter_space"] + 0.01 * t["intra_space"])
    out.loss.backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert model.head.projections.grad is not None and model.head.projections.grad.abs().sum() > 0

    trainable = space_model(train_encoder=True).train()
    trainable(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert trainable.encoder.embeddings.word_embeddings.weight.grad is not None


def test_from_encoder_keeps_pretrained_weights_and_checks_type():
    torch.manual_seed(0)
    encoder = T.AutoModel.from_config(tiny_config("bert"))
    weights = {k: v.clone() for k, v in encoder.state_dict().items()}
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2)
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert model.config.encoder_config.model_type == "bert"
    with pytest.raises(TypeError, match="PreTrainedModel"):
        SpaceModelForSequenceClassification.from_encoder(torch.nn.Linear(2, 2), num_labels=2)


def test_save_and_load_round_trip(tmp_path):
    model = space_model(n_latent=5, inter_space_weight=0.2)
    ids, mask = padded_batch()
    model.save_pretrained(tmp_path)
    for loader in (SpaceModelForSequenceClassification, T.AutoModelForSequenceClassification):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert type(loaded) is SpaceModelForSequenceClassification
        assert loaded.config.n_latent == 5 and loaded.config.inter_space_weight == 0.2
        assert not any(p.requires_grad for p in loaded.encoder.parameters())  # train_encoder=False survives
        torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)
    config = SpaceModelConfig.from_pretrained(tmp_path)
    assert config.encoder_config.hidden_size == 32


def test_config_validation():
    with pytest.raises(BcosValueError, match="intra_space_eps: must be > 0"):
        SpaceModelConfig(encoder_config=tiny_config("bert"), intra_space_eps=0.0)
    with pytest.raises(BcosValueError, match="n_latent: must be >= 1"):
        SpaceModelConfig(encoder_config=tiny_config("bert"), n_latent=0)


def test_trainer_trains_the_head_only(tmp_path):
    model = space_model(num_labels=2).train()
    ids, mask = padded_batch(batch=3)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": torch.tensor(i % 2)} for i in range(3)] * 4
    encoder_before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    head_before = model.head.projections.detach().clone()
    args = T.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3,
                               learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True,
                               disable_tqdm=True, logging_strategy="no")
    T.Trainer(model=model, args=args, train_dataset=rows).train()
    assert not torch.equal(model.head.projections.detach(), head_before)
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(v, encoder_before[k]), k


class _WordTokenizer:
    """Enough of a tokenizer for predict_labels: ids = word lengths (a tiny vocabulary)."""

    def __call__(self, texts, padding, truncation, max_length, return_tensors):
        rows = [[min(len(w), 50) + 3 for w in t.split()][:max_length] for t in texts]
        length = max(map(len, rows))
        ids = torch.tensor([r + [0] * (length - len(r)) for r in rows])
        return T.BatchEncoding({"input_ids": ids, "attention_mask": (ids != 0).long()})


def test_zero_shot_evaluation_scores_predictions():
    model = space_model(num_labels=2)
    tok = _WordTokenizer()
    texts = ["a bb ccc", "dddd e", "ff gg hhh iiii", "j", "kk ll mm nn oo"]
    from bcos_plugins.space import predict_labels

    predicted = predict_labels(model, tok, texts, batch_size=2)
    assert zero_shot_evaluation(model, tok, texts, predicted, batch_size=2)["accuracy"] == 1.0
    flipped = zero_shot_evaluation(model, tok, texts, predicted, label_map={0: 1, 1: 0})
    assert flipped["accuracy"] == 0.0
    with pytest.raises(ValueError, match="5 texts but 4 labels"):
        zero_shot_evaluation(model, tok, texts, predicted[:4])


def test_predict_labels_refuses_left_padding_for_a_classifier_reading_the_first_column():
    """A BERT classifier classifies from the first column, a padding token's on a left-padded row: predict_labels
    refuses a tokenizer that pads on the left there (explain's one check); the Space model, which averages over real
    tokens, takes either side."""
    from conftest import tiny_model

    from bcos_plugins.space import predict_labels

    class LeftPadding(_WordTokenizer):
        def __call__(self, *args, **kwargs):
            enc = super().__call__(*args, **kwargs)
            shift = (enc["attention_mask"] == 0).sum(1)
            return T.BatchEncoding({k: torch.stack([row.roll(int(n)) for row, n in zip(v, shift, strict=True)])
                                    for k, v in enc.items()})

    texts = ["a bb ccc", "dddd e", "ff gg hhh iiii", "j"]
    bert = tiny_model("BertForSequenceClassification")
    assert len(predict_labels(bert, _WordTokenizer(), texts, batch_size=2)) == 4
    # a callable without padding_side is named by what its rows show; texts are batched in order of length (predict's
    # loop, since session 26), so "j" is padded beside "dddd e"
    with pytest.raises(ValueError, match=r"^tokenizer: pads on the left, so row \[3\] starts with padding, and "
                                         r"BertForSequenceClassification classifies from the first column.*"
                                         r"padding_side = 'right'"):
        predict_labels(bert, LeftPadding(), texts, batch_size=2)
    space = space_model(num_labels=2)
    assert predict_labels(space, LeftPadding(), texts, batch_size=2) == predict_labels(space, _WordTokenizer(), texts,
                                                                                       batch_size=2)


def test_classification_scores_hand_case():
    s = classification_scores([0, 0, 1, 1], [0, 1, 1, 1])
    assert s["accuracy"] == 0.75
    # class 0: P=1, R=0.5, F1=2/3; class 1: P=2/3, R=1, F1=0.8
    assert s["f1_macro"] == pytest.approx((2 / 3 + 0.8) / 2)


def test_readers(tmp_path):
    (tmp_path / "s.tsv").write_text("sentence\tlabel\ngood film \t1\nbad \" film\t0\n", encoding="utf-8")
    assert read_sst2_tsv(tmp_path / "s.tsv") == (["good film", 'bad " film'], [1, 0])
    (tmp_path / "rt-polarity.pos").write_text("great — fun\nnice\n", encoding="utf-8")
    (tmp_path / "rt-polarity.neg").write_text("dull\n", encoding="utf-8")
    assert read_rt_polarity(tmp_path) == (["dull", "great — fun", "nice"], [0, 1, 1])
    assert read_rt_polarity(tmp_path, limit_per_class=1) == (["dull", "great — fun"], [0, 1])
    with pytest.raises(FileNotFoundError, match="rt-polarity.neg"):
        read_rt_polarity(tmp_path / "missing")
    (tmp_path / "bad.tsv").write_text("text\tlabel\nx\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'sentence' and 'label'"):
        read_sst2_tsv(tmp_path / "bad.tsv")


# --- issue 15: unusual input gets a correct answer or a clear error -------------------------------------------

@pytest.mark.parametrize("num_labels", [0, 1])
def test_fewer_than_two_classes_is_refused(num_labels):
    # num_labels=1 used to train on a cross-entropy over one logit, identically 0.
    with pytest.raises(BcosValueError, match="num_labels: must be >= 2"):
        space_model(num_labels=num_labels)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("n_latent", 0, "n_latent: must be >= 1"),
    ("cross_entropy_weight", float("nan"), "cross_entropy_weight: must be finite"),
    ("intra_space_weight", -1.0, "intra_space_weight: must be >= 0"),
    ("intra_space_eps", float("inf"), "intra_space_eps: must be finite"),
])
def test_config_values_are_validated(field, value, match):
    with pytest.raises(BcosValueError, match=match):
        SpaceModelConfig(encoder_config=tiny_config("bert"), **{field: value})
    with pytest.raises(BcosTypeError, match="n_latent: must be an int"):
        SpaceModelConfig(encoder_config=tiny_config("bert"), n_latent=2.5)
    with pytest.raises(BcosValueError, match="every other loss weight is 0"):
        SpaceModelConfig(encoder_config=tiny_config("bert"), cross_entropy_weight=0.0, intra_space_weight=0.0)


@pytest.mark.parametrize("bad", [[0, 1, 3], [0, 1, -1], [0, 1, -100]])
def test_labels_out_of_range_are_named_before_the_cross_entropy(bad):
    model = space_model()
    ids, mask = padded_batch()
    with pytest.raises(BcosValueError, match=rf"labels: ids must lie in \[0, 3\), got \[{bad[2]}\] at row \[2\]\. "
                                             r"Pass ids in \[0, 3\) \(there are 3 classes\)"):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor(bad))
    with pytest.raises(BcosTypeError, match=r"labels: got a float \(torch\.float32\); ids must be integers"):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0.0, 1.0, 0.7]))


def test_opaque_encoder_errors_become_named_ones():
    model = space_model()
    ids, mask = padded_batch()
    with pytest.raises(BcosValueError, match=r"input_ids: empty input of shape \(0, 9\); there is nothing to explain\. "
                                             "Pass at least one sequence"):
        model(input_ids=ids[:0], attention_mask=mask[:0])
    with pytest.raises(BcosValueError, match="input_ids: has ids outside the vocabulary"):
        model(input_ids=ids + 100, attention_mask=mask)
    with pytest.raises(BcosValueError, match="input_ids: has 41 positions but the model has only 40"):
        model(input_ids=torch.randint(3, 50, (1, 41)))
    with pytest.raises(BcosValueError, match=r"attention_mask: shape \(3, 4\) differs from input_ids \(3, 9\)\. "
                                             "Pass the mask the tokenizer returned"):
        model(input_ids=ids, attention_mask=mask[:, :4])
    roberta = space_model("roberta")  # its position table starts after the padding index
    with pytest.raises(BcosValueError, match="has 41 positions"):
        roberta(input_ids=torch.randint(3, 50, (1, 41)))
    assert torch.isfinite(roberta(input_ids=torch.randint(3, 50, (1, 40))).logits).all()
