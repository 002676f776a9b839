"""Session 25, closing note 24's "possibly silent" items (helper-174): each test pins one decision and fails on the
code before it."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.errors import BcosValueError

# ------------------------------------------------------------------ a. channels-last image maps


def _channels_last_grid_map(channels: int) -> torch.Tensor:
    """A channels-last ``(1, 8, 8, C)`` map of a 2x2 grid of 4x4 images whose positive mass is all in cell 0."""
    maps = torch.zeros(1, 8, 8, channels)
    maps[0, :4, :4, :] = 1.0
    return maps


@pytest.mark.parametrize(("channels", "grid"), [(4, (2, 2)), (3, (2, 1)), (1, (2, 1))])
def test_grid_pointing_game_refuses_a_channels_last_map_it_read_as_channels_first(channels, grid):
    """A channels-last ``(n, H, W, C)`` map was read as ``(n, C, H, W)``: summed over its rows, its columns taken for
    channels. Where the sides divided by the grid it gave 0.5 for a map whose mass is all in the explained cell (1.0),
    silently. Refused now, naming the argument, the shape and the fix; the permuted map gives 1.0."""
    from bcos_plugins.metrics.image import grid_pointing_game

    maps = _channels_last_grid_map(channels)
    with pytest.raises(BcosValueError, match=rf"^attributions: look channels-last: shape \(1, 8, 8, {channels}\) is "
                                             r"read as \(batch, C, H, W\).*Pass attributions\.permute\(0, 3, 1, 2\)"):
        grid_pointing_game(maps, 0, grid=grid)
    assert grid_pointing_game(maps.permute(0, 3, 1, 2), 0, grid=grid).item() == 1.0


def test_pixel_ranking_and_perturbation_refuse_a_channels_last_map():
    """The siblings that read maps the same way (``_spatial``): ``pixel_ranking`` ranked 24 "pixels" of an 8x8x3 map
    (its 8 columns x 3 channels), silently; ``pixel_perturbation`` refuses it with the same message."""
    from bcos_plugins.metrics.image import pixel_perturbation, pixel_ranking

    maps = torch.rand(2, 8, 8, 3)
    with pytest.raises(BcosValueError, match=r"^attributions: look channels-last: shape \(2, 8, 8, 3\)"):
        pixel_ranking(maps)
    assert pixel_ranking(maps.permute(0, 3, 1, 2)).shape == (2, 64)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    with pytest.raises(BcosValueError, match=r"^attributions: look channels-last: shape \(2, 8, 8, 3\)"):
        pixel_perturbation(model, torch.rand(2, 3, 8, 8), maps, 0)


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 6, 4, 4), (2, 2, 4, 3), (2, 1, 5, 1), (2, 8, 8)])
def test_channels_first_and_plain_maps_are_still_read_as_before(shape):
    """Channels-first maps (the B-cos encodings' 2 or 6 channels included, where the width is also a channel count),
    an ambiguous map whose second side is a channel count too, and ``(n, H, W)`` maps are read as before."""
    from bcos_plugins.metrics.image import pixel_ranking

    maps = torch.randn(shape)
    summed = maps.sum(dim=1) if maps.ndim == 4 else maps
    torch.testing.assert_close(pixel_ranking(maps), pixel_ranking(summed), rtol=0, atol=0)


# ------------------------------------------------------------------ b. inseq: deltas after merging tokens


@pytest.fixture(scope="module")
def inseq_attributed():
    """One "bcos" attribution of a prompt of 5 tokens and 3 generated ones, with its logit step score."""
    import warnings

    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    import transformers as T
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    return attribution_model.attribute("The cat sat on the", generation_args={"max_new_tokens": 3, "do_sample": False},
                                       step_scores=["logit"], show_progress=False)


@pytest.mark.parametrize(("aggregator", "kwargs"), [
    ("spans", {"target_spans": (1, 3), "aggregate_fn": "absmax"}),
    ("spans", {"target_spans": (1, 3), "aggregate_fn": "mean"}),
    ("spans", {"target_spans": (1, 3), "aggregate_fn": "vnorm"}),
    ("spans", {"target_spans": (5, 8), "aggregate_fn": "mean"}),
    ("spans", {"target_spans": (5, 8), "aggregate_fn": "absmax"}),
    ("spans", {"target_spans": (5, 7), "aggregate_fn": "sum"}),
    ("subwords", {"special_chars": ("Ġ",), "aggregate_fn": "mean"}),
    ("subwords", {"special_chars": ("Ġ",), "aggregate_fn": "absmax"}),
    ([("spans", "mean"), ("scores", "sum")], {"target_spans": (1, 3)}),
    ("spans", {"target_spans": (1, 3)}),
    ("subwords", {"special_chars": ("Ġ",)}),
    ("spans", {"target_spans": (5, 8)}),
])
def test_inseq_merging_tokens_restates_deltas_against_the_merged_columns(inseq_attributed, aggregator, kwargs):
    """A "spans" / "subwords" merge with an ``aggregate_fn`` other than the default (``"mean"``, ``"absmax"``,
    ``"vnorm"``, or inseq's plain ``"sum"``, which turns a merged cell holding a token not generated yet into NaN)
    merged the step score ``deltas`` with the same function, so the columns shown summed 0.05 to 0.66 away from their
    logit while ``deltas`` still said ~1e-8, silently. ``deltas`` is now restated after every merge: the columns shown
    minus the attributed value merged as the step score ``logit`` is (so ``sum - deltas`` is that logit again); the
    default merges (present-sum, logits summed) keep the deltas they had, to float rounding."""
    import copy

    before = copy.deepcopy(inseq_attributed.sequence_attributions[0].step_scores["deltas"])
    merged = inseq_attributed.aggregate(aggregator, **kwargs)
    if merged.sequence_attributions[0].target_attributions.ndim == 3:
        merged = merged.aggregate()
    seq = merged.sequence_attributions[0]
    totals = torch.nansum(seq.target_attributions.double(), dim=0)
    assert "_bcos_explained_value" not in seq.step_scores
    torch.testing.assert_close(totals - seq.step_scores["deltas"].double(), seq.step_scores["logit"].double(),
                               rtol=1e-6, atol=1e-6)
    assert seq.step_scores["deltas"].dtype == before.dtype
    source = inseq_attributed.sequence_attributions[0]
    torch.testing.assert_close(source.step_scores["deltas"], before, rtol=0, atol=0)  # the source keeps its own
    assert "_bcos_explained_value" not in source.step_scores
    assert "_bcos_explained_value" not in source._dict_aggregate_fn["step_scores"]["spans"]


# ------------------------------------------------------------------ d. a config field edited after conversion


def test_a_config_field_edited_after_building_applies_on_reload_for_b_cos_models_as_for_stock_ones(tmp_path):
    """Decision (documented in docs/methods/bcos-lms.md#saving-and-loading, not checked): Gemma 2's attention copies
    ``query_pre_attn_scalar`` (as ``scaling``) and ``attn_logit_softcapping`` when transformers builds it, so an edit of
    ``model.config`` afterwards is not seen in memory and is applied by the reload of the saved config. Pinned: a
    B-cos model behaves as the stock model does (the same copies, transformers' own; bcosify copies no config field),
    so save_pretrained has nothing of the package's to compare."""
    import transformers as T

    from bcos_plugins import bcosify
    from bcos_plugins.persistence import load_bcos_model

    def config():
        return T.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                              query_pre_attn_scalar=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)

    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    for field, value in (("query_pre_attn_scalar", 2), ("attn_logit_softcapping", 0.5)):
        for kind in ("stock", "bcos"):
            torch.manual_seed(0)
            model = T.Gemma2ForCausalLM(config())
            if kind == "bcos":
                model = bcosify(model, b=1.25, verbose=False)
            model.eval()
            with torch.no_grad():
                before = model(ids).logits
                setattr(model.config, field, value)
                in_memory = model(ids).logits
            folder = tmp_path / f"{kind}_{field}"
            model.save_pretrained(folder)
            reloaded = (load_bcos_model(folder) if kind == "bcos" else T.Gemma2ForCausalLM.from_pretrained(folder))
            with torch.no_grad():
                again = reloaded.eval()(ids).logits
            assert torch.equal(in_memory, before), (kind, field)  # the copy made when the model was built
            assert getattr(reloaded.config, field) == value
            assert not torch.equal(again, in_memory), (kind, field)  # the reload applies the edit
            # built from the edited config, the model in memory is the reloaded one
            torch.manual_seed(0)
            edited = config()
            setattr(edited, field, value)
            rebuilt = T.Gemma2ForCausalLM(edited)
            rebuilt = (bcosify(rebuilt, b=1.25, verbose=False) if kind == "bcos" else rebuilt).eval()
            with torch.no_grad():
                torch.testing.assert_close(rebuilt(ids).logits, again, rtol=0, atol=0)


# ------------------------------------------------------------------ c. an input norm past float32's range


def _rows_with_one_overflowing(dtype: torch.dtype, width: int = 8) -> torch.Tensor:
    """Three rows; row 1 has an element at 2e19, whose square passes float32's range (||x|| = inf in float32)."""
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    x[1, 2] = 2e19
    return x.to(dtype)


def _calls(layer, x):
    """The layer's output on ``x`` along each path that takes an input norm: inference, eval mode with a gradient,
    explanation mode (the explaining node), training (the fused training node), and the reference path."""
    from bcos_plugins.nn import explanation_mode, reference_path
    from bcos_plugins.nn.dynamic import no_parameter_gradients

    layer.eval()
    with torch.no_grad():
        yield "inference", layer(x)
    yield "eval, grad", layer(x.clone().requires_grad_())
    with explanation_mode(layer), no_parameter_gradients():
        yield "explaining", layer(x.clone().requires_grad_())
    layer.train()
    yield "training", layer(x.clone().requires_grad_())
    layer.eval()
    with reference_path(), torch.no_grad():
        yield "reference", layer(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b", [1.25, 2.0])
def test_a_row_whose_norm_overflows_gives_nan_not_zero_on_every_path(dtype, b):
    """Was the documented limit (BcosLinear's docstring, docs/api/nn.md): a float32 or bfloat16 row with an element
    past about 1.8e19 had ||x|| = inf, |cos| = 0 and an output of 0 (inference) or 2e7 where float64 gives 1e19
    (with a gradient), silently. The infinite norm is now NaN, so that row's output is NaN on every path; the other
    rows are untouched (equal to the float64 layer's to the dtype's rounding)."""
    from bcos_plugins.nn import BcosLinear

    torch.manual_seed(0)
    layer = BcosLinear(8, 4, b=b).to(dtype)
    reference = BcosLinear(8, 4, b=b).double()
    reference.load_state_dict(layer.state_dict())
    x = _rows_with_one_overflowing(dtype)
    with torch.no_grad():
        expected = reference.eval()(x.double())
    for path, out in _calls(layer, x):
        assert out[1].isnan().all(), (path, out[1])
        rows = out[[0, 2]].detach().double()
        half = dtype == torch.bfloat16  # (3 significant digits)
        torch.testing.assert_close(rows, expected[[0, 2]], rtol=2e-2 if half else 1e-5, atol=1e-2 if half else 1e-6,
                                   msg=lambda m, path=path: f"{path}: {m}")


def test_a_conv_patch_whose_norm_overflows_gives_nan_not_zero():
    """``BcosConv2d.patch_norm``: a patch past float32's range gave output 0; NaN now, at the patches that see it."""
    from bcos_plugins.nn import BcosConv2d

    torch.manual_seed(0)
    conv = BcosConv2d(3, 4, 3, b=2.0).eval()
    x = torch.randn(2, 3, 5, 5)
    x[1, 0, 2, 2] = 2e19
    with torch.no_grad():
        out, norms = conv(x), conv.patch_norm(x)
    assert norms[1].isnan().all() and out[1].isnan().all()  # every 3x3 patch of a 5x5 image sees the centre
    assert out[0].isfinite().all() and norms[0].isfinite().all()


def test_float16_keeps_its_own_overflow_protection():
    """A float16 input's norm is taken in float32, which no float16 row can overflow: a row of 300s (norm 850, past the
    float16 squares' range) is still exact to float16 rounding, not NaN."""
    from bcos_plugins.nn import BcosLinear

    torch.manual_seed(0)
    layer = BcosLinear(8, 4, b=2.0).half().eval()
    reference = BcosLinear(8, 4, b=2.0).double().eval()
    reference.load_state_dict(layer.state_dict())
    x = torch.full((2, 8), 300.0, dtype=torch.float16) * torch.tensor([[1.0], [-0.5]], dtype=torch.float16)
    with torch.no_grad():
        out = layer(x)
        torch.testing.assert_close(out.double(), reference(x.double()), rtol=2e-3, atol=1e-2)


def test_the_nan_for_an_infinite_norm_changes_no_finite_value_minilm_logits_bit_identical(monkeypatch):
    """The remedy is one element-wise op on the norms that leaves every finite value as it is: MiniLM's logits
    (bench_core's architecture and shape, 16 x 64 tokens, B = 1.5) and a tiny model's explanation are bit-identical
    with and without it."""
    import transformers as T

    import bcos_plugins.nn.conv as conv
    import bcos_plugins.nn.functional as functional
    from bcos_plugins import bcosify, explain
    from bcos_plugins.pretrained import minilm_path

    torch.manual_seed(0)
    config = T.BertConfig.from_pretrained(minilm_path())
    config.num_labels = 2
    model = bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False).eval()
    ids = torch.randint(1000, config.vocab_size, (16, 64), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)

    def logits_and_explanation():
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        explanation = explain(model, ids[:2, :16], mask[:2, :16])
        return logits, explanation.contributions

    with_op = logits_and_explanation()
    monkeypatch.setattr(functional, "overflowed_norm_as_nan", lambda norm: norm)
    monkeypatch.setattr(conv, "overflowed_norm_as_nan", lambda norm: norm)
    without_op = logits_and_explanation()
    assert torch.equal(with_op[0], without_op[0]) and torch.equal(with_op[1], without_op[1])
