"""Trust pass 24, evaluation (helper-179): the metrics given contrastive explanations, left-padded decoder batches,
deletion baselines, step schemes and the benchmarks' reading of them, each checked against a hand computation (one
test per finding; the tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import TINY_VIT_SHAPE, padded_rows, tiny_config

from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bcos_bert(seed: int = 0):
    from bcos_plugins import bcosify

    torch.manual_seed(seed)
    return bcosify(T.BertForSequenceClassification(tiny_config("bert")), verbose=False).eval().double()


# ------------------------------------------------------------------ contrastive explanations: the curves of the contrast


def test_perturbation_curves_of_a_contrastive_explanation_track_the_probability_gap():
    """``explain(..., target=, foil=)`` ranks evidence for target - foil, but its curves tracked P(target) alone: a
    token that only counted against the foil ranked first without moving P(target), silently (the gap's drop is 0.0128 by
    hand, the curve read -0.0015). Now they track P(target) - P(foil), the contrast it explains, and say so (``foil``)."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import PerturbationCurves, perturbation_curves

    model = _bcos_bert()
    ids, mask = padded_rows([7, 5], 8, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    contrast = explain(model, ids, mask, target=torch.tensor([0, 1]), foil=torch.tensor([2, 2]))
    curves = perturbation_curves(model, ids, mask, contrast, special_tokens=special, fractions=(0.2, 0.5))
    # by hand, row 0 alone: 6 perturbable tokens (position 0 special), the top 3 by contribution removed at p = 0.5
    row = ids[:1, :7]
    top = contrast.contributions[0, 1:7].argsort(descending=True, stable=True)[:3] + 1
    removed = torch.ones_like(row)
    removed[0, top] = 0
    with torch.no_grad():
        full = model(input_ids=row, attention_mask=torch.ones_like(row)).logits.softmax(-1)[0]
        perturbed = model(input_ids=row, attention_mask=removed).logits.softmax(-1)[0]
    gap = float((full[0] - full[2]) - (perturbed[0] - perturbed[2]))
    assert float(curves.comprehensiveness[0, 1]) == pytest.approx(gap, abs=1e-12)
    assert abs(float(full[0] - perturbed[0]) - gap) > 1e-3  # the target's drop alone is another number
    assert float(curves.full_probability[0]) == pytest.approx(float(full[0] - full[2]), abs=1e-12)
    assert curves.foil.tolist() == [2, 2] and curves.target.tolist() == [0, 1]
    # an explanation of the class alone keeps P(target), and its curves do not say foil
    plain = perturbation_curves(model, ids, mask, explain(model, ids, mask, target=torch.tensor([0, 1])),
                                special_tokens=special, fractions=(0.2, 0.5))
    assert plain.foil is None
    assert float(plain.full_probability[0]) == pytest.approx(float(full[0]), abs=1e-12)
    # one mean over curves of the two quantities would be neither
    with pytest.raises(BcosValueError, match=r"parts: mix curves of contrastive explanations"):
        PerturbationCurves.concatenate([curves, plain])
    assert PerturbationCurves.concatenate([curves, curves]).foil.tolist() == [2, 2, 2, 2]
    # a foil that is a direction of the output space has no class probability to subtract
    from bcos_plugins.attribution import Direction

    toward = explain(model, ids, mask, target=torch.tensor([0, 1]), foil=Direction(torch.tensor([0.0, 0.0, 1.0],
                                                                                                dtype=torch.float64)))
    with pytest.raises(BcosValueError, match=r"attributions: explain target - a Direction of the output space"):
        perturbation_curves(model, ids, mask, toward, special_tokens=special, fractions=(0.2, 0.5))


def test_pixel_perturbation_of_a_contrastive_explanation_tracks_the_explained_difference():
    """An image explanation made with a foil (target - foil) was scored on the target's confidence alone. Now its curves
    track the target's score minus the foil's: with ``score="logit"`` the unperturbed point is the explained value
    itself, and every point the logit difference of the perturbed image, by hand."""
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    target, foil = torch.tensor([0, 3, 4]), torch.tensor([1, 1, 1])
    contrast = explain_image(model, images, target=target, foil=foil)

    def forward(encoded):
        return model(encoded_pixel_values=encoded).logits

    encoded = model.encode(images)
    fractions = (0.0, 0.125, 0.25)
    curves = pixel_perturbation(forward, encoded, contrast, target, fractions=fractions, score="logit")
    torch.testing.assert_close(curves.most_first[:, 0], contrast.explained, rtol=1e-5, atol=1e-5)
    # by hand at 0.125: the 32 pixels of highest contribution zeroed (ties none: float maps)
    assert contrast.contributions.shape == (3, 16, 16)
    maps = contrast.contributions.flatten(1)
    removed = torch.zeros_like(maps, dtype=torch.bool)
    removed.scatter_(1, maps.argsort(dim=1, descending=True)[:, :32], True)
    perturbed = encoded.masked_fill(removed.reshape(3, 1, 16, 16), 0.0)
    with torch.no_grad():
        logits = forward(perturbed)
    rows = torch.arange(3)
    torch.testing.assert_close(curves.most_first[:, 1], logits[rows, target] - logits[rows, foil], rtol=1e-5, atol=1e-5)
    # softmax: the probability gap of the unperturbed images
    soft = pixel_perturbation(forward, encoded, contrast, target, fractions=fractions)
    with torch.no_grad():
        p = forward(encoded).softmax(-1)
    torch.testing.assert_close(soft.most_first[:, 0], p[rows, target] - p[rows, foil], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a causal LM explained before its last token


def test_rank_metrics_of_a_causal_explanation_at_an_earlier_position_rank_only_the_tokens_it_sees():
    """``explain(lm, ..., position=3)`` explains the output at column 3, which a causal model computes from columns 0-3
    alone; the rank metrics took the explanation's attention mask as the candidates, so the tokens after the position
    (contribution exactly 0) were ranked above every token of negative score: a reciprocal rank of 1/7 where the prefix
    explained alone gives 1/4, an AUPRC of 0.14 for 0.25, a top-50 % IoU of 0.25 for 0 (half of 8 tokens, not of 4),
    and the random baseline of 8 candidates. Now they rank the tokens the output sees, as the prefix alone; a masked
    LM's later tokens (which its output sees) stay candidates."""
    from bcos_plugins import bcosify, explain
    from bcos_plugins.metrics import (
        expected_random_reciprocal_rank,
        mean_reciprocal_rank,
        rationale_alignment,
        reciprocal_rank,
        top_k_iou,
    )

    torch.manual_seed(0)
    lm = bcosify(T.LlamaForCausalLM(tiny_config("llama")), verbose=False).eval().double()
    ids, mask = padded_rows([8, 8], 8, "right", seed=3)
    position, target, foil = torch.tensor([3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8])
    explanation = explain(lm, ids, mask, target=target, foil=foil, position=position)
    assert (explanation.input_contributions[0, 4:] == 0).all() and (explanation.input_contributions[1, 5:] == 0).all()
    evidence = torch.zeros_like(ids, dtype=torch.bool)
    evidence[0, 2] = evidence[1, 3] = True
    rr = reciprocal_rank(explanation, evidence)
    iou = top_k_iou(explanation, evidence.long(), k=0.5)
    ap = rationale_alignment(explanation, evidence.long()).auprc_per_row
    for row in range(2):
        end = int(position[row]) + 1
        prefix = ids[row:row + 1, :end]
        alone = explain(lm, prefix, torch.ones_like(prefix), target=target[row], foil=foil[row])
        # by hand: 1 / (1 + the prefix tokens scoring above the evidence token)
        scores = alone.contributions[0]
        hand = 1.0 / (1 + int((scores > scores[evidence[row, :end]]).sum()))
        assert float(rr[row]) == pytest.approx(hand, abs=1e-12)
        assert float(reciprocal_rank(alone, evidence[row:row + 1, :end])[0]) == pytest.approx(hand, abs=1e-12)
        assert float(iou[row]) == float(top_k_iou(alone, evidence[row:row + 1, :end].long(), k=0.5)[0])
        assert float(ap[row]) == pytest.approx(float(rationale_alignment(alone, evidence[row:row + 1, :end].long())
                                                     .auprc_per_row[0]), abs=1e-12)
    assert float(rr[1]) == 0.25  # the evidence token ranks 4th of the 5 tokens column 4 sees (it read 1/7)
    mrr = mean_reciprocal_rank(explanation, evidence)
    assert mrr.random == pytest.approx((expected_random_reciprocal_rank(4, 1) + expected_random_reciprocal_rank(5, 1))
                                       / 2, abs=1e-12)
    # a masked LM's output at a position sees the tokens after it: they stay candidates
    torch.manual_seed(0)
    mlm = bcosify(T.BertForMaskedLM(tiny_config("bert")), verbose=False).eval().double()
    masked = explain(mlm, ids, mask, target=target, position=position)
    assert (masked.input_contributions[0, 4:] != 0).any()
    torch.testing.assert_close(reciprocal_rank(masked, evidence),
                               reciprocal_rank(masked.contributions, evidence, mask.bool()), rtol=0, atol=0)


# ------------------------------------------------------------------ completeness of scores written as lists of rows


def test_completeness_error_reads_a_list_of_rows_as_the_other_metrics_do():
    """Scores written as a list of rows (``[[1, 2], [3, 4]]``, as ``explain_dataset``'s rows or ``tolist()`` give them)
    are ``(batch, pos)`` for every metric (``token_scores``), but ``completeness_error`` read each row as the
    attributions of one input and summed them column by column: exact scores (rows summing to 3 and 7) read an error of
    0.33 and 0.14, silently. Now the rows are one tensor; a tuple of tensors is still one per input (Captum's)."""
    import numpy as np

    from bcos_plugins.metrics import completeness_error, token_scores

    rows = [[1.0, 2.0], [3.0, 4.0]]
    assert token_scores(rows).sum(-1).tolist() == [3.0, 7.0]
    assert completeness_error(rows, [3.0, 7.0]).tolist() == [0.0, 0.0]
    assert completeness_error(rows, [3.0, 8.0]).tolist() == [0.0, 0.125]  # |7 - 8| / 8, by hand
    assert completeness_error(np.array(rows), [3.0, 7.0]).tolist() == [0.0, 0.0]
    # a tuple of tensors: one input's attributions each, summed per row (2 + 1 and 4 + 3)
    parts = (torch.tensor([[2.0], [4.0]]), torch.tensor([[1.0], [3.0]]))
    assert completeness_error(parts, [3.0, 7.0]).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------ explain_dataset's table given to the metrics


def test_metrics_name_explain_datasets_table_and_its_ragged_rows_and_score_them_padded():
    """``explain_dataset`` returns a table, one row per text with its scores without padding. Given to the metrics, it
    was refused as "got Dataset. Pass the attribution tensor" (``completeness_error``: "the attributions are a tensor"),
    and its ``scores`` column (rows of different lengths) as "got Column" / "got list. Pass a torch.Tensor", naming
    neither the problem nor the fix. Now both are named with the fix, and the padded rows with their mask score as the
    explanation of the padded batch does."""
    from torch.nn.utils.rnn import pad_sequence

    from bcos_plugins import bcosify, explain
    from bcos_plugins.corpus import explain_dataset
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics import (
        completeness_error,
        explanation_entropy,
        rationale_alignment,
        token_scores,
    )
    from bcos_plugins.pretrained import minilm_path

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    config = tiny_config("bert")
    config.vocab_size = tokenizer.vocab_size
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(config), verbose=False).eval()
    texts = ["a good movie indeed", "bad", "the plot was fine but long"]
    table = explain_dataset(model, tokenizer, texts, progress=False)
    for metric in (explanation_entropy, completeness_error, token_scores):
        with pytest.raises(BcosTypeError, match=r"^attributions: are a table of explained rows \(Dataset with a "
                                                r"'scores' column.*torch.nn.utils.rnn.pad_sequence"):
            metric(table)
    ragged = r"has rows of different lengths \[3, 6, 8\] \(e.g. explain_dataset's scores.*Pad the rows to one length"
    with pytest.raises(BcosTypeError, match="^attributions: " + ragged):
        explanation_entropy(table["scores"])
    with pytest.raises(BcosTypeError, match="^scores: " + ragged):
        rationale_alignment(list(table["scores"]), [[0] * len(row) for row in table["scores"]])
    # padded as the fix says, the rows score as the explanation of the padded batch
    scores = pad_sequence([torch.as_tensor(row) for row in table["scores"]], batch_first=True)
    mask = pad_sequence([torch.ones(len(row), dtype=torch.long) for row in table["scores"]], batch_first=True)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    batch = explain(model, encoded["input_ids"], encoded["attention_mask"])
    torch.testing.assert_close(explanation_entropy(scores, mask).double(), explanation_entropy(batch).double(), rtol=1e-5,
                               atol=1e-6)
    assert completeness_error(scores, table["explained"]).max() < 1e-5


# ------------------------------------------------------------------ a decoder classifier's mask token: the fix it names


def test_perturbation_curves_name_a_mask_token_that_is_not_the_pad_id_for_gpt2():
    """GPT-2's tokenizer has no mask token, so ``masking="mask_token"`` needs ``mask_token_id=``; its end-of-text token
    (the pad id its classifiers are given) is refused there, and the refusal suggested ``tokenizer.unk_token_id``,
    which for GPT-2 is that same id, refused again. Now the fix names the pad id to avoid and suggests the unknown token
    only where it is another id."""
    from importlib.resources import files

    from bcos_plugins import bcosify
    from bcos_plugins.metrics import perturbation_curves

    tokenizer = T.AutoTokenizer.from_pretrained(str(files("bcos_plugins.data") / "files" / "gpt2_tokenizer"))
    assert tokenizer.mask_token_id is None and tokenizer.unk_token_id == tokenizer.eos_token_id == 50256
    config = T.GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                          num_labels=3, pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = bcosify(T.GPT2ForSequenceClassification(config), verbose=False).eval().double()
    encoded = tokenizer(["a good movie", "bad film here"], return_tensors="pt")
    scores = torch.tensor([[0.3, 0.2, 0.1], [0.1, 0.2, 0.3]], dtype=torch.float64)
    with pytest.raises(BcosValueError, match=r"^mask_token_id: is 50256, GPT2ForSequenceClassification's "
                                             r"config.pad_token_id.*Pass another token id as mask_token_id \(not 50256; "
                                             r"e.g. the id of a neutral word of the vocabulary\)"):
        perturbation_curves(model, encoded["input_ids"], encoded["attention_mask"], scores, tokenizer=tokenizer,
                            masking="mask_token", mask_token_id=tokenizer.unk_token_id)
    # the id the fix asks for is taken: a neutral word's
    word = tokenizer(" the")["input_ids"][0]
    curves = perturbation_curves(model, encoded["input_ids"], encoded["attention_mask"], scores, tokenizer=tokenizer,
                                 masking="mask_token", mask_token_id=word, fractions=(0.5,))
    assert curves.k.tolist() == [[1], [1]]


# ------------------------------------------------------------------ huge float32 attributions summed over their features


def test_token_scores_of_float32_attributions_whose_sum_passes_float32s_range():
    """Finite float32 attributions ``(batch, pos, d)`` whose sum over ``d`` passes float32's range (3.4e38) read inf for
    those tokens: the top token was the tie rule's pick by position (token 0 for the larger token 1) and the entropy NaN
    or 0, silently. They are reduced in float64 there now, as the float64 attributions are, by hand."""
    from bcos_plugins.metrics import explanation_entropy, token_scores, top_k_masks

    attributions = torch.zeros(1, 3, 4)
    attributions[0, 0], attributions[0, 1], attributions[0, 2] = 1e38, 2e38, 0.5e38  # sums 4e38, 8e38, 2e38
    assert torch.isfinite(attributions).all()
    scores = token_scores(attributions)
    torch.testing.assert_close(scores, attributions.double().sum(-1), rtol=0, atol=0)
    top, _ = top_k_masks(attributions, torch.ones(1, 3, dtype=torch.bool), (0.34,))
    assert top[0, 0].tolist() == [False, True, False]
    p = torch.tensor([4.0, 8.0, 2.0], dtype=torch.float64) / 14  # the shares by hand
    hand = float(-(p * p.log()).sum())
    assert float(explanation_entropy(attributions, torch.ones(1, 3))[0]) == pytest.approx(hand, rel=1e-6)
    assert token_scores(torch.ones(1, 2, 3)).dtype == torch.float32  # scores that fit stay float32


# ------------------------------------------------------------------ an explanation scored on its model in bfloat16


def test_perturbation_curves_take_an_explanation_scored_on_its_own_model_in_bfloat16():
    """The check that an explanation was made for the scored model allows the rounding of the dtypes involved, but it
    read the model's logits after they were widened to float32: a float64 explanation scored on the same model cast to
    bfloat16 (a GPU evaluation) was refused as "made for another model" (0.0990 explained, 0.1021 in bfloat16). The
    model's own dtype counts now; another model's explanation is still refused in bfloat16."""
    import copy

    from bcos_plugins import explain
    from bcos_plugins.metrics import perturbation_curves

    model, other = _bcos_bert(seed=0), _bcos_bert(seed=3)
    ids, mask = padded_rows([7, 5, 9], 9, "right", seed=1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    explanation = explain(model, ids, mask)
    low = copy.deepcopy(model).bfloat16()
    curves = perturbation_curves(low, ids, mask, explanation, special_tokens=special, fractions=(0.5,))
    by_tensor = perturbation_curves(low, ids, mask, explanation.contributions, special_tokens=special,
                                    fractions=(0.5,), target=explanation.target)
    torch.testing.assert_close(curves.comprehensiveness, by_tensor.comprehensiveness, rtol=0, atol=0)
    with pytest.raises(BcosValueError, match="made for another model"):
        perturbation_curves(other.bfloat16(), ids, mask, explanation, special_tokens=special, fractions=(0.5,))


def test_pixel_perturbation_takes_an_explanation_scored_on_its_own_vit_in_bfloat16():
    """A float32 image explanation scored on the same ViT and images in bfloat16 was refused twice over: as "not the
    images the explanation was made of" (the encoding's 1 - x rounds one unit apart in bfloat16, compared within 1e-5)
    and as "made for another model" (logits compared after their widening to float32). Both checks allow the coarser
    dtype's rounding now; other images and another model are still refused."""
    import copy

    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    explanation = explain_image(model, images)
    low = copy.deepcopy(model).bfloat16()

    def forward(encoded):
        return low(encoded_pixel_values=encoded).logits

    encoded = low.encode(images.bfloat16())
    curves = pixel_perturbation(forward, encoded, explanation, explanation.target)
    by_tensor = pixel_perturbation(forward, encoded, explanation.contributions, explanation.target)
    torch.testing.assert_close(curves.area_between, by_tensor.area_between, rtol=0, atol=0)
    others = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    with pytest.raises(BcosValueError, match="inputs: are not the images the explanation was made of"):
        pixel_perturbation(forward, low.encode(others.bfloat16()), explanation, explanation.target)
    torch.manual_seed(5)
    another = BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval().bfloat16()
    with pytest.raises(BcosValueError, match="made for another model"):
        pixel_perturbation(lambda e: another(encoded_pixel_values=e).logits, encoded, explanation, explanation.target)
