"""Padding must not change a row's numbers: every row of a padded batch is explained (and predicted) as the same row
alone, or the batch is refused naming ``attention_mask``, the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch
from test_conformance import CONFIGS, _family, _stock

from bcos_plugins import bcosify, explain
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosValueError

ENCODER_NAMES = sorted(name for name, spec in SPECS.items() if spec.kind == "encoder")
FIRST_COLUMN_REFUSAL = r"^attention_mask: rows \[1, 2\] start with padding.*first column's hidden state"
PAD_ON_THE_RIGHT = r"Pad on the right \(tokenizer\.padding_side = 'right'\)"
# a path that pads its caller's texts itself names the tokenizer's padding side, not attention_mask (never passed)
TOKENIZER_PADS_LEFT = r"^tokenizer: pads on the left \(tokenizer\.padding_side='left'\), so "


def _target_of(name: str):
    """What explain is asked on ``name``: a target every class has (not the pad id 0 of a masked LM, whose tied
    decoder row is the zero padding embedding) and, for a masked LM, a position (it has no default)."""
    return 1 if SPECS[name].is_classifier else 5


def _alone(model, name, ids, mask, row, target):
    keep = mask[row].bool()
    position = {"position": 0} if SPECS[name].head == "masked_lm" else {}
    return explain(model, ids[row : row + 1, keep], mask[row : row + 1, keep], target=target, **position)


@pytest.mark.parametrize("pad_id", ["config", 0])
@pytest.mark.parametrize("stock", [False, True], ids=["bcos", "stock"])
@pytest.mark.parametrize("name", ENCODER_NAMES)
def test_every_encoder_explains_a_left_padded_row_as_the_row_alone_or_refuses(name, stock, pad_id):
    """Before: BertModel, BertForMaskedLM, DistilBertModel and RobertaModel (RoBERTa with padding written as another
    id than config.pad_token_id) counted absolute positions from the padded first column, so a left-padded row's
    contributions differed from the row's own by up to 2.4 (tiny random models)."""
    model = _stock(name) if stock else bcosify(_stock(name), b=1.25, verbose=False)
    spec = SPECS[name]
    config_pad = CONFIGS[_family(name)]().pad_token_id or 0
    ids, mask = padded_batch(seed=3, side="left", pad_id=config_pad if pad_id == "config" else pad_id)
    target = _target_of(name)
    position = {"position": mask.argmax(1)} if spec.head == "masked_lm" else {}
    if spec.classifies_from_first_column(model.config):
        with pytest.raises(BcosValueError, match=FIRST_COLUMN_REFUSAL + ".*" + PAD_ON_THE_RIGHT):
            explain(model, ids, mask, target=target)
        return
    batched = explain(model, ids, mask, target=target, **position)
    for row in range(ids.shape[0]):
        alone = _alone(model, name, ids, mask, row, target)
        torch.testing.assert_close(batched.explained[row : row + 1], alone.explained, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched.contributions[row, mask[row].bool()], alone.contributions[0],
                                   rtol=1e-5, atol=1e-6)


def test_captum_paths_explain_a_left_padded_masked_lm_row_as_the_row_alone():
    """Captum's EmbeddingForward and LayerBcos call the model through the same model_call_kwargs as explain."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos

    model = bcosify(_stock("BertForMaskedLM"), b=1.25, verbose=False)
    ids, mask = padded_batch(seed=4, side="left")
    position, target = mask.argmax(1), torch.tensor([5, 6, 7])
    forward = EmbeddingForward(model)
    attr = BcosAttribution(forward).attribute(forward.embed(ids, mask), target=target,
                                              additional_forward_args=(mask, position))
    layer_attr = LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask, position))
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        alone = explain(model, ids[row : row + 1, keep], target=target[row : row + 1], position=0)
        torch.testing.assert_close(attr[row, keep], alone.input_contributions[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer_attr[row, keep], alone.input_contributions[0], rtol=1e-5, atol=1e-6)


def test_an_absolute_position_encoder_whose_forward_takes_no_position_ids_refuses_left_padding():
    """Where the forward cannot be given position ids that count real tokens (a transformers class without
    position_ids), left padding would shift the positions: refused, naming attention_mask, the problem and the fix;
    right padding is explained as before."""
    model = bcosify(_stock("DistilBertModel"), b=1.25, verbose=False)
    original = model.forward

    def forward_without_position_ids(input_ids=None, attention_mask=None, **kwargs):
        return original(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model.forward = forward_without_position_ids
    ids, mask = padded_batch(seed=3, side="left")
    with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding, and "
                       r"DistilBertModel reads its position embeddings from a table counted from the first column "
                       r"and its forward takes no position_ids.*" + PAD_ON_THE_RIGHT):
        explain(model, ids, mask, target=1)
    right_ids, right_mask = padded_batch(seed=3, side="right")
    batched = explain(model, right_ids, right_mask, target=1)
    alone = explain(model, right_ids[2:, right_mask[2].bool()], target=1)
    torch.testing.assert_close(batched.contributions[2, right_mask[2].bool()], alone.contributions[0],
                               rtol=1e-5, atol=1e-6)


def _left_padding_pair_tokenizer():
    from test_train import pair_tokenizer

    tokenizer = pair_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


def test_predict_and_accuracy_name_the_refused_rows_by_their_index_in_texts():
    """predict batches texts in order of length: before, a refusal of left padding named the rows of that sorted
    batch ("rows [0, 1, 2]" for texts 3, 1 and 4 here), so the user looked at the wrong texts."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins.train import accuracy, predict

    tokenizer = _left_padding_pair_tokenizer()
    texts = ["w1 w2 w1 w2 w1", "w2 w1", "w1 w2 w1 w2 w1 w2 w1 w2", "w1", "w2 w2 w1"]  # sorted: 3, 1, 4, 0, 2
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    refusal = (TOKENIZER_PADS_LEFT + r"rows \[0, 1, 3, 4\] start with padding, and BertForSequenceClassification "
               r"classifies from the first column.*" + PAD_ON_THE_RIGHT)
    with pytest.raises(BcosValueError, match=refusal):
        predict(model, tokenizer, texts, max_length=32)
    with pytest.raises(BcosValueError, match=refusal):
        accuracy(model, tokenizer, texts, [0, 1, 0, 1, 0], max_length=32)
    # two per batch: the first batch (texts 3 and 1) pads text 3 only
    with pytest.raises(BcosValueError, match=TOKENIZER_PADS_LEFT + r"row \[3\] starts with padding"):
        predict(model, tokenizer, texts, batch_size=2, max_length=32)


def test_explain_dataset_names_the_refused_rows_by_their_index_in_data():
    """explain_dataset explains data in chunks of batch_size: a refusal named the rows of the chunk."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins import explain_dataset

    tokenizer = _left_padding_pair_tokenizer()
    texts = ["w1 w2 w1", "w2 w1 w2", "w1 w2 w1 w2 w1", "w1"]
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), verbose=False)
    # the first chunk (texts 0 and 1) has no padding; in the second, text 3 (row 1 of the chunk) is padded
    with pytest.raises(BcosValueError, match=TOKENIZER_PADS_LEFT + r"row \[3\] starts with padding.*"
                       + PAD_ON_THE_RIGHT):
        explain_dataset(model, tokenizer, texts, batch_size=2, progress=False)


# 40 texts of 1 to 11 words: on a tiny GPT-2 classifier, 13 of them got another class left-padded than alone
_WORDS = ("w1", "w2")
_GENERATOR = torch.Generator().manual_seed(0)
VARIED_TEXTS = [" ".join(_WORDS[int(i)] for i in torch.randint(0, 2, (int(n),), generator=_GENERATOR))
                for n in torch.randint(1, 12, (40,), generator=_GENERATOR)]


@pytest.mark.parametrize("class_name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_space_predict_labels_gives_a_decoder_classifiers_rows_the_class_of_the_row_alone(class_name):
    """predict_labels called the model with the tokenizer's outputs only: a left-padded GPT-2 row's positions counted
    from the padded column (13 of these 40 texts changed class). It calls registry models through model_call_kwargs,
    as explain and predict do; Llama's rotary positions were and are unaffected."""
    from conftest import tiny_model
    from test_train import pair_tokenizer

    from bcos_plugins.space import predict_labels
    from bcos_plugins.train import predict

    model = tiny_model(class_name)
    tokenizer = pair_tokenizer()
    alone = [predict_labels(model, tokenizer, [text])[0] for text in VARIED_TEXTS]
    assert alone == predict(model, tokenizer, VARIED_TEXTS, max_length=32).argmax(-1).tolist()
    for side in ("right", "left"):
        tokenizer.padding_side = side
        assert predict_labels(model, tokenizer, VARIED_TEXTS, batch_size=40) == alone, f"padding on the {side}"
        assert predict_labels(model, tokenizer, VARIED_TEXTS, batch_size=7) == alone, f"padding on the {side}"


def test_space_predict_labels_names_the_refused_rows_by_their_index_in_texts():
    from conftest import tiny_model

    from bcos_plugins.space import predict_labels

    tokenizer = _left_padding_pair_tokenizer()
    texts = ["w1 w2", "w2 w1", "w1 w2 w1", "w1"]
    with pytest.raises(BcosValueError, match=TOKENIZER_PADS_LEFT + r"row \[3\] starts with padding.*"
                       + PAD_ON_THE_RIGHT):
        predict_labels(tiny_model("BertForSequenceClassification"), tokenizer, texts, batch_size=2)


BASE_ENCODER_NAMES = [name for name in ENCODER_NAMES if SPECS[name].head == "base"]


@pytest.mark.parametrize("name", BASE_ENCODER_NAMES)
def test_space_model_computes_a_left_padded_row_as_the_row_alone(name):
    """The Space model called its encoder without position ids: on a BERT encoder a left-padded row's logits were
    0.51 off the row's own (tiny model). Registry encoders get the position ids explain gives them."""
    from bcos_plugins import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    model = SpaceModelForSequenceClassification.from_encoder(_stock(name), num_labels=2, n_latent=4).eval()
    config_pad = CONFIGS[_family(name)]().pad_token_id or 0
    ids, mask = padded_batch(seed=5, side="left", pad_id=config_pad)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
    explained = model.explain(ids, mask, target=1)
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        with torch.no_grad():
            alone = model(input_ids=ids[row : row + 1, keep]).logits
        torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-5, atol=1e-6)
        alone_explained = model.explain(ids[row : row + 1, keep], target=1)
        torch.testing.assert_close(explained.contributions[row, keep], alone_explained.contributions[0],
                                   rtol=1e-5, atol=1e-6)


def _eager_bert_attentions(ids, mask):
    import transformers as T
    from conftest import tiny_config

    torch.manual_seed(0)
    config = tiny_config("bert")
    config._attn_implementation = "eager"
    model = T.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions


def test_attention_token_scores_refuses_a_query_column_on_padding_given_the_mask():
    """A padding token's query row is a softmax over the real keys like [CLS]'s, so nothing in the attention weights
    shows it: on a left-padded batch, query_position=0 scored the padded rows with a padding token's attention
    (and attention_supervision_loss trained that row), silently. Given attention_mask, it is refused."""
    from bcos_plugins.guided import attention_supervision_loss, attention_token_scores

    ids, mask = padded_batch(seed=1, side="left")
    attentions = _eager_bert_attentions(ids, mask)
    # what the unchecked call returns for padded row 1: the attention of column 0 (padding), not of its [CLS]
    unchecked = attention_token_scores(attentions, -1)
    cls_column = int(mask[1].argmax())
    cls_row = attentions[-1][1, :, cls_column, :].mean(0)
    assert not torch.allclose(unchecked[1], cls_row)
    refusal = (r"^query_position: column 0 is padding in rows \[1, 2\] \(attention_mask\), so their scores would be a "
               r"padding token's attention.*" + PAD_ON_THE_RIGHT)
    with pytest.raises(BcosValueError, match=refusal):
        attention_token_scores(attentions, -1, attention_mask=mask)
    gold = torch.zeros_like(mask, dtype=torch.float)
    gold[:, -1] = 1.0
    with pytest.raises(BcosValueError, match=refusal):
        attention_supervision_loss(attentions, gold, attention_mask=mask)
    # right padding: [CLS] is column 0 of every row (accepted, the same scores), the last column is not
    right_ids, right_mask = padded_batch(seed=1, side="right")
    right = _eager_bert_attentions(right_ids, right_mask)
    torch.testing.assert_close(attention_token_scores(right, -1, attention_mask=right_mask),
                               attention_token_scores(right, -1))
    with pytest.raises(BcosValueError, match=r"^query_position: column -1 is padding in rows \[1, 2\]"):
        attention_token_scores(right, -1, query_position=-1, attention_mask=right_mask)
    with pytest.raises(BcosValueError, match=r"^attention_mask: must have shape \(batch, key\) = \(3, 9\)"):
        attention_token_scores(right, -1, attention_mask=right_mask[:, :5])


@pytest.mark.parametrize("name", ["BertForMaskedLM", "BertModel", "DistilBertModel", "RobertaModel"])
def test_a_dynamic_linear_copy_explains_a_left_padded_row_as_the_row_alone(name):
    """dynamic_linear_copy keeps the stock class, so explain calls it with the same position ids (before: shifted
    by the padding like the stock model)."""
    from bcos_plugins.convert.dynamic_linear import dynamic_linear_copy

    model = dynamic_linear_copy(_stock(name))
    ids, mask = padded_batch(seed=2, side="left")
    position = {"position": mask.argmax(1) + 1} if SPECS[name].head == "masked_lm" else {}
    batched = explain(model, ids, mask, target=5, **position)
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        alone = explain(model, ids[row : row + 1, keep], target=5, **({"position": 1} if position else {}))
        torch.testing.assert_close(batched.contributions[row, keep], alone.contributions[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched.delta[row : row + 1], alone.delta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config_pad", ["tokenizer's", "another"])
@pytest.mark.parametrize("class_name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_fine_tune_classifier_trains_a_decoder_classifier_on_each_row_as_alone(class_name, config_pad):
    """The Trainer called the model with DataCollatorWithPadding's batches as given: a left-padded GPT-2 row's logits
    were 0.15 off the row's own (positions from the padded column), and where config.pad_token_id is not the
    tokenizer's padding id every decoder classifier (Llama too) was trained on a padding token's logits. The training
    batches of a registry model are model_call_kwargs', so both padding sides train the same weights."""
    from conftest import tiny_model
    from test_pretrain import QUIET
    from test_train import pair_tokenizer

    from bcos_plugins.train import fine_tune_classifier

    texts = VARIED_TEXTS[:16]
    labels = [int(text.count("w1") > text.count("w2")) for text in texts]
    trained = {}
    for side in ("right", "left"):
        model = tiny_model(class_name)
        for module in model.modules():  # dropout draws its masks over the padded layout, which differs per side
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        tokenizer = pair_tokenizer()
        tokenizer.padding_side = side
        model.config.pad_token_id = tokenizer.pad_token_id if config_pad == "tokenizer's" else model.config.vocab_size - 1
        # plain SGD: Adam would blow float noise on a gradient that is 0 in exact arithmetic up to a full step
        trainer = fine_tune_classifier(model, tokenizer, texts, labels, epochs=2, batch_size=8, learning_rate=0.1,
                                       optim="sgd", max_length=32, **QUIET)
        batch = next(iter(trainer.get_train_dataloader()))
        assert (batch["attention_mask"] == 0).any(), "the probe batch is padded"
        with torch.no_grad():
            batched = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            for row in range(batch["input_ids"].shape[0]):
                keep = batch["attention_mask"][row].bool()
                row_alone = {k: batch[k][row : row + 1, keep] for k in ("input_ids", "token_type_ids") if k in batch}
                alone = model(**row_alone).logits
                torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, r=row, s=side: f"padding on the {s}, row {r}: {m}")
        trained[side] = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, right in trained["right"].items():
        torch.testing.assert_close(trained["left"][name], right, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_explain_dataset_names_every_refused_row_by_its_index_in_data():
    """explain_dataset explains data in chunks of batch_size: a bad target or position of text 3 was refused as "row
    [1]", its row in the chunk (only the left-padding refusal named data's rows). Every refusal inside explain names
    rows through bad_rows / named_rows, which name the caller's rows inside rows_named_as."""
    import transformers as T
    from conftest import tiny_config, tiny_model
    from test_train import pair_tokenizer

    from bcos_plugins import explain_dataset

    tokenizer = pair_tokenizer()
    texts = ["w1 w2 w1", "w2 w1 w2", "w1 w2 w1 w2 w1", "w1"]
    torch.manual_seed(0)
    classifier = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), verbose=False)
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 2\), got \[7\] at row \[3\]\. "):
        explain_dataset(classifier, tokenizer, texts, target=[0, 1, 0, 7], batch_size=2, progress=False)
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 2\), got \[7, 7\] at rows \[2, 3\]\. "):
        explain_dataset(classifier, tokenizer, texts, target=[0, 1, 7, 7], batch_size=2, progress=False)
    # position 4 counts from each text's first token: past text 3's last token (named as given since trust pass 14)
    with pytest.raises(BcosValueError, match=r"^position: 4 is not a token of text 3 \('w1', 3 tokens\)\. "):
        explain_dataset(tiny_model("GPT2LMHeadModel"), tokenizer, texts, target=5, position=4, batch_size=2,
                        progress=False)


def test_guided_esnli_evaluation_refuses_attention_scores_of_a_padding_query(monkeypatch):
    """examples/guided_esnli.py scored [CLS] attention (query column 0) without the batch's attention_mask: a batch
    whose first column is padding would have been scored on a padding token's attention, silently. Its collate pads
    on the right (accepted, as before); a left-padding one is refused through attention_token_scores' check."""
    import transformers as T
    from conftest import tiny_config

    from examples import guided_esnli

    config = tiny_config("bert", num_labels=2)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(config).eval()
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, length in enumerate((7, 5, 4)):
        ids = [2, *torch.randint(5, 40, (length - 2,), generator=g).tolist(), 3]
        valid = torch.tensor([False, *[True] * (length - 2), False])
        gold = torch.zeros(length, dtype=torch.bool)
        gold[1] = True
        rows.append({"input_ids": ids, "token_type_ids": [0] * length, "label": i % 2, "gold": gold, "valid": valid})
    right = guided_esnli.evaluate(model, rows, 0, bcos=False, heads=[0])
    assert set(right) >= {"accuracy", "attention", "attention_heads"}

    right_padding_collate = guided_esnli.collate

    def left_padding_collate(batch_rows, pad_id, **kwargs):
        batch, gold, valid = right_padding_collate(batch_rows, pad_id, **kwargs)
        shift = (batch["attention_mask"] == 0).sum(1)

        def to_left(t):
            return torch.stack([row.roll(int(s)) for row, s in zip(t, shift, strict=True)])

        return {k: v if v.ndim == 1 else to_left(v) for k, v in batch.items()}, to_left(gold), to_left(valid)

    monkeypatch.setattr(guided_esnli, "collate", left_padding_collate)
    with pytest.raises(BcosValueError, match=r"^query_position: column 0 is padding in rows \[1, 2\] "
                                             r"\(attention_mask\).*" + PAD_ON_THE_RIGHT):
        guided_esnli.evaluate(model, rows, 0, bcos=False)


@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification",
                                  "GPT2LMHeadModel", "BertModel"])
def test_explain_under_inference_mode_gives_the_position_ids_it_makes_to_autograd(name):
    """model_call_kwargs made the position ids (and a decoder classifier's rewritten padding) under the caller's
    torch.inference_mode(), as inference tensors, which the embedding lookup cannot save for backward: explain
    raised RuntimeError on every decoder and learned-position encoder there."""
    model = bcosify(_stock(name), b=1.25, verbose=False)
    ids, mask = padded_batch(seed=6, side="left", pad_id=1)
    reference = explain(model, ids, mask, target=_target_of(name))
    with torch.inference_mode():
        inside = explain(model, ids.clone(), mask.clone(), target=_target_of(name))
    torch.testing.assert_close(inside.contributions, reference.contributions)


def test_fine_tune_classifier_refuses_before_any_step_what_model_call_kwargs_refuses():
    """Checked on a padded probe batch of the Trainer's own collator: a left-padded first-column classifier (the error
    names the text by its index in texts; it named row 0 of the probe), and a padded decoder classifier without
    config.pad_token_id (transformers raised its own error at the first step)."""
    import transformers as T
    from conftest import tiny_config, tiny_model
    from test_train import pair_tokenizer

    from bcos_plugins.train import fine_tune_classifier

    texts, labels = ["w1 w2 w1", "w2 w1 w2 w2", "w1", "w2 w1"], [0, 1, 0, 1]  # the shortest is text 2
    tokenizer = _left_padding_pair_tokenizer()
    torch.manual_seed(0)
    bert = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    with pytest.raises(BcosValueError, match=TOKENIZER_PADS_LEFT + r"row \[2\] starts with padding.*"
                       + PAD_ON_THE_RIGHT):
        fine_tune_classifier(bert, tokenizer, texts, labels, max_length=32, progress=False, use_cpu=True)
    gpt2 = tiny_model("GPT2ForSequenceClassification")
    gpt2.config.pad_token_id = None
    before = [p.detach().clone() for p in gpt2.parameters()]
    with pytest.raises(BcosValueError, match=r"^attention_mask: the batch is padded but the decoder classifier has no "
                                             r"config\.pad_token_id"):
        fine_tune_classifier(gpt2, pair_tokenizer(), texts, labels, max_length=32, progress=False, use_cpu=True)
    assert all(torch.equal(a, b) for a, b in zip(before, gpt2.parameters(), strict=True))  # no step was taken


def test_explain_dataset_names_a_missing_or_non_integer_value_by_its_text():
    """A None target, a float target, a None text or a None pair (a dataset column with a gap) failed inside
    torch.tensor ("Could not infer dtype of NoneType"), the tokenizer ("TextInputSequence must be str"), as
    "data: every text must be a str" with no index, or named the chunk's shape; each now names the text's index."""
    import datasets
    import transformers as T
    from conftest import tiny_config
    from test_train import pair_tokenizer

    from bcos_plugins import explain_dataset
    from bcos_plugins.errors import BcosTypeError

    tokenizer = pair_tokenizer()
    texts = ["w1 w2 w1", "w2 w1 w2", "w1 w2 w1 w2 w1", "w1"]
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), verbose=False)
    refusals = {
        r"^target: the value for text 3 is NoneType None, not an integer id\. Pass one int per text":
            {"data": texts, "target": [0, 1, 0, None]},
        r"^target: the value for text 2 is float 1\.0, not an integer id": {"data": texts, "target": [0, 1, 1.0, 0]},
        r"^target_column: the value for text 1 is NoneType None": {
            "data": datasets.Dataset.from_dict({"text": texts, "y": [0, None, 1, 0]}), "target_column": "y"},
        r"^data: text 3 is NoneType None, not a str\. Pass strings only": {"data": [*texts[:3], None]},
        r"^text_pair_column: the pair of text 3 is NoneType None, not a str": {
            "data": datasets.Dataset.from_dict({"text": texts, "pair": ["w1", "w2", "w1", None]}),
            "text_pair_column": "pair"},
    }
    for refusal, call in refusals.items():
        with pytest.raises(BcosTypeError, match=refusal):
            explain_dataset(model, tokenizer, **call, batch_size=2, progress=False)
    out = explain_dataset(model, tokenizer, texts, target=torch.tensor([0, 1, 1, 0]), batch_size=2, progress=False)
    assert out["target"] == [0, 1, 1, 0]  # a 1-d integer tensor is one id per text, as before


def test_explain_dataset_names_an_incomplete_row_by_its_index_in_data():
    """explain's completeness refusal named its example row by the batch's index ("rows [3] ... (row 1: ...)" for
    text 3 in a chunk of 2) while its list of rows named data's: both go through named_rows / named_row."""
    import transformers as T
    from conftest import tiny_config
    from test_train import pair_tokenizer

    from bcos_plugins import explain_dataset
    from bcos_plugins.errors import BcosRuntimeError

    tokenizer = pair_tokenizer()
    texts = ["w1 w2 w1", "w2 w1 w2", "w1 w2 w1 w2 w1", "w1 w3 w2"]
    torch.manual_seed(0)
    classifier = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), verbose=False)
    with torch.no_grad():  # one embedding row of huge norm, used by text 3 only: its sum cancels to noise
        classifier.get_input_embeddings().weight[tokenizer.convert_tokens_to_ids("w3")] = 1e15
    with pytest.raises(BcosRuntimeError, match=r"^explain: the contributions of row \[3\] do not sum to the "
                                               r"explained value \(row 3: "):
        explain_dataset(classifier, tokenizer, texts, batch_size=2, progress=False)


def test_a_left_padding_refusal_names_the_callers_rows_through_rows_named_as_only():
    """predict and predict_labels passed row_ids= to check_first_column_is_real, a second way of naming the caller's
    rows beside rows_named_as (which explain_dataset and fine_tune_classifier use): they wrap model_call_kwargs in
    rows_named_as instead, and the parameter is gone; the messages are those of the tests above."""
    import inspect

    from conftest import tiny_model

    from bcos_plugins._checks import rows_named_as
    from bcos_plugins.attribution.text import check_first_column_is_real

    assert "row_ids" not in inspect.signature(check_first_column_is_real).parameters
    model = tiny_model("BertForSequenceClassification")
    with rows_named_as([5, 2]), pytest.raises(BcosValueError, match=r"^attention_mask: row \[2\] starts with padding"):
        check_first_column_is_real(model, torch.tensor([[1, 1], [0, 1]]))
