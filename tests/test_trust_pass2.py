"""Second trust pass: unusual but legal inputs to the public entry points, each checked against a number computed
another way (a silently wrong number is the worst defect). Tiny random models from the conformance configs.
"""

from __future__ import annotations

import copy
import warnings
from fractions import Fraction

import pytest
import torch
from conftest import VOCAB, padded_rows
from test_conformance import CONFIGS, _family, _stock

from bcos_plugins import bcosify, explain
from bcos_plugins.convert.architectures import stock_class
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.metrics import perturbation_curves, top_k_iou, top_k_masks

warnings.filterwarnings("ignore", category=DeprecationWarning)



def _bcos_llama():
    torch.manual_seed(0)
    return bcosify(stock_class("LlamaForCausalLM")(CONFIGS["Llama"]()).eval(), b=1.25, verbose=False)


# ------------------------------------------------------------------ attention masking under sliding windows

# every layer windowed, a window of 2 (the query and the token before it): removals empty many queries' windows
SLIDING = {"MistralForSequenceClassification": {"sliding_window": 2},
           "Gemma2ForSequenceClassification": {"sliding_window": 2, "layer_types": ["sliding_attention"] * 2}}


def _windowed(name: str, bcos: bool):
    config = CONFIGS[_family(name)]()
    for field, value in SLIDING[name].items():
        setattr(config, field, value)
    torch.manual_seed(0)
    model = stock_class(name)(config).eval()
    return bcosify(model, b=1.25, verbose=False) if bcos else model


@pytest.mark.parametrize("bcos", [False, True], ids=["stock", "bcos"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(SLIDING))
def test_attention_masking_under_a_sliding_window_is_the_row_without_the_removed_tokens(name, side, bcos):
    """Removing tokens through the attention mask can leave a query's sliding window with no visible key; eager
    attention then spreads that query's softmax over every column (padding and removed tokens included). Only removed
    and padding queries can be left so (a kept query sees itself), and no kept token reads them, provided the token
    the classifier reads is never removed: each curve value is then the model's probability on the row alone with the
    removed tokens masked, whatever their ids (here: replaced by others), up to float rounding."""
    model = _windowed(name, bcos)
    ids, mask = padded_rows([11, 7, 3], 11, side, seed=2)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    special = torch.zeros_like(mask, dtype=torch.bool)
    fractions = (0.2, 0.5, 0.9)
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=fractions)
    generator = torch.Generator().manual_seed(3)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        row_ids, row_scores = ids[row, real], scores[row, real]
        n = row_ids.numel()
        perturbable = torch.ones(1, n, dtype=torch.bool)
        perturbable[0, -1] = False  # the token the classifier reads stays
        top, _ = top_k_masks(row_scores[None], perturbable, fractions)
        target = int(curves.target[row])
        full = _probability_without(model, row_ids, torch.zeros(n, dtype=torch.bool), target, generator)
        assert float(curves.full_probability[row]) == pytest.approx(full, abs=1e-6)
        for f in range(len(fractions)):
            for curve, dropped in ((curves.comprehensiveness, top[0, f]),
                                   (curves.sufficiency, perturbable[0] & ~top[0, f])):
                removed = _probability_without(model, row_ids, dropped, target, generator)
                assert float(curve[row, f]) == pytest.approx(full - removed, abs=1e-5)


def _probability_without(model, row_ids, dropped, target: int, generator) -> float:
    """The probability of ``target`` on one unpadded row with the ``dropped`` tokens masked and their ids replaced by
    random others (a removed token's id must not matter)."""
    n = row_ids.numel()
    changed = torch.where(dropped, torch.randint(3, VOCAB, (n,), generator=generator), row_ids)
    with torch.no_grad():
        logits = model(input_ids=changed[None], attention_mask=(~dropped).long()[None],
                       position_ids=torch.arange(n)[None]).logits
    return float(logits.double().softmax(-1)[0, target])


# ------------------------------------------------------------------ shares of a row's tokens


def test_top_k_iou_takes_the_share_of_the_valid_tokens_it_is_given():
    """A float k of top_k_iou took ``int(n * k)`` in float32: 180 valid tokens at k=0.65 selected 116 instead of 117
    (75 of 40,000 (n, k) pairs off by one); it now counts as top_k_masks does (float64 with a margin)."""
    n = 180
    scores = torch.arange(n, 0, -1, dtype=torch.float32)[None]  # ranked by position
    gold = torch.zeros(1, n)
    gold[0, :117] = 1
    assert float(top_k_iou(scores, gold, k=0.65)) == 1.0
    for share in (0.05, 0.15, 0.35, 0.65, 0.7, 0.95):
        for n in (90, 170, 180, 330, 340, 997):
            want = max(1, int(Fraction(n) * Fraction(str(share))))  # the exact floor of the decimal share
            scores = torch.arange(n, 0, -1, dtype=torch.float32)[None]
            gold = torch.zeros(1, n)
            gold[0, :want] = 1
            iou = float(top_k_iou(scores, gold, k=share))
            assert iou == 1.0, f"n={n}, k={share}: IoU {iou} (selected {round(want * iou)} of the {want} wanted)"
            _, k = top_k_masks(scores, torch.ones(1, n, dtype=torch.bool), (share,))
            assert int(k) == want


@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_attention_masking_keeps_the_token_a_decoder_classifier_reads_before_a_real_pad_id(name):
    """A decoder classifier reads each row's last token whose id is not config.pad_token_id: a real token with that id
    at the end (an end-of-sequence token used as padding) is skipped. perturbation_curves kept the last real token by
    the mask instead, so the token the model reads could be 'removed' through the attention mask (its own embedding
    stays in the hidden state read). The curves are now those with the read token marked special, whatever its
    score."""
    model = _stock(name)
    pad = model.config.pad_token_id
    ids = torch.tensor([[5, 6, 7, 8, 9, pad], [5, 6, 7, 8, pad, pad], [9, 8, 7, 6, 5, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    read = torch.zeros_like(mask, dtype=torch.bool)
    read[0, 4] = read[1, 3] = read[2, 5] = True
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    read_first = scores.masked_fill(read, 100.0)
    none = torch.zeros_like(read)
    curves = perturbation_curves(model, ids, mask, read_first, special_tokens=none, fractions=(0.2, 0.5))
    kept_as_special = perturbation_curves(model, ids, mask, scores, special_tokens=read, fractions=(0.2, 0.5))
    for field in ("full_probability", "comprehensiveness", "sufficiency"):
        torch.testing.assert_close(getattr(curves, field), getattr(kept_as_special, field),
                                   msg=lambda m, f=field: f"{f}: {m}")


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "DistilBertForSequenceClassification",
                                  "RobertaForSequenceClassification"])
def test_attention_masking_keeps_the_first_column_a_classifier_reads(name):
    """A first-column classifier (BERT's [CLS] pooling) reads the first token's hidden state, which holds that token's
    own embedding whatever the attention mask says: with special_tokens that do not mark it, perturbation_curves
    'removed' it through the mask (the tiny B-cos BERT's probability moved 0.016, against 0.09 for the row without
    it). It is kept like a special token now, as a decoder classifier's read token is."""
    model = bcosify(_stock(name), b=1.25, verbose=False)
    pad = model.config.pad_token_id
    ids, mask = padded_rows([9, 6, 4], 9, "right", seed=4)
    ids = ids.masked_fill(mask == 0, pad)
    first = torch.zeros_like(mask, dtype=torch.bool)
    first[:, 0] = True
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    first_ranked_top = scores.masked_fill(first, 100.0)
    none = torch.zeros_like(first)
    curves = perturbation_curves(model, ids, mask, first_ranked_top, special_tokens=none, fractions=(0.2, 0.5, 0.9))
    kept_as_special = perturbation_curves(model, ids, mask, scores, special_tokens=first, fractions=(0.2, 0.5, 0.9))
    for field in ("k", "full_probability", "comprehensiveness", "sufficiency"):
        torch.testing.assert_close(getattr(curves, field), getattr(kept_as_special, field),
                                   msg=lambda m, f=field: f"{f}: {m}")


def test_a_removal_that_leaves_a_row_no_visible_token_is_refused():
    """Attention with every key masked spreads evenly over all of them, so a row left without a visible token still
    sees every 'removed' one: a model called as a plain function (no token kept by the registry) on a row of one
    perturbable token, or at fraction 1, got numbers as if nothing had been removed. Refused, naming the fix; a
    ModernBERT mean-pooling classifier's empty mean (NaN) gets the same refusal instead of 'returned NaN'."""
    bert = _stock("BertForSequenceClassification")
    ids, mask = padded_rows([6, 1, 4], 6, "right", seed=5)
    with torch.no_grad():  # why: every key masked, the output still depends on the masked tokens' ids
        masked = torch.zeros(1, 4, dtype=torch.long)
        assert not torch.allclose(bert(input_ids=ids[2:3, :4], attention_mask=masked).logits,
                                  bert(input_ids=torch.full((1, 4), 7), attention_mask=masked).logits)

    def as_a_function(input_ids, attention_mask):
        return bert(input_ids=input_ids, attention_mask=attention_mask).logits

    special = torch.zeros_like(mask, dtype=torch.bool)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    refusal = r"fractions: removing the top-k tokens through the attention mask leaves row \[1\] no visible token.*" \
              r"masking='mask_token'"
    with pytest.raises(BcosValueError, match=refusal):
        perturbation_curves(as_a_function, ids, mask, scores, special_tokens=special)
    with pytest.raises(BcosValueError, match=r"leaves rows \[0, 1, 2\] no visible token at fractions \[1.0\]"):
        perturbation_curves(as_a_function, ids[[0, 0, 2]], mask[[0, 0, 2]], scores, special_tokens=special,
                            fractions=(0.5, 1.0))
    mean_pooling = _stock("ModernBertForSequenceClassification")
    assert mean_pooling.config.classifier_pooling == "mean"
    with pytest.raises(BcosValueError, match=r"leaves rows \[0, 1, 2\] no visible token at fractions \[1.0\]"):
        perturbation_curves(mean_pooling, ids, mask, scores, special_tokens=special, fractions=(1.0,))
    # kept special tokens, or replacement by a mask token, leave every row something to attend to
    first = special.clone()
    first[:, 0] = True
    perturbation_curves(as_a_function, ids[[0, 2]], mask[[0, 2]], scores[[0, 2]], special_tokens=first[[0, 2]],
                        fractions=(1.0,))
    perturbation_curves(as_a_function, ids, mask, scores, special_tokens=special, masking="mask_token",
                        mask_token_id=3)


# ------------------------------------------------------------------ refusals that read the same on either padding side


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_negative_position_past_a_rows_first_token_is_outside_the_row_on_either_padding_side(side):
    """position=-2 on a row of one real token: right-padded it was 'outside row [1]', left-padded 'position: [7] of row
    [1] is a padding token ... pass a negative position' (an index the caller never wrote, and a fix already taken)."""
    from bcos_plugins.attribution import resolve_positions

    _, mask = padded_rows([9, 1, 5], 9, side, seed=0)
    with pytest.raises(BcosValueError, match=r"^position: \[-2\] is outside row\(s\) \[1\] .*negative positions count "
                                             r"back from each row's last real token"):
        resolve_positions(-2, mask)
    assert resolve_positions(-1, mask).tolist() == ([8, 0, 4] if side == "right" else [8, 8, 8])
    # a non-negative index of a padding column still says so
    with pytest.raises(BcosValueError, match=r"position: \[\d\] of row\(s\) \[1\] is a padding token"):
        resolve_positions(4, mask)


# ------------------------------------------------------------------ images


def test_images_of_another_dtype_than_the_vit_are_named():
    """NumPy images arrive as float64: a float32 B-cos ViT raised torch's 'expected scalar type Float but found Double'
    from inside its tokeniser; explain_image and the forward now name pixel_values and the cast."""
    from test_vision import images, tiny_vit

    from bcos_plugins import explain_image

    model = tiny_vit().float()
    with pytest.raises(BcosTypeError, match=r"pixel_values: are torch.float64 but the model's weights are "
                                            r"torch.float32.*pixel_values.to\(torch.float32\)"):
        explain_image(model, images(), target=1)
    with pytest.raises(BcosTypeError, match="pixel_values: are torch.float64"):
        model(pixel_values=images())
    cast = explain_image(model, images().float(), target=1)
    torch.testing.assert_close(cast.contributions.sum((1, 2)) + cast.position_contributions, cast.explained,
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ the numbers that report completeness


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_explanations_completeness_is_measured_in_float32(dtype):
    """Explanation.total (and so delta and completeness_error) and metrics.completeness_error summed a bfloat16
    explanation in bfloat16: 3 significant digits, so a row whose contributions miss the explained logit by 1e-3 of
    it reported 0.0 (tiny B-cos Llama), and others were off by the sum's rounding. They now sum in float32 and equal
    the float64 sum of the same half-precision contributions."""
    from bcos_plugins.metrics import completeness_error

    model = copy.deepcopy(_bcos_llama()).to(dtype)
    ids, mask = padded_rows([30, 17, 5], 30, "left", seed=2)
    expl = explain(model, ids, mask, target=5, position=-1)
    assert expl.input_contributions.dtype == dtype
    exact_total = expl.input_contributions.double().sum((1, 2))
    exact_error = (exact_total - expl.explained.double()).abs() / expl.explained.double().abs()
    assert expl.total.dtype == torch.float32
    torch.testing.assert_close(expl.total.double(), exact_total, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(expl.delta.double(), exact_total - expl.explained.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(expl.completeness_error.double(), exact_error, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(completeness_error(expl, expl.explained).double(), exact_error, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(completeness_error(expl.input_contributions, expl.explained).double(), exact_error,
                               rtol=1e-5, atol=1e-7)


def test_float64_scores_are_ranked_in_float64():
    """token_scores (every ranking metric's entry) and rationale_alignment cast float64 scores to float32: two tokens
    1e-9 apart (a float64 explanation's precision) tied, and the tie went to the earlier one, against the scores."""
    from bcos_plugins.metrics import rationale_alignment, token_scores

    scores = torch.tensor([[1.0, 1.0 + 1e-9, 0.5, -0.2]], dtype=torch.float64)
    assert token_scores(scores).dtype == torch.float64
    top, _ = top_k_masks(scores, torch.ones(1, 4, dtype=torch.bool), (0.25,))
    assert top[0, 0].tolist() == [False, True, False, False]
    gold = torch.tensor([[0, 1, 0, 0]])
    assert rationale_alignment(scores, gold, k=1).iou == 1.0
    assert rationale_alignment(scores, gold).auprc == 1.0
    summed = token_scores(torch.tensor([[[1.0, 1e-9], [1.0, 0.0]]], dtype=torch.float64))
    assert summed[0, 0] > summed[0, 1]


def test_float64_logits_give_float64_probabilities():
    """probability_gap and perturbation_curves took softmax in float32: a float64 model's logits 1e-9 apart gave a
    gap of exactly 0 (float64: 2.5e-10) and its curves float32 rounding."""
    from bcos_plugins.metrics import probability_gap

    logits = torch.tensor([[0.0, 1e-9, -3.0]], dtype=torch.float64)
    gap = probability_gap(logits, torch.tensor([1]), torch.tensor([0]))
    expected = logits.softmax(-1)[0, 1] - logits.softmax(-1)[0, 0]
    assert gap.dtype == torch.float64 and float(gap) == pytest.approx(float(expected), rel=1e-6) and float(gap) > 0

    model = _stock("BertForSequenceClassification").double()
    ids, mask = padded_rows([8, 5], 8, "right", seed=1)
    special = torch.zeros_like(mask, dtype=torch.bool)
    special[:, 0] = True
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,))
    assert curves.comprehensiveness.dtype == torch.float64
    with torch.no_grad():
        full = model(input_ids=ids[:1], attention_mask=mask[:1]).logits.softmax(-1)[0, curves.target[0]]
    assert float(curves.full_probability[0]) == pytest.approx(float(full), rel=1e-12)


def test_captum_records_of_a_contrastive_explanation_name_the_foil():
    """visualization_records labelled a contrastive explanation with its target class alone while attr_score (the
    sum of the scores) is the target - foil logit difference: the record read as the target's logit."""
    from bcos_plugins.adapters.captum import visualization_records
    from test_conformance import _word_tokenizer

    model = bcosify(_stock("BertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_rows([6, 4], 6, "right", seed=1)
    expl = explain(model, ids, mask, target=torch.tensor([2, 1]), foil=0)
    records = visualization_records(expl, _word_tokenizer(), label_names=["neg", "pos", "neutral"])
    assert [r.attr_class for r in records] == ["neutral − neg", "pos − neg"]
    for record, value in zip(records, expl.explained, strict=True):
        assert record.attr_score == pytest.approx(float(value), rel=1e-4, abs=1e-6)
    plain = visualization_records(explain(model, ids, mask, target=1), _word_tokenizer(), label_names=["a", "b", "c"])
    assert [r.attr_class for r in plain] == ["b", "b"]


def test_perturbation_curves_names_ids_past_the_models_vocabulary():
    """A mask_token_id or an input id past the model's embedding rows raised IndexError from inside the embedding (a
    device-side assert on a GPU); both are named now, as explain names input ids."""
    model = bcosify(_stock("BertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_rows([6, 4], 6, "right", seed=1)
    special = torch.zeros_like(mask, dtype=torch.bool)
    special[:, 0] = True
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BcosValueError, match=r"mask_token_id: must be in \[0, 59\], got 60"):
        perturbation_curves(model, ids, mask, scores, special_tokens=special, masking="mask_token", mask_token_id=60)
    past = ids.clone()
    past[1, 2] = VOCAB
    with pytest.raises(BcosValueError, match=r"input_ids"):
        perturbation_curves(model, past, mask, scores, special_tokens=special)
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, masking="mask_token",
                                 mask_token_id=VOCAB - 1)
    assert torch.isfinite(curves.comprehensiveness).all()


def test_a_model_with_return_dict_false_is_explained_as_with_true():
    """A model whose config.return_dict is False returns a tuple: explain, LayerBcos and perturbation_curves read
    `.logits` of it and crashed (AttributeError; perturbation_curves said "got ()"). Every path builds its call with
    rows_as_alone_call, which now asks for the output object."""
    from bcos_plugins.adapters.captum import LayerBcos
    from conftest import tiny_model

    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_rows([6, 4], 6, "right", seed=1)
    special = torch.zeros_like(mask, dtype=torch.bool)
    special[:, 0] = True
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    results = {}
    for return_dict in (True, False):
        model.config.return_dict = return_dict
        expl = explain(model, ids, mask, target=1)
        layer = LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
        curves = perturbation_curves(model, ids, mask, scores, special_tokens=special)
        results[return_dict] = (expl.input_contributions, expl.logits, layer, curves.comprehensiveness,
                                curves.sufficiency)
    for tuple_output, dict_output in zip(results[False], results[True], strict=True):
        torch.testing.assert_close(tuple_output, dict_output, rtol=0, atol=0)


def test_inseq_classifier_reads_a_tensor_target_as_class_ids():
    """BcosClassifier.attribute(target=torch.tensor(1)) raised TypeError (iteration over a 0-d tensor); a float or a
    bool target was truncated to a class (True read as class 1, 1.7 as 1) without a word."""
    from bcos_plugins.adapters.inseq import load_classifier
    from test_conformance import _word_tokenizer

    model = bcosify(_stock("BertForSequenceClassification"), b=1.25, verbose=False)
    classifier = load_classifier(model, _word_tokenizer())
    text = "w3 w7 w11 w5"

    def scores(target):
        (sequence,) = classifier.attribute(text, target=target).sequence_attributions
        return [t.id for t in sequence.target], sequence.source_attributions

    for tensor, plain in ((torch.tensor(1), 1), (torch.tensor([2, 0]), [2, 0])):
        got, expected = scores(tensor), scores(plain)
        assert got[0] == expected[0]
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
    for bad in (torch.tensor(1.0), torch.tensor([1.7]), True, [1.7], [True], torch.tensor([[1]])):
        with pytest.raises((BcosTypeError, BcosValueError), match=r"target"):
            classifier.attribute(text, target=bad)
    with pytest.raises(BcosValueError, match=r"target.*\[0, 3\)"):
        classifier.attribute(text, target=torch.tensor(3))


def test_visualize_caption_of_mean_reduced_scores_does_not_read_as_the_value():
    """The caption said "sum of contributions" for reduce="mean" scores too, whose sum is the value / d_model: a
    complete explanation read as off by a factor of d_model. It now scales the sum back and says so."""
    import re

    from conftest import tiny_model

    from bcos_plugins.visualize import explanations_to_html

    class Tokenizer:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_rows([6, 4], 6, "right", seed=1)
    for reduce in ("sum", "mean"):
        expl = explain(model, ids, mask, target=1, reduce=reduce)
        captions = re.findall(r"<div class=\"meta\">([^<]*)</div>", explanations_to_html(expl, Tokenizer()))
        assert len(captions) == 2
        for caption, value, scores in zip(captions, expl.explained, expl.scores(), strict=True):
            if reduce == "sum":
                assert caption.endswith(f"sum of contributions {float(scores.sum()):.4g}")  # .4f before pass 14
                continue
            match = re.search(r"each a mean over 32 features\) (\S+) × 32 = (\S+)$", caption)
            assert match is not None, caption
            assert float(match[1]) == pytest.approx(float(scores.sum()), abs=1e-4)
            assert float(match[2]) == pytest.approx(float(value), abs=1e-3)


def test_return_dict_false_passed_by_the_caller_is_refused_naming_it():
    """A return_dict=False in the forward arguments replaced the output object by a tuple and crashed with an
    AttributeError from inside the path; it is refused, naming the argument and the fix."""
    from conftest import tiny_model

    from bcos_plugins.errors import BcosValueError

    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.25, verbose=False)
    ids, mask = padded_rows([6, 4], 6, "right", seed=1)
    with pytest.raises(BcosValueError, match=r"return_dict.*got False.*leave return_dict out"):
        explain(model, ids, mask, target=1, return_dict=False)
    assert torch.equal(explain(model, ids, mask, target=1, return_dict=True).logits,
                       explain(model, ids, mask, target=1).logits)
