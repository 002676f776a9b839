"""Trust pass 20 (core) leftovers: what helper-110 noticed and left, each pinned by a test that failed before its fix."""

import math

import pytest
import torch
from conftest import write_seed_reports

from bcos_plugins.errors import BcosValueError

# ---------------------------------------------------------------- 1. paired_accuracy_difference's interval


def _table(n11: int, n12: int, n21: int, n22: int):
    """One seed's predictions whose 2x2 table is (both right, only b right, only a right, neither right)."""
    n = n11 + n12 + n21 + n22
    labels = [1] * n
    a = [1] * n11 + [0] * n12 + [1] * n21 + [0] * n22
    b = [1] * n11 + [1] * n12 + [0] * n21 + [0] * n22
    return a, b, labels


def test_one_seed_without_discordant_pairs_has_an_interval_of_nonzero_width():
    """One seed on which both variants were right and wrong on the same examples gave the Wald interval [0, 0]:
    non_inferior answered True at any margin, a certainty 40 examples cannot give."""
    from bcos_plugins.metrics import paired_accuracy_difference

    a, b, labels = _table(36, 0, 0, 4)
    r = paired_accuracy_difference(a, b, labels)
    assert r.difference == 0.0 and r.interval_over == "examples"
    assert r.ci_low < -0.05 and r.ci_high > 0.05
    assert not r.non_inferior(0.0) and not r.non_inferior(0.05)
    # all right on both: the Wilson interval of 40/40 still has width
    a, b, labels = _table(40, 0, 0, 0)
    r = paired_accuracy_difference(a, b, labels)
    assert r.ci_low < -0.05 and r.ci_high > 0.05


def test_one_seed_interval_is_newcombes_on_the_literatures_example():
    """Cavo et al. (2012) as tabled by Fagerland, Lydersen & Laake (Stat. Med. 2014; R package contingencytables,
    Newcombe_square_and_add_CI_paired_2x2): 59 / 6 / 16 / 80 gives -0.0621 (95 % CI -0.1186 to -0.0046)."""
    from bcos_plugins.metrics import paired_accuracy_difference

    a, b, labels = _table(59, 6, 16, 80)
    r = paired_accuracy_difference(a, b, labels)
    assert r.difference == pytest.approx(-10 / 161)
    assert round(r.ci_low, 4) == -0.1186 and round(r.ci_high, 4) == -0.0046
    # by hand from the formula (Wilson intervals of 65/161 and 75/161; A = 59*80 - 6*16 > n/2)
    z, n = 1.959963984540054, 161

    def wilson(k):
        p = k / n
        c, s = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (c - s) / (1 + z * z / n), (c + s) / (1 + z * z / n)

    (l1, u1), (l2, u2) = wilson(65), wilson(75)
    p1, p2 = 65 / n, 75 / n
    psi = (59 * 80 - 6 * 16 - n / 2) / math.sqrt(65 * 96 * 75 * 86)
    low = p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    high = p1 - p2 + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    assert r.ci_low == pytest.approx(low, abs=1e-12) and r.ci_high == pytest.approx(high, abs=1e-12)


def test_one_seed_interval_covers_the_true_difference_in_simulation():
    """Few discordant pairs (the Wald interval then often had zero width): 40 examples, P(only b right) = 0.06,
    P(only a right) = 0.01, true difference 0.05; the Wald interval covered it in 90 % of 600 draws (541), this one
    in 99 % (at least 93 % asked)."""
    from bcos_plugins.metrics import paired_accuracy_difference

    g = torch.Generator().manual_seed(0)
    probabilities = torch.tensor([0.8, 0.06, 0.01, 0.13])
    covered, draws = 0, 600
    for _ in range(draws):
        counts = torch.bincount(torch.multinomial(probabilities, 40, replacement=True, generator=g), minlength=4)
        r = paired_accuracy_difference(*_table(*counts.tolist()))
        covered += r.ci_low <= 0.05 <= r.ci_high
    assert covered / draws >= 0.93


def test_seeds_with_identical_differences_are_refused():
    """Two or more seeds with the same difference gave the t-interval [d, d]; non_inferior answered at any margin."""
    from bcos_plugins.metrics import paired_accuracy_difference

    labels = [0, 1, 1, 1]
    a = [[0, 1, 1, 0], [1, 1, 0, 0]]
    b = [[0, 1, 1, 1], [1, 1, 1, 0]]  # +0.25 on both seeds
    with pytest.raises(BcosValueError, match=r"^predictions_b: differ from predictions_a by \+0\.25 on each of the "
                       r"2 seeds.*no spread over seeds.*Pass the runs of more seeds"):
        paired_accuracy_difference(a, b, labels)
    with pytest.raises(BcosValueError, match="no spread over seeds"):
        paired_accuracy_difference(a, a, labels)
    one = paired_accuracy_difference(a[0], b[0], labels)  # the fix the message names: one seed, over the examples
    assert one.ci_low < 0.25 < one.ci_high


def test_the_reports_say_no_interval_for_seeds_with_identical_differences(tmp_path, capsys):
    """The two reports that call paired_accuracy_difference keep working when it refuses: the table says there is
    no interval (and bench_frontier's Δ column shows "–") instead of stopping the report."""
    from benchmarks import bench_frontier
    from benchmarks.common.paired_report import paired_report

    labels = [0, 1, 1, 0]
    base = {0: [0, 1, 0, 0], 1: [0, 0, 1, 0]}  # 3/4 on both seeds
    other = {0: [0, 1, 1, 0], 1: [0, 1, 1, 0]}  # 4/4 on both seeds: +0.25 twice
    files = write_seed_reports(tmp_path, labels, {"stock-vanilla": base, "stock-supervised": other})
    report = paired_report(files, "stock-vanilla", 0.01)["default/stock-supervised"]
    assert report["seeds"] == [0, 1] and "no spread over seeds" in report["no_interval"]
    assert "non_inferior" not in report and "no interval" in capsys.readouterr().out
    pairs = [({"predictions": base[s], "labels": labels}, {"predictions": other[s]}) for s in (0, 1)]
    columns = bench_frontier._accuracy_columns(pairs, "sst2")
    assert columns["sst2_accuracy"] == 100.0
    assert all(math.isnan(columns[f"sst2_accuracy_{end}"]) for end in ("diff", "low", "high"))
    assert bench_frontier._interval(columns, "sst2_accuracy") == "–"


# ---------------------------------------------------------------- 2. BcosViT.forward's keywords


def _tiny_vit():
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    return BcosViT(BcosViTConfig(image_size=8, num_channels=3, patch_size=4, hidden_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16, num_labels=3, conv_channels=[4])).eval()


def test_bcos_vit_forward_refuses_unknown_keywords_naming_the_accepted_ones():
    """A misspelt keyword (output_attention=True) was dropped silently: no attentions, no error."""
    from bcos_plugins.errors import BcosTypeError

    model, images = _tiny_vit(), torch.rand(2, 3, 8, 8)
    with pytest.raises(BcosTypeError, match=r"^output_attention: is not a keyword of BcosViT\.forward \(got "
                       r"\['output_attention'\]\).*output_attentions"):
        model(pixel_values=images, output_attention=True)
    with pytest.raises(BcosTypeError, match=r"got \['attention_mask', 'num_items_in_batch'\]"):
        model(images, attention_mask=torch.ones(2), num_items_in_batch=4)
    # what the package, Captum and transformers pass keeps working
    out = model(pixel_values=images, labels=torch.tensor([0, 2]), output_attentions=True, return_dict=True)
    assert out.loss is not None and len(out.attentions) == 1
    encoded = model.encode(images)
    assert torch.equal(model(encoded_pixel_values=encoded).logits, model(images).logits)


def _assert_trainer_loss_is_the_mean_of_two_micro_batches(tmp_path, model, input_name, inputs, labels):
    """transformers' Trainer, 2 accumulation steps of 2 rows, learning rate 0: the model must not claim to normalise
    its own loss (accepts_loss_kwargs), and the step's training loss must be the mean of the two micro-batch losses."""
    from transformers import Trainer, TrainingArguments

    with torch.no_grad():
        expected = (model(inputs[:2], labels=labels[:2]).loss + model(inputs[2:], labels=labels[2:]).loss) / 2
    rows = [{input_name: row, "labels": int(label)} for row, label in zip(inputs, labels, strict=True)]
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], gradient_accumulation_steps=2,
                             per_device_train_batch_size=2, max_steps=1, learning_rate=0.0, use_cpu=True,
                             save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    assert trainer.model_accepts_loss_kwargs is False
    assert trainer.train().training_loss == pytest.approx(float(expected), rel=1e-5)


def test_the_trainer_divides_a_bcos_vit_loss_by_the_accumulation_steps(tmp_path):
    """forward's **kwargs read to transformers' Trainer as "the model normalises over num_items_in_batch": it passed
    that count (ignored) and skipped dividing the per-batch mean loss by the accumulation steps (with 2 steps the
    loss was 1.385 for a mean micro-batch loss of 0.693, and its gradients twice too large)."""
    images = torch.stack([torch.full((3, 8, 8), i / 4) for i in range(4)])
    _assert_trainer_loss_is_the_mean_of_two_micro_batches(tmp_path, _tiny_vit(), "pixel_values", images,
                                                          torch.tensor([0, 1, 2, 0]))


def test_the_conventional_vit_refuses_unknown_keywords_and_its_trainer_loss_is_the_mean(tmp_path):
    """ConventionalViT.forward had the same **kwargs: a misspelt keyword ignored, and with 2 accumulation steps the
    Trainer's loss twice the mean micro-batch cross-entropy."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.vision import BcosViTConfig
    from bcos_plugins.vision.conventional import ConventionalViT

    torch.manual_seed(0)
    model = ConventionalViT(BcosViTConfig(image_size=8, num_channels=3, patch_size=4, hidden_size=8,
                                          num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                                          num_labels=3, conv_channels=[4])).eval()
    images, labels = torch.stack([torch.full((3, 8, 8), i / 4) for i in range(4)]), torch.tensor([0, 1, 2, 0])
    with pytest.raises(BcosTypeError, match=r"^output_attention: is not a keyword of ConventionalViT\.forward"):
        model(images, output_attention=True)
    assert len(model(pixel_values=images, output_attentions=True, return_dict=True).attentions) == 1
    _assert_trainer_loss_is_the_mean_of_two_micro_batches(tmp_path, model, "pixel_values", images, labels)


# ---------------------------------------------------------------- 3. SwishBetaToBilinear on a finalised model


def test_swish_beta_refuses_a_model_that_is_already_bilinear(tmp_path):
    """A second SwishBetaToBilinear(start_beta=1.0) on a finalised model put Swish_beta gates back on the down_proj
    that already held the gate's 1/2 (another model), and finalising again halved it a second time."""
    import transformers as T
    from datasets import Dataset

    from bcos_plugins.bilinear.swish_beta import SwishBetaToBilinear, set_swish_beta

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    ids = torch.randint(0, 40, (8, 12), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})

    def train(callback):
        args = T.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4,
                                   learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True)
        T.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

    train(SwishBetaToBilinear(anneal_fraction=0.5))
    assert model.config.hidden_act == "linear"
    down = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    with pytest.raises(BcosValueError, match=r"^model: is already bilinear: the gates of its gated MLPs \[0, 1\] "
                       r"are the identity.*without SwishBetaToBilinear"):
        train(SwishBetaToBilinear(anneal_fraction=0.5, start_beta=1.0))
    with pytest.raises(BcosValueError, match="already bilinear"):
        set_swish_beta(model, 0.0)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, down)
    assert isinstance(model.model.layers[0].mlp.act_fn, T.activations.LinearActivation)


# ---------------------------------------------------------------- 4. hosvd of tiny or huge weights


@pytest.mark.parametrize("scales", [(1e-60,) * 3, (1e-100,) * 3, (1e60,) * 3, (2.0 ** -600, 2.0 ** -600, 2.0 ** 600)])
def test_hosvd_of_tiny_or_huge_float64_weights_is_the_scaled_decomposition(scales):
    """The Gram matrix is the sixth power of the weights' scale: float64 weights of 1e-60 gave an empty decomposition
    (every sigma underflowed to 0) and 1e60 NaN; the decomposition scales as sigma * a * b * c, same directions
    (the last case: a product of the scales that underflows, of a layer whose own scale is 2^-600)."""
    from bcos_plugins.bilinear import bilinear_tensor, hosvd

    g = torch.Generator().manual_seed(0)
    W, V, P = (torch.randn(shape, generator=g, dtype=torch.float64) for shape in [(6, 4), (6, 4), (3, 6)])
    reference = hosvd((W, V, P))
    got = hosvd((W * scales[0], V * scales[1], P * scales[2]))
    scale = scales[0] * scales[1] * scales[2] if len(set(scales)) == 1 else 2.0 ** -600
    assert got.singular_values.numel() == 3
    torch.testing.assert_close(got.singular_values / scale, reference.singular_values, rtol=1e-12, atol=0)
    torch.testing.assert_close(got.output_directions.abs(), reference.output_directions.abs(), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.interaction_matrices.abs(), reference.interaction_matrices.abs(), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.reconstruct() / scale, bilinear_tensor((W, V, P)), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- 5. expected_random_reciprocal_rank of many tokens


def _exact_expected_rr(n: int, k: int):
    from fractions import Fraction

    return sum(Fraction(math.comb(n - r, k - 1), r) for r in range(1, n - k + 2)) / math.comb(n, k)


def test_expected_random_reciprocal_rank_of_many_candidates_is_exact():
    """The binomial coefficients overflowed a float: 2,000 candidates with 1,000 evidence tokens raised
    OverflowError ("integer division result too large for a float")."""
    from bcos_plugins.metrics import expected_random_reciprocal_rank

    for n, k in ((2000, 1000), (2000, 3), (1500, 1500), (1100, 1)):
        assert expected_random_reciprocal_rank(n, k) == pytest.approx(float(_exact_expected_rr(n, k)), rel=1e-12)
    n = 200_000  # one evidence token: the harmonic number over n
    assert expected_random_reciprocal_rank(n, 1) == pytest.approx(math.fsum(1 / r for r in range(1, n + 1)) / n,
                                                                  rel=1e-12)
    for n in range(1, 13):  # every small case, exactly
        for k in range(1, n + 1):
            assert expected_random_reciprocal_rank(n, k) == pytest.approx(float(_exact_expected_rr(n, k)), rel=1e-14)


def test_the_trainer_divides_a_space_model_loss_by_the_accumulation_steps(tmp_path):
    """SpaceModelForSequenceClassification.forward takes **kwargs (passed on to the encoder), which transformers'
    Trainer read as "the model normalises its loss over num_items_in_batch": it skipped dividing the per-batch mean
    loss by the accumulation steps (helper-113's reproduction: with 2 steps 1.842 for a mean micro-batch loss of
    0.941, and gradients twice too large)."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    config = tiny_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the Trainer trains: no dropout noise
    model = SpaceModelForSequenceClassification.from_encoder(T.BertModel(config), num_labels=3, n_latent=4).eval()
    ids = torch.randint(5, 50, (4, 6), generator=torch.Generator().manual_seed(1))
    _assert_trainer_loss_is_the_mean_of_two_micro_batches(tmp_path, model, "input_ids", ids,
                                                          torch.tensor([0, 1, 2, 0]))
