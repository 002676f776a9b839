"""Session 24, closing note 23's leftovers (helper-162): each test pins one fix and fails on the code before it."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch, tiny_bcos_model

# ------------------------------------------------ 1a. silent rounding in Captum


def test_layer_bcos_and_captums_own_methods_warn_when_embedding_forward_rounds_float32_to_bfloat16():
    """EmbeddingForward rounds float32 embeddings to the bfloat16 a model computes in: BcosAttribution named it (in its
    completeness warning), while LayerBcos(fwd) and Captum's own methods through EmbeddingForward explained the
    rounded values without a word. They now warn with the same cause (the one text, _rounded_embeddings_cause)."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos
    from captum.attr import InputXGradient, IntegratedGradients

    model = tiny_bcos_model().to(torch.bfloat16)
    ids, mask = padded_batch()
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    rounded = r"the inputs are float32 and EmbeddingForward rounded them to bfloat16, .*Pass embeddings in the model's dtype"
    for method in (LayerBcos(fwd), InputXGradient(fwd), IntegratedGradients(fwd)):
        with pytest.warns(UserWarning, match=rounded):
            method.attribute(embeddings.float(), target=1, additional_forward_args=(mask,))
        # in the model's own dtype nothing is rounded: no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            method.attribute(embeddings, target=1, additional_forward_args=(mask,))
    # fwd called directly rounds too, and says so
    with pytest.warns(UserWarning, match=rounded):
        fwd(embeddings.float(), mask)


# ------------------------------------------------ 1b. integers read in float32


def test_at_least_float32_reads_integers_in_float64_so_visualization_records_keep_large_integer_scores():
    """at_least_float32 turned integers into float32, which rounds every integer above 2**24: integer scores given to
    visualization_records came back 2**24 + 1 -> 2**24 (the rationale metrics had the same rounding, fixed there alone).
    Integers (and flags) are now read in float64, exact to 2**53; floating dtypes are unchanged."""
    from bcos_plugins.adapters.captum import visualization_records

    from bcos_plugins.nn.functional import at_least_float32

    for dtype in (torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool):
        assert at_least_float32(dtype) == torch.float64, dtype
    for dtype, wide in ((torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                        (torch.float64, torch.float64)):
        assert at_least_float32(dtype) == wide
    big = 2**24 + 1
    (record,) = visualization_records(scores=[torch.tensor([big, 3])], tokens=[["a", "b"]])
    assert record.word_attributions.tolist() == [big, 3]
    assert record.attr_score == big + 3


# ------------------------------------------------ 1c. top_k_iou on rows whose scores are all tied


def test_top_k_iou_leaves_out_rows_whose_valid_scores_are_all_tied_as_mrr_does():
    """A row whose valid scores are all equal (all zero: a method that found nothing) has no ranking, and top_k_iou
    scored it by the tie rule (the earliest tokens first): a perfect 1.0 where the gold tokens come first. MRR leaves
    such rows out; top_k_iou now gives them NaN, left out of rationale_alignment's mean like rows without gold."""
    from bcos_plugins.metrics import rationale_alignment, top_k_iou

    gold = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]])
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0],  # all zero: gold first, the tie rule gave 1.0
                           [0.9, 0.8, 0.1, 0.0],  # a real ranking: 1.0
                           [2.0, 2.0, 2.0, 2.0],  # all equal, not zero: the tie rule gave 0.0
                           [5.0, 5.0, 5.0, 5.0]])  # with k = 4 every valid token is taken: no tie to break (0.25)
    iou = top_k_iou(scores[:3], gold[:3])
    assert torch.isnan(iou[0]) and iou[1] == 1.0 and torch.isnan(iou[2])
    assert top_k_iou(scores[3:], gold[3:], k=4).tolist() == [0.25]
    # ties only among invalid positions do not count: the valid ones rank
    valid = torch.tensor([[1, 1, 1, 0]])
    assert top_k_iou(torch.tensor([[0.3, 0.1, 0.0, 0.0]]), torch.tensor([[1, 0, 0, 0]]), valid).tolist() == [1.0]
    summary = rationale_alignment(scores[:3], gold[:3])
    assert summary.iou == 1.0  # the one row with a ranking; the AUPRC keeps all three rows
    assert summary.n_rows == 3 and summary.n_iou_rows == 1


# ------------------------------------------------ 1d. BcosViT.from_pretrained(folder, config=cfg) with another B


def _vit_config(**kw):
    from bcos_plugins.vision import BcosViTConfig

    return BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, num_labels=3, **kw)


def test_vit_from_pretrained_refuses_a_config_whose_b_disagrees_with_the_stored_layers_but_loads_mid_warm_up(tmp_path):
    """from_pretrained(folder, config=cfg) with cfg.b = 2.0 of a model saved at B = 1.5 gave config.b = 2.0 while
    every layer ran at the stored 1.5 (only b= was refused): refused naming config, both B values and the fix. A save
    made mid-way through a B warm-up (layers at 1.2, config.b the target 1.5) still loads, with its own config."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    model = BcosViT(_vit_config(b=1.5)).eval()
    images = torch.rand(2, 1, 8, 8)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    with pytest.raises(BcosValueError, match=r"^config: .*b=2\.0.*stores each layer's B \(\[1\.5\]\).*config\.b = 1\.5"):
        BcosViT.from_pretrained(saved, config=_vit_config(b=2.0))
    same = BcosViT.from_pretrained(saved, config=_vit_config(b=1.5)).eval()  # the stored B: loads as saved
    assert same.config.b == 1.5 and torch.equal(same(images).logits, model(images).logits)
    # mid-warm-up: the layers at 1.2, config.b at the target 1.5
    for m in model.modules():
        if hasattr(m, "bcos_b"):
            m.b = 1.2
    warm = tmp_path / "warm"
    model.save_pretrained(warm)
    for loaded in (BcosViT.from_pretrained(warm), BcosViT.from_pretrained(warm, config=BcosViTConfig.from_pretrained(warm)),
                   BcosViT.from_pretrained(warm, config=_vit_config(b=1.2))):
        assert torch.equal(loaded.eval()(images).logits, model(images).logits)
    with pytest.raises(BcosValueError, match=r"^config: .*b=2\.0.*\[1\.2\]"):
        BcosViT.from_pretrained(warm, config=_vit_config(b=2.0))


# ------------------------------------------------ 1e. NaN query / key weights of a B-cos HookedTransformer


@pytest.mark.parametrize("weight", ["W_Q", "W_K"])
def test_bcos_hooked_transformer_refuses_a_nan_query_or_key_weight_once_per_weight_version(weight):
    """TransformerLens' attention sets a NaN attention row to zero, so a NaN in W_Q / W_K gave finite logits and a
    finite explanation, 0.45 off, without a word (the weight check ran only once a result was non-finite). The B-cos
    HookedTransformer's forward now checks those weights, once per weight version (no sync while they are unchanged)."""
    from bcos_plugins.adapters.transformer_lens import (
        BcosHookedTransformer,
        BcosTransformerConfig,
        explain_logits,
    )

    from bcos_plugins.errors import BcosValueError

    cfg = BcosTransformerConfig(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=40, n_ctx=16,
                                device="cpu", act_fn="gelu_new", normalization_type="LN",
                                positional_embedding_type="standard", seed=0, bcos_b=1.5)
    model = BcosHookedTransformer(cfg).eval()
    tokens = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    before = model(tokens)
    assert torch.isfinite(before).all()
    with torch.no_grad():
        getattr(model.blocks[1].attn, weight)[0, 0, 0] = float("nan")  # an in-place write: a new weight version
    with pytest.raises(BcosValueError, match=rf"^model: .*NaN or infinite .*blocks\.1\.attn\.{weight}.*attention sets a NaN "
                                             r"row of attention scores to zero.*finite and wrong"):
        model(tokens)
    with pytest.raises(BcosValueError, match=rf"blocks\.1\.attn\.{weight}"):
        explain_logits(model, tokens, target=3)
    with torch.no_grad():
        getattr(model.blocks[1].attn, weight)[0, 0, 0] = 0.1  # mended: a new version, checked again, accepted
    assert torch.isfinite(model(tokens)).all()


# ------------------------------------------------ 2a. a real token's NaN embedding row through EmbeddingForward


def test_embedding_forward_names_a_real_tokens_nan_embedding_row_not_a_baseline_or_noise():
    """A real token whose input embedding row is NaN: EmbeddingForward.embed returned NaN embeddings, and the refusal
    in its forward (_checked) said "check the baseline or the noise added to them", which the caller never added.
    embed now refuses naming the token and its row (as it did for the padding's row), and _checked names the
    positions and the embedding row among the causes."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
    from conftest import with_nan_embedding_row

    from bcos_plugins.errors import BcosValueError

    ids, mask = padded_batch()
    token = int(ids[0, 0])
    fwd = EmbeddingForward(with_nan_embedding_row(tiny_bcos_model(), token))
    with pytest.raises(BcosValueError, match=rf"^input_ids: rows \[0, 1\] embed to NaN .*The input embedding row of "
                                             rf"token {token} \(model\.get_input_embeddings\(\)\.weight\[{token}\]\) is "
                                             r"NaN or infinite"):
        fwd.embed(ids, mask)
    embeddings = EmbeddingForward(tiny_bcos_model()).embed(ids, mask)
    embeddings[0, 0] = float("nan")
    with pytest.raises(BcosValueError, match=r"^embeddings: has NaN or infinite entries at 1 position\(s\), first in row "
                                             r"0 at positions \[0\].*an input embedding row of those tokens") as caught:
        BcosAttribution(fwd).attribute(embeddings, target=1, additional_forward_args=(mask,))
    assert "EmbeddingForward.embed(input_ids, attention_mask) names it" in str(caught.value)


# ------------------------------------------------ 2d. explanation_entropy and NaN at masked padding


def test_explanation_entropy_ignores_nan_at_masked_positions_and_refuses_it_at_real_ones():
    """A NaN at a masked padding position (a padding token's NaN embedding through Captum's methods) was refused as if
    it were a real token's, though the entropy ignores masked positions: it is now ignored with them; a NaN at a real
    position is still refused."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.metrics import explanation_entropy

    g = torch.Generator().manual_seed(0)
    attributions = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    expected = explanation_entropy(attributions, mask)
    broken = attributions.clone()
    broken[1, 3] = float("nan")
    assert torch.equal(explanation_entropy(broken, mask), expected)
    assert torch.equal(explanation_entropy((broken,), mask), expected)  # Captum's one-tensor tuple
    broken[0, 2, 1] = float("nan")  # a real position
    with pytest.raises(BcosValueError, match=r"^attributions: contain NaN or inf in row \[0\]"):
        explanation_entropy(broken, mask)
    with pytest.raises(BcosValueError, match=r"^attributions: contain NaN or inf"):
        explanation_entropy(broken)


# ------------------------------------------------ 2e. load_sst2's empty sentences, left_pad's negative pad id


def test_load_sst2_drops_empty_sentences_with_a_count_and_left_pad_refuses_a_negative_pad_id(tmp_path):
    """load_sst2 kept rows whose sentence is empty (a row of special tokens alone, classified and explained beside the
    real ones); they are dropped with a warning that counts them, and n counts the rows kept. left_pad wrote a
    negative pad_token_id into the batch; it is refused by name."""
    from bcos_plugins.data import load_sst2
    from bcos_plugins.data.contrastive import left_pad
    from bcos_plugins.errors import BcosValueError

    path = tmp_path / "sst2.tsv"
    path.write_text("sentence\tlabel\na fine film\t1\n\t0\n   \t1\ndull\t0\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"^load_sst2: dropped 2 of 4 rows whose sentence is empty"):
        data = load_sst2(path=path)
    assert list(data) == [("a fine film", 1), ("dull", 0)]
    with pytest.warns(UserWarning, match=r"dropped 2 of 4"):
        assert load_sst2(path=path, n=2).texts == ["a fine film", "dull"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_sst2("test")) == 600  # the shipped slice has no empty sentence
    with pytest.raises(BcosValueError, match=r"^pad_token_id: must be >= 0, got -1"):
        left_pad([[5, 6], [7]], [[True, False], [False]], pad_token_id=-1)
    ids = left_pad([[5, 6], [7]], [[True, False], [False]], pad_token_id=0)[0]
    assert ids.tolist() == [[5, 6], [0, 7]]


# ------------------------------------------------ 2f. refusals naming many long parameter paths


def test_a_bridges_non_finite_weights_are_named_three_then_counted():
    """A bridge's parameter paths run to 100 characters (model.layers.0._original_component.self_attn.
    _original_component.q_proj._original_component.weight): the refusal listed four of them and "...", without saying
    how many more. It names the first three and counts the rest."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf
    from test_conformance import B, _stock

    from bcos_plugins import bcosify
    from bcos_plugins.errors import BcosValueError

    bridge = transformer_bridge_from_hf(bcosify(_stock("LlamaForCausalLM"), b=B, verbose=False).eval())
    names = [n for n, _ in bridge.named_parameters()][:6]
    with torch.no_grad():
        for name in names:
            bridge.get_parameter(name).view(-1)[3] = float("nan")
    tokens = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(BcosValueError, match=r"^model: has NaN or infinite values in 6 parameter\(s\) \(") as caught:
        explain_logits(bridge, tokens, target=3)
    listed = str(caught.value).split("parameter(s) (", 1)[1].split("): ", 1)[0]
    assert listed == ", ".join(names[:3]) + " and 3 more"


# ------------------------------------------------ 2c. inseq: unknown keywords given with "bcos"


def test_inseq_bcos_refuses_keywords_no_part_of_the_call_reads():
    """attribute(..., method "bcos", bogus=3) or contrast_targets= with the default attributed function (the plain
    logit) only got inseq's log line "Unused arguments during attribution" and attributed without them: a contrastive
    explanation asked for came back as the plain logit's, silently. Refused with a TypeError naming the keyword;
    skip_special_tokens (which inseq reads itself) and keywords read by the attributed function still pass."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    import transformers as T
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    call = dict(generation_args={"max_new_tokens": 1, "do_sample": False}, show_progress=False)
    with pytest.raises(TypeError, match=r"^bogus: is read by no part of this attribute call .*only log it"):
        attribution_model.attribute(["The cat"], bogus=3, **call)
    with pytest.raises(TypeError, match=r"^contrast_targets: .*attributed function logit_fn.*attributed_fn="
                                        r"'contrast_prob_diff'"):
        attribution_model.attribute(["The cat"], contrast_targets=["The cat sat"], **call)
    out = attribution_model.attribute(["The cat"], skip_special_tokens=True, **call)
    assert len(out.sequence_attributions) == 1
    contrast = attribution_model.attribute(["The cat"], "The cat sat", attributed_fn="contrast_prob_diff",
                                           contrast_targets="The cat ran", show_progress=False)
    assert len(contrast.sequence_attributions) == 1


# ------------------------------------------------ 4. one check of seeds


def test_every_seed_of_the_package_is_checked_by_require_seed_with_its_own_generators_bounds():
    """Nine places checked seeds, each with require_int and its own bounds (torch's generator: [-2**63, 2**64 - 1];
    the paired bootstrap: [0, 2**64 - 1]; NumPy: >= 0; Python's random: any int). One check, _checks.require_seed,
    now serves them all, each passing its bounds, so none was loosened or tightened: pinned at each bound. (The
    training helpers' require_run_settings keeps its own check: it takes any integer, as transformers' set_seed.)"""
    import ast
    from pathlib import Path

    from bcos_plugins.data import corrupt_ioi, ioi_name_pool, make_ioi_prompts
    from bcos_plugins.errors import BcosTypeError, BcosValueError
    from bcos_plugins.guided.supervision import PlateauRestart
    from bcos_plugins.metrics.image import pixel_ranking
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    root = Path(__file__).resolve().parents[1]
    inline = []
    for folder in ("bcos_plugins", "adapters"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and node.args[0].value == "seed" and getattr(node.func, "id", "").startswith("require_")
                        and node.func.id != "require_seed"):
                    inline.append(f"{path.relative_to(root)}:{node.lineno}")
    assert inline == [], inline

    maps = torch.zeros(1, 2, 2)
    for seed in (-2**63, 2**64 - 1):
        pixel_ranking(maps, seed=seed)
    for seed in (-2**63 - 1, 2**64):
        with pytest.raises(BcosValueError, match=r"^seed: must be in \[-9223372036854775808, 18446744073709551615\]"):
            pixel_ranking(maps, seed=seed)
    a, b = [0.1, 0.5, 0.2, 0.9], [0.3, 0.4, 0.4, 0.6]
    paired_bootstrap_difference(a, b, n_resamples=40, seed=2**64 - 1)
    for seed in (-1, 2**64):
        with pytest.raises(BcosValueError, match=r"^seed: must be in \[0, 18446744073709551615\]"):
            paired_bootstrap_difference(a, b, n_resamples=40, seed=seed)
    gate = PlateauRestart(0.5)
    assert isinstance(gate.attempt_seed(2**70, 0), int)  # NumPy / hash seeds: no upper bound
    with pytest.raises(BcosValueError, match=r"^seed: must be >= 0, got -1"):
        gate.attempt_seed(-1, 0)
    assert ioi_name_pool(4, seed=-5) == ioi_name_pool(4, seed=-5)  # Python's random: any int
    prompts = make_ioi_prompts(2, seed=-5)
    corrupt_ioi(prompts, seed=-(2**70))
    for call in (lambda: make_ioi_prompts(2, seed=1.5), lambda: ioi_name_pool(4, seed=True)):
        with pytest.raises(BcosTypeError, match=r"^seed: must be an int"):
            call()


# ------------------------------------------------ 2b. BWarmupCallback's best-checkpoint check and eval_on_start


def test_bwarmup_best_checkpoint_check_with_eval_on_start(tmp_path):
    """note 23 asked whether the best-checkpoint check should count eval_on_start's evaluation (at step 0, during the
    warm-up, at B = start). It chooses no checkpoint: the Trainer picks the best among saved checkpoints only. Pinned:
    with eval_on_start and an eval_delay past the warm-up the run is accepted, the step-0 evaluation ran at B = start,
    and the best metric is the returned model's own (not the step-0 one)."""
    import transformers as T
    from conftest import tiny_bcos_gpt2_and_rows

    from bcos_plugins.nn.linear import AlignmentPressure
    from bcos_plugins.train import BWarmupCallback
    from bcos_plugins.train_decoder import train_causal_lm

    model, rows = tiny_bcos_gpt2_and_rows()
    seen_b: list[float] = []

    class RecordB(T.TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            seen_b.append(next(m.b for m in model.modules() if isinstance(m, AlignmentPressure)))

    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, eval_dataset=rows, eval_delay=2,
                              callbacks=[BWarmupCallback(model, start=1.0, fraction=0.5), RecordB()],
                              num_train_epochs=3, per_device_train_batch_size=2, eval_strategy="epoch",
                              save_strategy="epoch", load_best_model_at_end=True, metric_for_best_model="eval_loss",
                              save_only_model=True, disable_tqdm=True, logging_steps=100, eval_on_start=True)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [0, 8, 12]
    assert seen_b == [1.0, 1.5, 1.5]
    step0 = next(h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h)
    assert trainer.state.best_metric != step0
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.state.best_metric, rel=1e-6, abs=0)
