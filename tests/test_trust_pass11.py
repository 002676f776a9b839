"""Trust pass 11: valid calls whose numbers or sizes are extreme (B values, scaled weights, tiny and huge values,
one-element sizes, degenerate metric inputs), each checked against an independent ground truth."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.bilinear import effective_rank, eigendecompose, interaction_spectra, l1_l2_sparsity


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1e20), (torch.float32, 1e-36), (torch.float64, 1e-36),
                                          (torch.float64, 1e-40), (torch.float32, 1e-40)])
def test_effective_rank_does_not_depend_on_the_scale_of_the_eigenvalues(dtype, scale):
    """(L1/L2)^2 is scale-free, but the squares in L2 overflowed (float32 eigenvalues of 1e20: L2 = inf, rank 0) or
    fell below the eps floor (1e-36: rank 1e-11 for 2.33), silently."""
    eigenvalues = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    expected = (3.5 ** 2) / 5.25
    assert effective_rank(eigenvalues.to(dtype)).item() == pytest.approx(expected, rel=1e-6)
    assert effective_rank((eigenvalues * scale).to(dtype)).item() == pytest.approx(expected, rel=1e-4)


def test_the_effective_rank_of_a_layer_with_large_weights_is_its_rank_at_unit_scale():
    """A float32 bilinear layer whose weights are 1e6 times larger has the same interaction spectra up to the factor
    1e18 (eigenvalues about 1e19-1e20), so the same effective rank; it read 0."""
    generator = torch.Generator().manual_seed(0)
    w, v, p = (torch.randn(*shape, generator=generator) for shape in ((8, 6), (8, 6), (4, 8)))
    u = torch.eye(4)
    unit = effective_rank(interaction_spectra((w, v, p), u))
    large = effective_rank(interaction_spectra((w * 1e6, v * 1e6, p * 1e6), u))
    assert unit.min() > 1
    torch.testing.assert_close(large, unit, rtol=1e-4, atol=0)
    assert effective_rank(eigendecompose((w * 1e6, v * 1e6, p * 1e6), u).eigenvalues).min() > 1


def test_l1_l2_sparsity_keeps_its_answers_for_zero_and_empty_vectors():
    assert l1_l2_sparsity(torch.zeros(2, 3)).tolist() == [0.0, 0.0]
    assert l1_l2_sparsity(torch.zeros(2, 0)).tolist() == [0.0, 0.0]
    assert l1_l2_sparsity(torch.tensor([[0, 0], [3, 4]])).tolist() == pytest.approx([0.0, 49 / 25])


@pytest.mark.parametrize("dtype, scale", [(torch.float64, 1e-35), (torch.float64, 1e-300), (torch.float32, 1e-40),
                                          (torch.float32, 1.0)])
def test_explanation_entropy_does_not_depend_on_the_scale_of_the_scores(dtype, scale):
    """The scores were divided by their total clamped at 1e-30: rows of tiny scores (a float64 B-cos ViT at B = 10
    explains logits of 1e-57) read as almost no entropy (1e-4 for 1.28 at 1e-35), silently."""
    from bcos_plugins.metrics.summary import explanation_entropy

    base = torch.tensor([[0.1, -0.4, 0.2, 0.3]], dtype=torch.float64)
    p = base.abs() / base.abs().sum()
    expected = float(-(p * p.log()).sum())
    got = explanation_entropy((base * scale).to(dtype)[..., None])
    assert got.item() == pytest.approx(expected, rel=1e-4)
    assert explanation_entropy(torch.zeros(1, 4, 1)).item() == 0


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1e-40), (torch.float32, 1e-39), (torch.float32, 1.0),
                                          (torch.float64, 1e-310)])
def test_grid_pointing_game_does_not_depend_on_the_scale_of_the_map(dtype, scale):
    """The share inside the cell was divided by the positive total clamped at finfo.tiny: a map of subnormal values
    (1e-40 in float32) scored 0.10 for a share of 0.75, silently."""
    from bcos_plugins.metrics.image import grid_pointing_game

    maps = torch.zeros(1, 4, 4, dtype=torch.float64)
    maps[0, :2, :2], maps[0, 2:, 2:] = 3, 1
    assert grid_pointing_game((maps * scale).to(dtype), 0).item() == pytest.approx(0.75, rel=1e-4)
    assert grid_pointing_game(torch.zeros(1, 4, 4), 0).item() == 0


def test_a_bootstrap_of_one_resample_is_refused_naming_n_resamples():
    """n_resamples=1 gave the interval [m, m] of that one resample's mean: [-0.53, -0.53] around a difference of
    -0.23, a zero-width interval that does not even hold the estimate."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a = torch.tensor([0.9, 0.1, 0.5, 0.4, 0.7])
    b = torch.tensor([0.2, 0.3, 0.1, 0.6, 0.2])
    with pytest.raises(BcosValueError, match=r"n_resamples: is 1, .*zero width.*Pass many resamples"):
        paired_bootstrap_difference(a, b, n_resamples=1)
    # the fewest a 95 % interval takes (each tail holds a resample; fewer are refused since session 25)
    fewest = paired_bootstrap_difference(a, b, n_resamples=40)
    assert fewest.ci_low <= fewest.ci_high


@pytest.mark.parametrize("explained", [1e-16, 1e-30, -1e-20])
def test_completeness_error_of_a_tiny_explained_value_is_relative_to_it(explained):
    """|explained| was clamped up to 1e-12 for every value below it, not only for 0: the error of a tiny logit (a B = 10
    model's are 1e-16, a float64 B-cos ViT's at B = 10 1e-57) read up to 1e12 times too small, so a 100 % miss of a
    logit of 1e-16 scored 1e-4 and looked complete."""
    from bcos_plugins.attribution import relative_completeness_error
    from bcos_plugins.metrics.summary import completeness_error

    value = torch.tensor([explained], dtype=torch.float64)
    assert completeness_error(torch.tensor([[explained, explained]], dtype=torch.float64), value).item() == (
        pytest.approx(1.0))
    assert relative_completeness_error(value / 2, value).item() == pytest.approx(0.5)
    # an explained value of exactly 0 keeps its documented floor: finite, 0 when exact, >= 1 once |delta| >= 1e-12
    zero = torch.zeros(1)
    assert completeness_error(torch.tensor([[0.5, -0.5]]), zero).item() == 0
    assert completeness_error(torch.tensor([[0.5, -0.25]]), zero).item() == pytest.approx(0.25 / 1e-12)
    # a subnormal explained value gives a finite (if huge) error, never inf
    assert torch.isfinite(relative_completeness_error(torch.ones(1), torch.tensor([1e-44]))).all()


def test_a_space_heads_large_classifier_bias_keeps_the_explained_value_exact():
    """context_attribution took the explained value as logit - bias: a float32 logit keeps the digits of its bias, so
    with a classifier bias of 1e6 the tokens' 0.01-0.3 came back as 0.0 or 0.0625 and completeness_error read up to
    1e10 for shares that were exact, without a refusal or a warning. The bias-free logit is now the head's forward
    without the bias (its weight over the masked mean of the concepts), and the model's logits are still checked to
    be that value plus the bias: a term beside the classifier is refused under a large bias too."""
    import warnings

    from conftest import padded_batch
    from test_space import space_model

    from bcos_plugins import BcosError
    from bcos_plugins.space import context_attribution

    model = space_model(n_latent=16)
    ids, mask = padded_batch()
    with torch.no_grad():
        model.head.classifier.bias.fill_(1e6)
    for foil in (None, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = context_attribution(model, ids, mask, target=0, foil=foil)
        out = model(input_ids=ids, attention_mask=mask)
        weights = mask.double() / mask.double().sum(1, keepdim=True)
        exact = torch.einsum("bpkl,bp->bkl", out.concepts.double(), weights).flatten(1) @ (
            model.head.classifier.weight.double().T)
        exact = exact[:, 0] - (0 if foil is None else exact[:, foil])
        torch.testing.assert_close(result.explained.double(), exact, rtol=1e-5, atol=1e-7)
        assert result.completeness_error.max() < 1e-5
        assert exact.abs().min() > 1e-3  # the values a bias of 1e6 rounded away in float32
        full = out.logits[:, 0] - (0 if foil is None else out.logits[:, foil])
        # the model's own logit (difference) is rounded to the digits of the bias: equal to within 2 ulps of 1e6
        torch.testing.assert_close(result.full_logits, full, rtol=0, atol=0.125)

    def add_a_term_no_share_carries(module, args, output):
        return output + 50.0  # 8e2 ulps of a logit of 1e6: not rounding

    handle = model.head.classifier.register_forward_hook(add_a_term_no_share_carries)
    try:
        with pytest.raises(BcosError, match=r"context_attribution: the token shares of row \d+ sum to .* the model's logit minus the classifier "
                                            r"bias is .* not the head's linear "
                                            r"classifier .*merge an adapter"):
            context_attribution(model, ids, mask, target=0)
    finally:
        handle.remove()


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_without_a_mask_is_explained_as_given_and_warned_about_once(side):
    """explain(model, ids) on a padded batch without attention_mask explained the padded rows with the padding attended
    to as tokens (a tiny B-cos GPT-2's padded row: -0.083 instead of -0.099 with the mask): exact for model(ids), which
    returns the same, but not the texts a newcomer meant, and transformers 5 warns only for some models. Now one
    UnmaskedPaddingWarning per call names attention_mask and the fix where the rows differ in the length of a run of
    config.pad_token_id at their start or end (explain, Captum's LayerBcos and EmbeddingForward.embed: the one
    token-batch check); the numbers are unchanged (a warning, not a refusal). Not warned: a call with a mask, a batch
    of one row, rows padded alike, a pad id inside a row, and, where the pad id is the eos id (GPT-2), one eos at a
    row's end."""
    import warnings

    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos
    from conftest import padded_batch, tiny_model

    from bcos_plugins import bcosify, explain
    from bcos_plugins.errors import UnmaskedPaddingWarning

    # pad id 0, the tiny models' config.pad_token_id; left padding: a decoder (a BERT classifier refuses it)
    if side == "right":
        model, kwargs = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False), {"target": 1}
    else:
        model, kwargs = bcosify(tiny_model("LlamaForCausalLM"), b=1.1, verbose=False), {"target": torch.tensor(7)}
    ids, mask = padded_batch(side=side)

    def warned(call):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = call()
        return out, [w for w in seen if issubclass(w.category, UnmaskedPaddingWarning)]

    unmasked, seen = warned(lambda: explain(model, ids, **kwargs))
    assert len(seen) == 1 and seen[0].filename == __file__  # shown at the caller's line
    assert str(seen[0].message).startswith("attention_mask: not given, but input_ids has rows of different lengths "
                                           "padded with config.pad_token_id (0)")
    assert "Pass the tokenizer's attention_mask with the ids" in str(seen[0].message)
    with torch.no_grad():  # explained as given: what model(ids) computes
        logits = model(input_ids=ids).logits
        torch.testing.assert_close(unmasked.explained, logits[:, 1] if side == "right" else logits[:, -1, 7])
    masked, seen = warned(lambda: explain(model, ids, mask, **kwargs))
    assert seen == [] and not torch.allclose(masked.explained[1:], unmasked.explained[1:])
    target = 1 if side == "right" else torch.tensor([7] * len(ids))
    for captum_call in (lambda: LayerBcos(model).attribute(ids, target=target),
                        lambda: EmbeddingForward(model).embed(ids)):
        assert len(warned(captum_call)[1]) == 1
    assert warned(lambda: LayerBcos(model).attribute(ids, target=target, additional_forward_args=(mask,)))[1] == []
    # not padding: one row; rows padded alike (equal lengths); no pad id at the ends
    assert warned(lambda: explain(model, ids[2:], **kwargs))[1] == []
    alike = ids[:1].repeat(2, 1)
    alike[:, -2:] = 0
    assert warned(lambda: explain(model, alike, **kwargs))[1] == []
    inner = ids[:1].repeat(2, 1)
    inner[1, 3:5] = 0  # a pad id inside a row is not a padding pattern
    assert warned(lambda: explain(model, inner, **kwargs))[1] == []

    # GPT-2 pads with its eos: one eos ending a row is text; two make the rows differ in length
    gpt2 = bcosify(tiny_model("GPT2LMHeadModel"), b=1.1, verbose=False)
    gpt2.config.eos_token_id = gpt2.config.bos_token_id = 0
    text = ids[:1].repeat(2, 1)
    text[0, -1] = 0
    assert warned(lambda: explain(gpt2, text, target=torch.tensor([5, 6])))[1] == []
    text[0, -2:] = 0
    assert len(warned(lambda: explain(gpt2, text, target=torch.tensor([5, 6])))[1]) == 1


def test_every_other_token_path_warns_about_a_padded_batch_without_its_mask():
    """0e9a9f6 warned about a padded batch without attention_mask on explain and Captum only: the TransformerLens
    adapter (explain_logits, token_component_decomposition: the tokenizer's pad id, else cfg.pad_token_id), the Space
    model's forward and the metrics that take ids (next_token_contrast, perturbation_curves) computed on the padding
    as tokens, silently. Now each runs the one token-batch check's detection: one UnmaskedPaddingWarning for the
    padded batch without its mask, none with the mask or for an unpadded batch."""
    import warnings

    from test_token_batch_check import GPT2, _ids, _paths, lens_model

    from bcos_plugins.errors import UnmaskedPaddingWarning

    ids = _ids()  # ids 3..39, no pad id (0)
    padded, mask = ids.clone(), torch.ones_like(ids)
    padded[1, -2:], mask[1, -2:] = 0, 0  # right padding: the second row is 3 tokens long
    lens = lens_model(*GPT2)
    had = getattr(lens.cfg, "pad_token_id", None)
    lens.cfg.pad_token_id = 0  # the test lens has no tokenizer: the cfg's pad id is read
    try:
        for name, call in _paths().items():
            if name in ("explain", "captum EmbeddingForward.embed"):
                continue  # 0e9a9f6's test

            def warned(ids, mask, call=call):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    call(ids, mask)
                return [w for w in seen if issubclass(w.category, UnmaskedPaddingWarning)]

            seen = warned(padded, None)
            assert len(seen) == 1, name
            assert str(seen[0].message).startswith("attention_mask: not given, but "), name
            assert warned(padded, mask) == [], name
            assert warned(ids, None) == [], name
    finally:
        if had is None:
            del lens.cfg.pad_token_id
        else:
            lens.cfg.pad_token_id = had


def test_perplexity_warns_about_a_padded_tensor_of_ids_passed_as_texts():
    """perplexity(model, ids) with a padded (batch, pos) tensor read each row as given and scored its padding as
    tokens, silently (it takes no mask). Now the one detection warns, with a fix that drops the padding; the rows
    without their padding, and an unpadded tensor, are not warned about."""
    import warnings

    from test_token_batch_check import GPT2, _ids, bcos_model

    from bcos_plugins.errors import UnmaskedPaddingWarning
    from bcos_plugins.metrics import perplexity

    model = bcos_model(*GPT2)  # config.pad_token_id 0
    ids = _ids()
    padded, mask = ids.clone(), torch.ones_like(ids)
    padded[1, -2:], mask[1, -2:] = 0, 0

    def warned(texts):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = perplexity(model, texts, max_length=8)
        return result, [w for w in seen if issubclass(w.category, UnmaskedPaddingWarning)]

    as_given, seen = warned(padded)
    assert len(seen) == 1 and seen[0].filename == __file__
    assert str(seen[0].message).startswith("texts has rows of different lengths padded with config.pad_token_id (0)")
    trimmed, seen = warned([row[m.bool()] for row, m in zip(padded, mask, strict=True)])
    assert seen == [] and trimmed.n_tokens < as_given.n_tokens  # the padding was scored as tokens
    assert warned(ids)[1] == []


def test_the_transformer_bridge_paths_warn_about_a_padded_batch_without_its_mask():
    """The same for a TransformerBridge (its tokenizer's pad id): explain_logits and token_component_decomposition
    warn once for a padded batch without its mask, not with the mask nor for an unpadded batch."""
    import warnings

    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition
    from test_lens_bridge import built

    from bcos_plugins.errors import UnmaskedPaddingWarning

    bridge = built("bcos_gpt2")[3]
    pad = bridge.tokenizer.pad_token_id if bridge.tokenizer.pad_token_id is not None else bridge.cfg.pad_token_id
    ids = torch.randint(3, 30, (2, 7), generator=torch.Generator().manual_seed(0))
    padded, mask = ids.clone(), torch.ones_like(ids)
    padded[1, -3:], mask[1, -3:] = pad, 0  # three pad ids: padding even where the pad id is also eos
    for call in (lambda ids, mask: explain_logits(bridge, ids, target=5, attention_mask=mask),
                 lambda ids, mask: token_component_decomposition(bridge, ids, attention_mask=mask)):
        def warned(ids, mask, call=call):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                call(ids, mask)
            return [w for w in seen if issubclass(w.category, UnmaskedPaddingWarning)]

        assert len(warned(padded, None)) == 1
        assert warned(padded, mask) == []
        assert warned(ids, None) == []
