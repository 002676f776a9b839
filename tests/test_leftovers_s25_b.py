"""Closing note 24's messages and small checks (helper-175, session 25): the training helpers' truncation warning
(once a call), the bootstrap's fewest resamples for its level, the loaders' n beyond their rows, the own-loss
refusal naming the model, and the left-padding refusal's position_ids hint only where it is a fix. Each failed
before its change."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T
from conftest import TINY_VIT_SHAPE, tiny_config
from test_pretrain import QUIET, word_tokenizer

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError

# --------------------------------------------------------------- 1. the training helpers' truncation warning

# 9, 4, 7 and 3 tokens (the word tokenizer adds no special tokens): at max_length=6 texts 0 and 2 are cut
LONG_TEXTS = ["w1 w2 w3 w4 w5 w6 w7 w8 w9", "w1 w2 w3 w4", "w5 w6 w7 w8 w9 w10 w11", "w3 w4 w5"]
LONG_LABELS = [0, 1, 0, 1]


def _truncation_warnings(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, UserWarning) and "have more than max_length" in str(w.message)]


def _bert_classifier(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)


def test_fine_tune_classifier_warns_once_of_the_texts_it_cuts_its_teachers_predict_says_nothing():
    """fine_tune_classifier cut texts to max_length (64 by default) and trained on their first tokens without a word.
    It warns as predict does, naming how many, which, the limit and the keyword that keeps every token, once: the
    teacher's predict inside the same call, on the same texts, warned a second time before its own flag."""
    from bcos_plugins.train import fine_tune_classifier

    model, teacher = _bert_classifier(0), _bert_classifier(1).eval()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fine_tune_classifier(model, word_tokenizer(), LONG_TEXTS, LONG_LABELS, max_length=6, batch_size=4,
                             max_steps=1, teacher=teacher, **QUIET)
    cut = _truncation_warnings(record)
    assert len(cut) == 1, [str(w.message) for w in cut]
    assert str(cut[0].message).startswith(
        "fine_tune_classifier: 2 text(s) [0, 2] have more than max_length=6 tokens: each is trained on as the first "
        "tokens the tokenizer kept (its first 6, as the tokenizer's truncation_side='right' cuts; the rest is left "
        "out). Pass max_length=9 (the longest text's tokens)")
    assert cut[0].filename == __file__  # the caller's line, not the package's
    # texts that fit: no warning
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fine_tune_classifier(_bert_classifier(0), word_tokenizer(), LONG_TEXTS, LONG_LABELS, max_length=9,
                             batch_size=4, max_steps=1, teacher=teacher, **QUIET)
    assert _truncation_warnings(record) == []


def test_pretrain_masked_lm_warns_of_the_texts_it_cuts():
    """pretrain_masked_lm cut texts to max_length (128 by default) without a word: the same warning, once."""
    from bcos_plugins.pretrain import pretrain_masked_lm

    torch.manual_seed(0)
    model = T.BertForMaskedLM(tiny_config("bert"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pretrain_masked_lm(model, word_tokenizer(), LONG_TEXTS, max_length=6, batch_size=4, max_steps=1, **QUIET)
    cut = _truncation_warnings(record)
    assert len(cut) == 1, [str(w.message) for w in cut]
    assert str(cut[0].message).startswith(
        "pretrain_masked_lm: 2 text(s) [0, 2] have more than max_length=6 tokens: each is pre-trained on as the first "
        "tokens the tokenizer kept")
    assert "Pass max_length=9" in str(cut[0].message) and cut[0].filename == __file__


def test_fine_tune_task_then_bcos_warns_once_for_its_two_stages_under_its_own_name_at_the_callers_line():
    """Both stages train on the same texts at the same max_length: one warning for the call, not one a stage. It was
    also labelled "fine_tune_classifier" (its first stage) and pointed at pretrain.py (helper-184; the one training
    run serves both checks, tests/test_leftovers_s25_c.py's section 3 ran it a second time)."""
    from bcos_plugins.pretrain import fine_tune_task_then_bcos

    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fine_tune_task_then_bcos(model, word_tokenizer(), LONG_TEXTS, LONG_LABELS, max_length=6, batch_size=4,
                                 max_steps=1, **QUIET)
    cut = _truncation_warnings(record)
    assert len(cut) == 1, [str(w.message) for w in cut]
    assert str(cut[0].message).startswith(
        "fine_tune_task_then_bcos: 2 text(s) [0, 2] have more than max_length=6 tokens")
    assert cut[0].filename == __file__


def test_predict_outside_a_training_call_still_warns():
    """The flag that quiets a teacher's predict is the training call's alone: predict on its own warns as before."""
    from bcos_plugins.train import predict

    with pytest.warns(UserWarning, match=r"^predict: 2 text\(s\) \[0, 2\] have more than max_length=6 tokens"):
        predict(_bert_classifier(0), word_tokenizer(), LONG_TEXTS, max_length=6)


# --------------------------------------------------------------- 2. the bootstrap's fewest resamples for its level


@pytest.mark.parametrize(("confidence", "fewest"), [(0.95, 40), (0.9, 20), (0.8, 10), (0.99, 200), (0.999, 2000)])
def test_paired_bootstrap_refuses_fewer_resamples_than_put_one_in_each_tail(confidence, fewest):
    """2-39 resamples were accepted at 95 %: each 2.5 % tail held less than one resample, so the interval's ends were
    read between the most extreme resample means. Refused below ceil(2 / (1 - confidence)), named in the message
    (computed from the level's decimal: 2 / (1 - 0.9) in floats is 20.000000000000004, whose ceiling is 21)."""
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a, b = [0.1, 0.5, 0.2, 0.9, 0.4], [0.3, 0.4, 0.4, 0.6, 0.8]
    with pytest.raises(BcosValueError, match=rf"^n_resamples: is {fewest - 1}, too few for a {100 * confidence:g} % "
                                             rf"interval.*Pass n_resamples >= {fewest} \(ceil\(2 / \(1 - confidence\)\)\)"):
        paired_bootstrap_difference(a, b, confidence=confidence, n_resamples=fewest - 1)
    result = paired_bootstrap_difference(a, b, confidence=confidence, n_resamples=fewest)
    assert result.n_resamples == fewest and result.ci_low <= result.difference <= result.ci_high


def test_paired_bootstrap_keeps_its_default_and_its_one_resample_message():
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a, b = [0.1, 0.5, 0.2, 0.9, 0.4], [0.3, 0.4, 0.4, 0.6, 0.8]
    assert paired_bootstrap_difference(a, b).n_resamples == 2000
    with pytest.raises(BcosValueError, match=r"^n_resamples: is 1, whose one resample mean is both ends"):
        paired_bootstrap_difference(a, b, n_resamples=1)


# --------------------------------------------------------------- 3. the loaders' n beyond their rows


def test_the_loaders_warn_when_n_exceeds_the_rows_they_have(tmp_path):
    """load_sst2 / load_ag_news / load_blimp / load_ioi returned every row without a word when n exceeded them (a
    caller's n=1000 of the 600-row test split trained or scored 600). One helper warns, naming n, the rows there are
    and where they came from; n within the rows says nothing."""
    from bcos_plugins.data import load_ag_news, load_blimp, load_ioi, load_sst2, make_ioi_prompts

    with pytest.warns(UserWarning, match=r"^load_sst2: n=1000, but the shipped SST-2 'test' split has 600 rows: all "
                                         r"600 are returned\. Pass n <= 600"):
        assert len(load_sst2("test", n=1000)) == 600
    with pytest.warns(UserWarning, match=r"^load_ag_news: n=801, but the shipped AG News 'test' split has 800 rows"):
        assert len(load_ag_news("test", n=801)) == 800
    file = tmp_path / "two.tsv"
    file.write_text("sentence\tlabel\na fine film\t1\na dull one\t0\n")
    with pytest.warns(UserWarning, match=rf"^load_sst2: n=3, but the file {file} has 2 rows"):
        assert load_sst2(path=file, n=3).texts == ["a fine film", "a dull one"]
    with pytest.warns(UserWarning, match=r"^load_blimp: n=301, but the file .*determiner_noun_agreement_1\.jsonl has "
                                         r"300 pairs"):
        load_blimp("dna", n=301)
    sentences = tmp_path / "ioi.txt"
    sentences.write_text("\n".join(p.completion for p in make_ioi_prompts(2, seed=0)))
    with pytest.warns(UserWarning, match=rf"^load_ioi: n=5, but the file {sentences} has 2 usable sentences"):
        assert len(load_ioi(sentences, n=5)) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_sst2("test", n=600)) == 600
        assert len(load_blimp("dna", n=300)) == len(load_blimp("dna"))
        assert len(load_ioi(sentences, n=2)) == 2


# --------------------------------------------------------------- 5. the own-loss refusal names the model


@pytest.mark.parametrize("setting", ["teacher", "label_smoothing_factor"])
def test_fine_tune_classifiers_own_loss_refusal_names_the_model_and_its_loss(setting):
    """The refusal of a teacher or label smoothing over a model's own loss always said "a Space Model" and its inter-
    and intra-space terms, of a BcosViT too (whose own loss is the B-cos BCE): it names the class and its loss."""
    from bcos_plugins.train import fine_tune_classifier
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE))
    settings = {"teacher": copy.deepcopy(model)} if setting == "teacher" else {"label_smoothing_factor": 0.1}
    with pytest.raises(BcosValueError) as refusal:
        fine_tune_classifier(model, word_tokenizer(), ["w1 w2", "w3 w4"], [0, 1], max_steps=1, **QUIET, **settings)
    message = str(refusal.value)
    assert message.startswith(f"{setting}: ")
    assert ("loss='auto' trains BcosViT with its own loss, the B-cos BCE on one-hot targets (bcos_loss), which "
            in message), message
    assert "Space" not in message and "loss='ce'" in message


# --------------------------------------------------------------- 6. the left-padding refusal's position_ids hint


def _electra(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.ElectraConfig(vocab_size=60, embedding_size=16, hidden_size=16, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=32, max_position_embeddings=24, num_labels=2)
    return getattr(T, kind)(config).eval()


def test_the_position_ids_hint_is_given_where_it_is_a_fix_and_only_there():
    """A model outside the registry with a learned position table was told "or pass position_ids=" by every path's
    left-padding refusal: by the paths that pad their caller's texts themselves and take no position_ids (predict,
    predict_labels, fine_tune_classifier, at its first training step; explain_dataset refuses a model outside the
    registry before), and for a
    classifier that reads the first column (ELECTRA's), where ids counting real tokens still classify the padding
    (checked below). The hint stays where the caller passes the mask and the model reads every row's own tokens (a
    base model, the Space model's encoder), and following it there gives each row as alone."""
    from bcos_plugins.attribution import real_token_positions
    from bcos_plugins.attribution.text import rows_as_alone_call
    from bcos_plugins.space import SpaceModelForSequenceClassification, predict_labels
    from bcos_plugins.train import fine_tune_classifier, predict

    rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    ids, mask = torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, 4 - len(row):], mask[i, 4 - len(row):] = torch.tensor(row), 1
    hint = "or pass position_ids="
    base, classifier = _electra("ElectraModel"), _electra("ElectraForSequenceClassification")
    with pytest.raises(BcosValueError, match=r"^attention_mask: rows \[1, 2\] start with padding.*Pad on the right "
                                             r"\(tokenizer.padding_side = 'right'\), or pass position_ids="):
        rows_as_alone_call(base, ids, mask)
    with torch.no_grad():
        fixed = base(**rows_as_alone_call(base, ids, mask, {"position_ids": real_token_positions(mask)}))
        for i, row in enumerate(rows):
            alone = base(input_ids=torch.tensor([row])).last_hidden_state[0]
            torch.testing.assert_close(fixed.last_hidden_state[i, 4 - len(row):], alone, rtol=1e-5, atol=1e-6)
        # the classifier given those ids still reads the padded first column: the hint would give other logits
        given = classifier(input_ids=ids, attention_mask=mask, position_ids=real_token_positions(mask))
        alone = torch.cat([classifier(input_ids=torch.tensor([row])).logits for row in rows])
        assert not torch.allclose(given.logits[1:], alone[1:], atol=1e-4)
    # and the batch path refuses it, position_ids given or not (it ran, scoring the padding's logits: helper-184,
    # tests/test_leftovers_s25_c.py)
    with pytest.raises(BcosValueError, match=r"ElectraForSequenceClassification is a sequence classifier outside the "
                                             r"architecture registry.*Pad on the right"):
        rows_as_alone_call(classifier, ids, mask, {"position_ids": real_token_positions(mask)})
    with pytest.raises(BcosValueError, match=r"Pad on the right \(tokenizer.padding_side = 'right'\)\.$") as refusal:
        rows_as_alone_call(classifier, ids, mask)
    assert hint not in str(refusal.value)
    space = SpaceModelForSequenceClassification.from_encoder(base, num_labels=2, n_latent=4).eval()
    # called with the mask, the Space model passes position_ids to its encoder: the hint holds there
    with pytest.raises(BcosValueError, match=r"^attention_mask: .*the encoder ElectraModel .*or pass position_ids="):
        space(input_ids=ids, attention_mask=mask)
    tok = word_tokenizer()
    tok.padding_side = "left"
    texts = ["w1 w2 w3 w4", "w5 w6", "w7 w8 w9"]
    for call in (lambda: predict(classifier, tok, texts), lambda: predict(space, tok, texts),
                 lambda: predict_labels(space, tok, texts)):
        with pytest.raises(BcosValueError, match=r"^tokenizer: pads on the left \(tokenizer.padding_side='left'\), so "
                                                 r"rows \[1, 2\] start with padding.*Pad on the right") as refusal:
            call()
        assert hint not in str(refusal.value), str(refusal.value)
    # fine_tune_classifier refuses before training, naming the text (the shortest, padded with the longest): the
    # Space model's refusal came at the first step, naming attention_mask, the shuffled batch's rows and the hint
    before = [p.detach().clone() for p in space.train().parameters()]
    with pytest.raises(BcosValueError, match=r"^tokenizer: pads on the left \(tokenizer.padding_side='left'\), so "
                                             r"row \[1\] starts with padding, and the encoder ElectraModel .*Pad on "
                                             r"the right \(tokenizer.padding_side = 'right'\)\.$"):
        fine_tune_classifier(space, tok, texts, [0, 1, 0], batch_size=3, max_steps=1, **QUIET)
    assert all(torch.equal(a, b) for a, b in zip(before, space.parameters(), strict=True))
    assert space.training  # the check's forward in eval mode left the model's mode as it was
