"""Trust pass 21, evaluation and data: unusual inputs to the metrics (perturbation, image, pointing, decoder, summary),
the HTML pictures and the data helpers, each checked against an independent computation written here (the formula by
hand in float64, the model in eval mode, the row alone). The cases that were silently wrong or crashed unhelpfully,
one test each (the tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from bcos_plugins.errors import BcosTypeError, BcosValueError


def _word_bert_classifier(tok, *, layers: int = 2, positions: int = 40) -> nn.Module:
    """A stock 3-class BERT classifier over ``tok``'s words, random weights from seed 0, in eval mode."""
    import transformers as T

    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=positions, num_labels=3)).eval()

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ aopc: half-precision curves


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("normalise", [False, True])
def test_aopc_of_a_half_precision_curve_is_integrated_in_float32(dtype, normalise):
    from bcos_plugins.metrics import DEFAULT_FRACTIONS, aopc

    curve = torch.tensor([[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 0.5, 0.25]], dtype=dtype)
    x = torch.tensor(DEFAULT_FRACTIONS, dtype=torch.float64)
    exact = torch.trapezoid(curve.double(), x, dim=-1)  # the curve's values are exact in every dtype
    if normalise:
        exact = exact / 0.8
    got = aopc(curve, DEFAULT_FRACTIONS, normalise=normalise)
    # the fractions and the sum were in the curve's dtype: 0.1 is 0.10009765625 in bfloat16, the width 0.7983
    assert got.dtype == torch.float32
    assert got.double().item() == pytest.approx(exact.item(), rel=1e-6)


# ------------------------------------------------------------------ pixel perturbation: training mode, argument types


def _dropout_classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(16, 5))


def _pixel_curves_by_hand(model: nn.Module, images: torch.Tensor, maps: torch.Tensor, target: int,
                          fractions: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax curves of ``target`` removing pixels most / least important first, the eval-mode model, in float64
    (the maps have no ties, so the order is the sort of the scores)."""
    model = nn.Sequential(*(m for m in model if not isinstance(m, nn.Dropout))).double()
    curves = []
    for descending in (True, False):
        rows = []
        for image, m in zip(images.double(), maps, strict=True):
            order = m.flatten().argsort(descending=descending)
            points = []
            for f in fractions:
                kept = torch.ones(16, dtype=torch.float64)
                # the text metrics' count rule (max(1, floor(r n)) for r > 0; Python's round until 2026-11-29)
                kept[order[: 0 if f == 0 else max(1, math.floor(f * 16 + 1e-9))]] = 0
                with torch.no_grad():
                    points.append(model((image.flatten() * kept)[None]).softmax(-1)[0, target])
            rows.append(torch.stack(points))
        curves.append(torch.stack(rows))
    return curves[0], curves[1]


def test_pixel_perturbation_of_a_model_left_in_training_mode_are_its_eval_mode_curves():
    from bcos_plugins.metrics import IMAGE_FRACTIONS, pixel_perturbation

    model = _dropout_classifier().train()
    torch.manual_seed(1)
    images, maps = torch.rand(2, 1, 4, 4), torch.randn(2, 4, 4)
    got = pixel_perturbation(model, images, maps, 3)
    most, least = _pixel_curves_by_hand(model, images, maps, 3, IMAGE_FRACTIONS)
    # with dropout on, each perturbed image was scored by another random half of the features
    torch.testing.assert_close(got.most_first.double(), most, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.least_first.double(), least, rtol=1e-5, atol=1e-6)
    assert model.training and model[1].training  # the training flags are put back


@pytest.mark.parametrize("fractions", [(0.0, 0.25), (0.125, 0.25)])
def test_pixel_perturbation_refuses_a_forward_that_scores_the_same_images_differently(fractions):
    from bcos_plugins.metrics import pixel_perturbation

    model = _dropout_classifier().train()
    torch.manual_seed(1)
    images, maps = torch.rand(2, 1, 4, 4), torch.randn(2, 4, 4)
    # a function around the model (as the docstring's lambda e: model(encoded_pixel_values=e)) hides it from eval mode
    with pytest.raises(BcosValueError, match=r"forward: scored the same images differently.*model\.eval\(\)"):
        pixel_perturbation(lambda x: model(x), images, maps, 3, fractions=fractions)
    model.eval()
    got = pixel_perturbation(lambda x: model(x), images, maps, 3, fractions=fractions)
    most, _ = _pixel_curves_by_hand(model, images, maps, 3, fractions)
    torch.testing.assert_close(got.most_first.double(), most, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("keywords", "name"), [({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
                                                 ({"fractions": 0.25}, "fractions")])
def test_pixel_perturbation_names_a_seed_or_fractions_of_the_wrong_type(keywords, name):
    from bcos_plugins.metrics import pixel_perturbation

    model = _dropout_classifier().eval()
    with pytest.raises(BcosTypeError, match=rf"^{name}: "):
        pixel_perturbation(model, torch.rand(1, 1, 4, 4), torch.randn(1, 4, 4), 0, **keywords)


@pytest.mark.parametrize(("keywords", "name"), [({"seed": 0.5}, "seed"), ({"most_important_first": "no"},
                                                                           "most_important_first"),
                                                 ({"most_important_first": None}, "most_important_first")])
def test_pixel_ranking_names_a_seed_or_order_of_the_wrong_type(keywords, name):
    from bcos_plugins.metrics import pixel_ranking

    with pytest.raises(BcosTypeError, match=rf"^{name}: "):
        pixel_ranking(torch.randn(1, 4, 4), **keywords)


# ------------------------------------------------------------------ next_token_contrast: a model without next-token logits


@pytest.mark.parametrize("class_name", ["GPT2ForSequenceClassification", "GPT2Model", "LlamaForSequenceClassification"])
def test_next_token_contrast_names_a_model_without_next_token_logits(class_name):
    from conftest import padded_rows, tiny_model

    from bcos_plugins.metrics import next_token_contrast

    if class_name == "GPT2Model":
        import transformers as T
        from conftest import tiny_config

        torch.manual_seed(0)
        model = T.GPT2Model(tiny_config("gpt2")).eval()
    else:
        model = tiny_model(class_name)
    ids, mask = padded_rows([5, 3, 7], 7, "left", 0)
    with pytest.raises(BcosTypeError, match=rf"^model: {class_name} returns .* not next-token logits.*causal LM"):
        next_token_contrast(model, ids, mask, target=1, foil=2)


# ------------------------------------------------------------------ SeqPG examples and HTML rows: texts and tokens by type


def _keyword_model_and_tokenizer():
    from test_metrics_faithfulness import KeywordModel, _word_tokenizer

    tok, vocab = _word_tokenizer([f"{c}{i}" for c in "abc" for i in range(10)] + ["x"])
    return KeywordModel(vocab), tok


@pytest.mark.parametrize("texts", ["a1 a2", ["a1 a2 a3 x x", None, "c1 c2 c3 c4 c5", "b7 b8 b9 x x", "a4"]])
def test_make_seqpg_examples_names_texts_that_are_not_a_list_of_strings(texts):
    from bcos_plugins.metrics import make_seqpg_examples

    model, tok = _keyword_model_and_tokenizer()
    # one string was five texts of one character each (refused as "fewer than two classes ... Lower min_confidence");
    # a None failed inside the tokenizer ("TextEncodeInput must be Union[...]")
    with pytest.raises(BcosTypeError, match=r"^texts: "):
        make_seqpg_examples(model, tok, texts, [0, 1, 2, 1, 0], segment_length=1)


@pytest.mark.parametrize("tokens", [[3, 7], ["a", None], torch.tensor([3, 7])])
def test_tokens_to_html_names_tokens_that_are_not_strings(tokens):
    from bcos_plugins.visualize import tokens_to_html

    # token ids were drawn into the page builder and failed there: "'int' object is not iterable"
    with pytest.raises(BcosTypeError, match=r"^tokens: must be a list of strings.*convert_ids_to_tokens"):
        tokens_to_html(tokens, [1.0, -2.0])


# ------------------------------------------------------------------ perturbation: an unknown word is a token of the text


def test_perturbation_curves_remove_an_unknown_word_like_any_other_word():
    from test_pretrain import word_tokenizer

    from bcos_plugins.metrics import perturbation_curves, special_tokens_mask

    tok = word_tokenizer()
    model = _word_bert_classifier(tok)
    words = tok("w1 zzz w2 w3", add_special_tokens=False)["input_ids"]
    assert words[1] == tok.unk_token_id
    ids = torch.tensor([[tok.cls_token_id, *words, tok.sep_token_id, tok.pad_token_id]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    assert special_tokens_mask(tok, ids).tolist() == [[True, False, False, False, False, True, True]]
    scores = torch.tensor([[0.0, 0.1, 0.9, 0.2, 0.3, 0.0, 0.0]])  # the unknown word ranks first
    got = perturbation_curves(model, ids, mask, scores, tokenizer=tok, fractions=(0.25, 0.5))
    assert got.k.tolist() == [[1, 2]]  # shares of the four words

    def probability(removed: list[int]) -> torch.Tensor:
        keep = mask.clone()
        keep[0, removed] = 0
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=keep).logits.double().softmax(-1)[0]

    full = probability([])
    target = int(full.argmax())
    # by hand: comprehensiveness removes the top-k words, sufficiency the other words
    comprehensiveness = [full[target] - probability(r)[target] for r in ([2], [2, 4])]
    sufficiency = [full[target] - probability(r)[target] for r in ([1, 3, 4], [1, 3])]
    torch.testing.assert_close(got.comprehensiveness.double(), torch.stack(comprehensiveness)[None], rtol=0,
                               atol=1e-6)
    torch.testing.assert_close(got.sufficiency.double(), torch.stack(sufficiency)[None], rtol=0, atol=1e-6)


# ------------------------------------------------------------------ EncodedTexts: labels and max_length


@pytest.mark.parametrize("labels", [[0.7, 1, 2], [0, 1.0, 2], torch.tensor([0.0, 1.0, 2.0]), [0, True, 2]])
def test_encoded_texts_refuses_labels_that_are_not_integers(labels):
    from test_pretrain import word_tokenizer

    from bcos_plugins.encoded_texts import EncodedTexts

    # int(0.7) made the first text a text of class 0, silently
    with pytest.raises(BcosTypeError, match=r"^labels: "):
        EncodedTexts(word_tokenizer(), ["w1 w2", "w3", "w4 w5"], labels, 8)


def test_encoded_texts_keeps_integer_labels_of_any_container():
    import numpy as np
    from test_pretrain import word_tokenizer

    from bcos_plugins.encoded_texts import EncodedTexts

    for labels in ([0, 2, 1], np.array([0, 2, 1]), torch.tensor([0, 2, 1]), (np.int64(0), 2, 1)):
        dataset = EncodedTexts(word_tokenizer(), ["w1 w2", "w3", "w4 w5"], labels, 8)
        assert [dataset[i]["labels"] for i in range(3)] == [0, 2, 1]


@pytest.mark.parametrize(("max_length", "kind"), [(0, BcosValueError), (-1, BcosValueError), (1.5, BcosTypeError),
                                                  (True, BcosTypeError)])
def test_encoded_texts_names_a_max_length_that_is_not_a_length(max_length, kind):
    from test_pretrain import word_tokenizer

    from bcos_plugins.encoded_texts import EncodedTexts

    # 0 encoded every text as no token at all; -1 and 1.5 failed inside the tokenizer (OverflowError, TypeError)
    with pytest.raises(kind, match=r"^max_length: "):
        EncodedTexts(word_tokenizer(), ["w1 w2", "w3"], [0, 1], max_length)


# ------------------------------------------------------------------ load_blimp: a jsonl file of another shape


@pytest.mark.parametrize(("content", "match"), [
    ('{"one_prefix_method": true, "pairID": "7"}\n', r"pair '7' has one_prefix_method but no string \["),
    ('{"one_prefix_method": true, "one_prefix_prefix": "This", "one_prefix_word_good": 3, '
     '"one_prefix_word_bad": "x"}\n', r"no string \['one_prefix_word_good'\]"),
    ('\n{oops\n', r"line 2 is not JSON"),
    ('[1, 2]\n', r"line 1 is a JSON list, not an object"),
])
def test_load_blimp_names_a_line_or_pair_of_a_file_it_cannot_read(tmp_path, content, match):
    from bcos_plugins.data import load_blimp

    file = tmp_path / "pairs.jsonl"
    file.write_text(content, encoding="utf-8")
    # a bare KeyError ('one_prefix_prefix'), JSONDecodeError or AttributeError named neither the file nor the line
    with pytest.raises(BcosValueError, match=rf"^path: .*{match}"):
        load_blimp("dna", path=file)


# ------------------------------------------------------------------ explain_dataset: a NumPy array of ids


def test_explain_dataset_takes_a_numpy_array_of_one_target_per_text():
    import numpy as np
    from test_pretrain import word_tokenizer

    from bcos_plugins import bcosify, explain
    from bcos_plugins.corpus import explain_dataset

    tok = word_tokenizer()
    model = bcosify(_word_bert_classifier(tok))
    texts = ["w1 w2 w3", "w4", "w5 w6 w7"]
    # refused as "got ndarray array([2, 0, 1]), not a class id", though it is one int per text
    data = explain_dataset(model, tok, texts, target=np.array([2, 0, 1]), batch_size=2, progress=False)
    assert data["target"] == [2, 0, 1]
    for i, text in enumerate(texts):
        enc = tok([text], return_tensors="pt")
        alone = explain(model, enc["input_ids"], enc["attention_mask"], target=[2, 0, 1][i])
        assert data["scores"][i] == pytest.approx(alone.scores()[0].tolist(), abs=1e-6)
    with pytest.raises(BcosTypeError, match=r"^target: the value for text 0 is float"):
        explain_dataset(model, tok, texts, target=np.array([2.0, 0.0, 1.0]), progress=False)


# ------------------------------------------------------------------ perturbation_curves of an explanation of another class


def _bert_explanation_of_a_class_not_predicted():
    from conftest import padded_rows, tiny_model

    from bcos_plugins import bcosify, explain

    model = bcosify(tiny_model("BertForSequenceClassification"))
    ids, mask = padded_rows([6, 4], 6, "right", 0)
    ids[:, 0] = 2
    special = (ids == 2) | (mask == 0)
    with torch.no_grad():
        predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    other = (predicted + 1) % 3
    return model, ids, mask, special, explain(model, ids, mask, target=other), other


def test_perturbation_curves_of_an_explanation_track_the_class_it_explains():
    from bcos_plugins.metrics import perturbation_curves

    model, ids, mask, special, explanation, other = _bert_explanation_of_a_class_not_predicted()
    fractions = (0.25, 0.5)
    got = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=fractions)
    # the curves of the predicted class were computed from the attributions of another class, silently
    assert got.target.tolist() == other.tolist()
    scores = explanation.input_contributions.sum(-1)
    for row in range(2):
        keep = mask[row].bool()
        row_ids, row_scores, words = ids[row][keep][None], scores[row][keep], (~special[row][keep]).nonzero().flatten()
        ranked = sorted(words.tolist(), key=lambda j: (-float(row_scores[j]), j))

        def probability(removed, row_ids=row_ids, row=row):
            visible = torch.ones_like(row_ids)
            visible[0, removed] = 0
            with torch.no_grad():
                return model(input_ids=row_ids, attention_mask=visible).logits.double().softmax(-1)[0, other[row]]

        for f, p in enumerate(fractions):
            k = max(1, int(len(ranked) * p))
            assert got.comprehensiveness[row, f].item() == pytest.approx(
                (probability([]) - probability(ranked[:k])).item(), abs=1e-6)
            assert got.sufficiency[row, f].item() == pytest.approx(
                (probability([]) - probability(ranked[k:])).item(), abs=1e-6)


def test_perturbation_curves_refuse_a_target_or_input_ids_the_explanation_does_not_explain():
    from bcos_plugins.metrics import perturbation_curves

    model, ids, mask, special, explanation, other = _bert_explanation_of_a_class_not_predicted()
    with pytest.raises(BcosValueError, match=r"^target: is .* but the explanation explains"):
        perturbation_curves(model, ids, mask, explanation, special_tokens=special, target=(other + 1) % 3)
    shuffled = ids.clone()
    shuffled[0, 1], shuffled[0, 2] = ids[0, 2], ids[0, 1]
    with pytest.raises(BcosValueError, match=r"^attributions: explain other input_ids than those passed \(row \[0\]"):
        perturbation_curves(model, shuffled, mask, explanation, special_tokens=special)
    # the explanation's own target, passed again, is taken
    assert perturbation_curves(model, ids, mask, explanation, special_tokens=special,
                               target=other).target.tolist() == other.tolist()


def test_pixel_perturbation_refuses_a_target_the_image_explanation_does_not_explain(tiny_vits, vit_images):
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import explain_image

    model = tiny_vits["bcos"]
    images, targets = vit_images
    explanation = explain_image(model, images, target=targets)
    encoded = model.encode(images).detach()

    def forward(e):
        return model(encoded_pixel_values=e).logits

    # the maps of one class were scored on another class's confidence, silently
    with pytest.raises(BcosValueError, match=r"^target: is \[.*\] at rows \[0, 1, 2\], but the explanation explains"):
        pixel_perturbation(forward, encoded, explanation, (targets + 1) % 5)
    by_maps = pixel_perturbation(forward, encoded, explanation.contributions, targets)
    by_explanation = pixel_perturbation(forward, encoded, explanation, targets)
    assert torch.equal(by_maps.most_first, by_explanation.most_first)


@pytest.mark.parametrize("fractions", [torch.tensor(0.5), {0.1: 1.0, 0.5: 2.0}, {0.1, 0.5}])
def test_aopc_and_top_k_masks_refuse_fractions_that_are_not_an_ordered_sequence(fractions):
    from bcos_plugins.metrics import aopc, top_k_masks

    # a 0-d tensor failed with "iteration over a 0-d tensor"; a dict's keys were taken as the fractions
    with pytest.raises(BcosTypeError, match=r"^fractions: must be a sequence of floats"):
        aopc(torch.zeros(1, 2), fractions)
    with pytest.raises(BcosTypeError, match=r"^fractions: must be a sequence of floats"):
        top_k_masks(torch.randn(1, 4), torch.ones(1, 4, dtype=torch.bool), fractions)
    # an ordered sequence of the same values is taken, whatever its container
    assert aopc(torch.tensor([[0.0, 1.0]]), torch.tensor([0.1, 0.5])).item() == pytest.approx(0.2)


def test_make_seqpg_examples_refuses_a_b_cos_checkpoint_loaded_as_a_stock_model():

    from bcos_plugins.metrics import make_seqpg_examples

    keyword_model, tok = _keyword_model_and_tokenizer()
    stock = _word_bert_classifier(tok, layers=1)
    stock.config.bcos = {"b": 2.0}  # what plain transformers keeps of a saved B-cos model: its settings, stock modules
    texts = ["a1 a2 a3 x x", "b1 b2 b3 b4 x", "c1 c2 c3 c4 c5", "b7 b8 b9 x x"]
    # the segments were chosen by the stock model's confidence, silently (predict, perplexity, explain refuse it)
    with pytest.raises(BcosTypeError, match=r"^model: BertForSequenceClassification has B-cos settings"):
        make_seqpg_examples([keyword_model, stock], tok, texts, [0, 1, 2, 1], segment_length=4, min_confidence=0.0)


@pytest.mark.parametrize("segment_length", [11, 5])
def test_make_seqpg_examples_refuses_examples_longer_than_the_models_position_table(segment_length):

    from bcos_plugins.metrics import make_seqpg_examples

    _, tok = _keyword_model_and_tokenizer()
    model = _word_bert_classifier(tok, layers=1, positions=12)
    texts = [" ".join([word] * 12) for word in ("a1", "b1", "c1")]
    # 11: the segments alone (13 tokens) failed inside the embedding with a RuntimeError; 5: examples of 13 tokens
    # were built for a model of 12 positions, refused only when explained, naming input_ids
    with pytest.raises(BcosValueError, match=r"^segment_length: .* at most 12 positions .*segment_length <= 4"):
        make_seqpg_examples(model, tok, texts, [0, 1, 2], segment_length=segment_length, min_confidence=0.0)


def test_perturbation_curves_refuse_a_function_that_scores_the_same_rows_differently():
    from conftest import padded_rows, tiny_model

    from bcos_plugins.metrics import perturbation_curves

    model = tiny_model("BertForSequenceClassification").train()  # dropout 0.1
    ids, mask = padded_rows([6, 4], 6, "right", 0)
    ids[:, 0] = 2
    special = (mask == 0) | (ids == 2)  # [CLS] kept: the module's curves then remove the same tokens as a function's
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))

    def function(**kw):
        return model(**kw)

    # eval mode cannot reach a model inside a function: each perturbed row was scored with dropout on, silently
    with pytest.raises(BcosValueError, match=r"^model: scored the same rows differently.*model\.eval\(\)"):
        perturbation_curves(function, ids, mask, scores, special_tokens=special)
    model.eval()
    by_function = perturbation_curves(function, ids, mask, scores, special_tokens=special)
    by_module = perturbation_curves(model, ids, mask, scores, special_tokens=special)
    torch.testing.assert_close(by_function.comprehensiveness, by_module.comprehensiveness)
    torch.testing.assert_close(by_function.sufficiency, by_module.sufficiency)


# ------------------------------------------------------------------ perplexity / SeqPG: another model's tokenizer


def _named_word_tokenizer():
    from test_pretrain import word_tokenizer

    tok = word_tokenizer()
    tok.name_or_path = "word-level-tokenizer"  # as loaded from a folder of that name; its special ids are 0-4
    return tok


def test_perplexity_warns_about_another_models_tokenizer_whose_ids_fit():
    import transformers as T

    from bcos_plugins.errors import TokenizerMismatchWarning
    from bcos_plugins.metrics import perplexity

    tok = _named_word_tokenizer()
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=4, n_positions=40,
                                           bos_token_id=50, eos_token_id=50)).eval()
    model.config._name_or_path = "a-gpt2-model"  # its end-of-text token 50 is no special token of the tokenizer
    # the texts' ids fit the vocabulary, so they were scored as the model's own tokens (other texts), without a word
    with pytest.warns(TokenizerMismatchWarning, match=r"^tokenizer: .* looks like another model's"):
        perplexity(model, ["w1 w2 w3 w4"], tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenizerMismatchWarning)
        perplexity(model, [tok("w1 w2 w3 w4", add_special_tokens=False)["input_ids"]])  # ids: nothing to compare


def test_make_seqpg_examples_warns_about_another_models_tokenizer_whose_ids_fit():
    import transformers as T

    from bcos_plugins.errors import TokenizerMismatchWarning
    from bcos_plugins.metrics import make_seqpg_examples

    tok = _named_word_tokenizer()
    torch.manual_seed(0)
    model = T.GPT2ForSequenceClassification(T.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=4,
                                                         n_positions=40, num_labels=2, pad_token_id=0,
                                                         bos_token_id=50, eos_token_id=50)).eval()
    model.config._name_or_path = "a-gpt2-classifier"
    with pytest.warns(TokenizerMismatchWarning, match=r"^tokenizer: .* looks like another model's"), \
            pytest.raises(BcosValueError, match="min_confidence"):
        make_seqpg_examples(model, tok, ["w1 w2 w3", "w4 w5 w6"], [0, 1], segment_length=2, min_confidence=1.0)


# ------------------------------------------------------------------ explanations_to_html: label names


def _tiny_explanation():
    from test_pretrain import word_tokenizer

    from bcos_plugins import bcosify, explain

    tok = word_tokenizer()
    model = bcosify(_word_bert_classifier(tok, layers=1))
    enc = tok(["w1 w2", "w3"], return_tensors="pt", padding=True)
    return explain(model, enc["input_ids"], enc["attention_mask"], target=torch.tensor([2, 0])), tok


@pytest.mark.parametrize("label_names", ["abc", [0, 1, 2]])
def test_explanations_to_html_refuses_label_names_that_are_not_a_list_of_strings(label_names):
    from bcos_plugins.visualize import explanation_sections_to_html, explanations_to_html

    explanation, tok = _tiny_explanation()
    # one string named class 2 by its third character ('c'), silently
    with pytest.raises(BcosTypeError, match=r"^label_names: must be"):
        explanations_to_html(explanation, tok, label_names=label_names)
    with pytest.raises(BcosTypeError, match=r"^label_names: must be"):
        explanation_sections_to_html([("a", explanation)], tok, label_names=label_names)


def test_explanations_to_html_takes_label_names_as_a_numpy_array():
    import re

    import numpy as np

    from bcos_plugins.visualize import explanations_to_html

    explanation, tok = _tiny_explanation()
    # failed with "The truth value of an array with more than one element is ambiguous"
    page = explanations_to_html(explanation, tok, label_names=np.array(["neg", "mid", "pos"]))
    assert re.findall(r"explained: (\w+) —", page) == ["pos", "neg"]
