"""The faithfulness benchmark's plumbing on tiny random BERTs: every method, the table, the plot.

The benchmark itself fine-tunes MiniLM for minutes; here the same functions run on 2-layer random models with
the real MiniLM tokenizer, so a change in Captum or in our metrics that breaks the script fails a test.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify
from bcos_plugins.pretrained import minilm_path

# Captum's notes that it set requires_grad itself and fits one LIME model per example: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients",
                                        "ignore:You are providing multiple inputs for Lime")


@pytest.fixture(scope="module")
def bench():
    from benchmarks import bench_faithfulness

    return bench_faithfulness


@pytest.fixture(scope="module")
def setup(bench):
    tok = T.AutoTokenizer.from_pretrained(minilm_path())
    config = T.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, num_labels=2,
                          attn_implementation="eager")
    torch.manual_seed(0)
    conv = T.BertForSequenceClassification(config).eval()
    with torch.no_grad():  # transformers starts biases at 0; a fine-tuned model's are not (W(x)x misses them)
        for name, p in conv.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    # its own config: bcosify writes config.bcos, which would mark the conventional model (same config object)
    bcos = bcosify(T.BertForSequenceClassification(copy.deepcopy(config)), b=1.25, verbose=False).eval()
    cfg = bench.Config(ig_steps=4, shapley_samples=3, lime_samples=10, batch=3, n_eval=5)
    texts = ["a gripping , funny film", "dull and far too long", "i liked it", "not good", "a mess"]
    return tok, conv, bcos, cfg, texts


def test_every_method_scores_each_token_and_bcos_is_complete(bench, setup):
    tok, conv, bcos, cfg, texts = setup
    methods = bench.make_methods(conv, bcos, tok.mask_token_id, cfg)
    assert list(methods) == ["Attention", "IxG", "IG (4 steps)", "IG (4 steps, [MASK] baseline)", "Saliency",
                             "ShapSampl (3)", "LIME (10)", "Occlusion", "W(x)x of conv. (ablation)",
                             "IxG on B-cos (ablation)", "B-cos"]
    ids, mask = bench.encode(tok, texts[:3])
    batch = next(bench.batches(ids, mask, torch.tensor([1, 0, 1]), tok, 3))
    for name, method in methods.items():
        scores = method.run(batch)
        assert scores.shape == batch.ids.shape, name
        assert torch.isfinite(scores).all(), name
        if name in ("ShapSampl (3)", "Occlusion"):
            # the [MASK] baseline keeps [CLS]/[SEP]/[PAD]: replacing them changes nothing (up to float32 noise
            # of the logits between differently composed perturbation batches; real scores here are ~1e-3)
            assert scores[batch.special].abs().max() <= 1e-6, name
    scores = methods["B-cos"].run(batch)
    with torch.no_grad():
        logits = bcos(input_ids=batch.ids, attention_mask=batch.mask).logits
    explained = logits.gather(1, batch.target[:, None]).squeeze(1)
    torch.testing.assert_close(scores.sum(-1), explained, rtol=1e-4, atol=1e-5)


def test_the_report_has_one_row_per_method_and_the_ratios(bench, setup, tmp_path):
    tok, conv, bcos, cfg, texts = setup
    cfg = dataclasses.replace(cfg, out=tmp_path)
    methods = bench.make_methods(conv, bcos, tok.mask_token_id, cfg)
    results: dict = {}
    per_method = bench.Budget()
    bench.evaluate_sst2(methods, {"conventional": conv, "bcos": bcos}, tok, texts, cfg, results, per_method)
    assert all(res.n == len(texts) and res.seconds > 0 for res in results.values())
    # the budget has each method's explaining, and the metrics of all of them as one phase
    metrics = "SST-2 metrics (Comp/Suff curves, entropy, completeness)"
    assert sorted(per_method.phases) == sorted([f"SST-2 {name}" for name in methods] + [metrics])
    acc = {"sst2": {"conventional": 0.5, "bcos": 0.6}}
    rows = bench.write_report(results, acc, cfg, {"n_eval": len(texts), "n_seqpg": 0, "device": "CPU",
                                                  "seqpg_source": None,
                                                  "memory_method": results["B-cos"].memory_method})
    bench.plot(rows, cfg.out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faithfulness.png", "results.csv", "results.md"]
    assert [r["method"] for r in rows] == list(methods)
    assert all(r["attributed_at"] for r in rows)
    bcos_row = rows[-1]
    assert bcos_row["times_bcos_time"] == pytest.approx(1.0)
    assert math.isnan(bcos_row["seqpg_x100"])  # no SeqPG in this run: reported as missing, not as 0
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert sum(line.startswith("| ") for line in table.splitlines()) == len(methods) + 1  # header + rows
    assert "faster than IG (4 steps)" in table and "faster than ShapSampl (3)" in table
    assert (tmp_path / "results.csv").read_text().count("\n") == len(methods) + 1
    assert (tmp_path / "faithfulness.png").stat().st_size > 0


def test_the_budget_adds_phases_of_one_name_and_lists_them_in_order(bench, monkeypatch):
    clock = iter([0.0, 10.0, 10.0, 12.5, 20.0, 23.0])  # wall and CPU read the same fake clock in turn
    budget = bench.Budget()
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(bench.time, "process_time", lambda: 0.0)
    with budget.phase("training"):
        pass
    with budget.phase("explaining"):
        pass
    with budget.phase("training"):
        pass
    assert budget.phases == {"training": [13.0, 0.0], "explaining": [2.5, 0.0]}
    monkeypatch.setattr(bench.time, "perf_counter", lambda: bench._STARTED[0] + 100.0)
    monkeypatch.setattr(bench.time, "process_time", lambda: bench._STARTED[1] + 90.0)
    assert budget.line().startswith(f"Budget: 100 s wall, 90 s CPU ({bench.threads_text()}); "
                                    "per phase, wall / CPU s: training 13 / 0, explaining 2 / 0")


def test_every_row_states_its_point_and_gradient_baselines_are_not_noise(bench, setup):
    """Conventional IxG / IG attribute after the embedding LayerNorm: before it they are float noise."""
    from bcos_plugins.attribution import capture_point

    tok, conv, bcos, cfg, texts = setup
    methods = bench.make_methods(conv, bcos, tok.mask_token_id, cfg)
    assert all(m.point for m in methods.values())
    for name in ("IxG", "IG (4 steps)", "IG (4 steps, [MASK] baseline)", "Saliency"):
        assert "after the embedding LayerNorm" in methods[name].point, name
    assert "combined embedding" in methods["B-cos"].point
    assert "combined embedding" in methods["W(x)x of conv. (ablation)"].point
    assert "biases kept" in methods["W(x)x of conv. (ablation)"].point
    ids, mask = bench.encode(tok, texts[:3])
    batch = next(bench.batches(ids, mask, torch.tensor([1, 0, 1]), tok, 3))
    with capture_point(conv.bert.embeddings.LayerNorm, "input") as leaves:
        logits = conv(input_ids=batch.ids, attention_mask=batch.mask).logits
    explained = logits.gather(1, batch.target[:, None]).sum()
    (grad,) = torch.autograd.grad(explained, leaves[0])
    before_layernorm = (leaves[0] * grad).sum(-1).abs().max()
    for name in ("IxG", "IG (4 steps)", "IG (4 steps, [MASK] baseline)"):
        assert methods[name].run(batch).abs().max() > 100 * before_layernorm, name
    # the same for plain IxG on the B-cos model: each token's score before its embedding LayerNorm is zero
    assert "after the embedding LayerNorm" in methods["IxG on B-cos (ablation)"].point
    with capture_point(bcos.bert.embeddings.LayerNorm, "input") as leaves:
        logits = bcos(input_ids=batch.ids, attention_mask=batch.mask).logits
    (grad,) = torch.autograd.grad(logits.gather(1, batch.target[:, None]).sum(), leaves[0])
    bcos_before = (leaves[0] * grad).sum(-1).abs().max()
    assert methods["IxG on B-cos (ablation)"].run(batch).abs().max() > 100 * bcos_before


def test_paper_scale_sets_the_paper_sizes_and_explicit_variables_win(bench, monkeypatch):
    for name in [*bench.PAPER_SCALE, "BENCH_PAPER_SCALE"]:
        monkeypatch.delenv(name, raising=False)
    default = bench.config_from([])
    assert (default.epochs, default.n_eval, default.n_seqpg, default.lime_samples) == (2, 16, 8, 100)
    assert (default.shapley_samples, default.ig_steps) == (10, 50)
    assert (default.n_train, default.n_ag_train, default.data_source) == (1200, 600, "local")
    # the best recipe measured (docs/recipes.md): task then B-cos at B = 1.1, stock query/key, lr 2e-4
    assert (default.b, default.bcos_lr, default.bcos_query_key, default.bcos_start) == (1.1, 2e-4, False,
                                                                                       "conventional")
    assert default.bcos_schedule == "warmup-cosine"  # fine_tune_task_then_bcos' B-cos stage
    monkeypatch.setenv("BENCH_EVAL", "10")
    paper = bench.config_from(["--paper-scale"])
    assert (paper.epochs, paper.n_seqpg, paper.segment, paper.lime_samples) == (5, 500, 50, 3000)
    assert paper.shapley_samples == 25
    assert (paper.n_train, paper.n_ag_train, paper.n_acc, paper.data_source) == (0, 0, 0, "hub")
    assert paper.n_eval == 10, "a variable set explicitly wins over the preset"
    assert bench.Config().n_eval == 16, "a Config built in code reads no environment (from_env does)"
    assert "BENCH_EPOCHS" not in __import__("os").environ, "the preset must not leak into the environment"
    monkeypatch.setenv("BENCH_PAPER_SCALE", "1")
    assert bench.config_from([]).epochs == 5
    with pytest.raises(SystemExit, match="unknown arguments"):
        bench.config_from(["--paper"])


@pytest.mark.parametrize("name, raw, problem", [
    ("BENCH_EVAL", "sixteen", "not a whole number"), ("BENCH_EPOCHS", "0", "out of range (must be > 0)"),
    ("BENCH_RETRAIN", "yes", "not a switch"), ("BENCH_PAPER_SCALE", "true", "not a switch"),
    ("BENCH_DATA_SOURCE", "glue", "not one of 'local' or 'hub'"),
    ("BENCH_SEQPG_DATA", "imdb", "not one of 'ag_news' or 'sst2'")])
def test_a_bad_setting_stops_the_run_naming_the_variable(bench, monkeypatch, name, raw, problem):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SystemExit) as excinfo:
        bench.config_from([])
    assert str(excinfo.value).startswith(f"{name}={raw!r}: {problem}. Set {name} to ")


def test_hub_data_falls_back_to_the_shipped_slice(bench, monkeypatch, capsys):
    def offline(split, n=None, source="local"):
        if source == "hub":
            raise ConnectionError("no network")
        return bench.load_sst2(split, n=n)

    cfg = bench.Config(data_source="hub")
    data, source = bench.load_data(offline, "train", "train", cfg, n=5)
    assert source == "shipped" and len(data.texts) == 5
    assert "unavailable (ConnectionError: no network); using the shipped train slice" in capsys.readouterr().out
    data, source = bench.load_data(offline, "test", "validation", bench.Config(data_source="local"))
    assert source == "shipped" and len(data.texts) == 600


def test_task_then_bcos_model_starts_from_the_conventional_one_and_is_cached(bench, setup, monkeypatch, tmp_path):
    from bcos_plugins import explain

    tok, conv, _, _, texts = setup
    monkeypatch.setattr(bench, "MODELS", tmp_path)
    monkeypatch.setattr(bench, "DEVICE", torch.device("cpu"))
    cfg = bench.Config(epochs=1, train_batch=4, bcos_start="conventional", bcos_query_key=False)
    labels = [1, 0, 1, 0, 0]
    model, _, seconds = bench.trained_model("bcos", "sst2", texts, labels, 2, cfg, "shipped", conv)
    assert seconds > 0 and model.config.bcos["query_key"] == "stock"
    assert not hasattr(conv.config, "bcos"), "the conventional model must stay stock"
    (folder,) = tmp_path.iterdir()
    assert folder.name.endswith("-stockqk-fromconv-warmcos")
    ids, mask = bench.encode(tok, texts)
    assert (explain(model, ids, mask).completeness_error <= 1e-4).all()
    cached, _, again = bench.trained_model("bcos", "sst2", texts, labels, 2, cfg, "shipped", conv)
    assert again == 0.0
    with torch.no_grad():
        torch.testing.assert_close(cached(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits)


def test_wx_of_the_conventional_model_explains_its_logits_up_to_the_bias_share(bench, setup, tmp_path):
    """The Table 3 ablation row: the conventional model's own logit, W(x)x at the combined embedding, reported
    as incomplete (the biases' share); B-cos reported complete."""
    from bcos_plugins import explain
    from bcos_plugins.convert import dynamic_linear_copy

    tok, conv, bcos, cfg, texts = setup
    cfg = dataclasses.replace(cfg, out=tmp_path)
    methods = bench.make_methods(conv, bcos, tok.mask_token_id, cfg)
    row = methods["W(x)x of conv. (ablation)"]
    assert row.kind == "conventional" and row.decomposes_logit
    ids, mask = bench.encode(tok, texts[:3])
    batch = next(bench.batches(ids, mask, torch.tensor([1, 0, 1]), tok, 3))
    reference = explain(dynamic_linear_copy(conv), batch.ids, batch.mask, target=batch.target)
    torch.testing.assert_close(reference.explained, bench.explained_logits(conv, batch), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(row.run(batch), reference.contributions)
    assert (reference.completeness_error > 1e-3).all()  # the biases' share is real and not attributed

    results: dict = {}
    bench.evaluate_sst2(methods, {"conventional": conv, "bcos": bcos}, tok, texts, cfg, results)
    rows = {r["method"]: r for r in bench.write_report(
        results, {"sst2": {"conventional": 0.5, "bcos": 0.6}}, cfg,
        {"n_eval": len(texts), "n_seqpg": 0, "device": "CPU", "seqpg_source": None,
         "memory_method": results["B-cos"].memory_method})}
    assert rows["B-cos"]["completeness_error_median"] < 1e-4
    assert rows["W(x)x of conv. (ablation)"]["completeness_error_median"] > 1e-3
    assert rows["W(x)x of conv. (ablation)"]["model"] == "conv. MiniLM"
    assert math.isnan(rows["Occlusion"]["completeness_error_median"])  # not an input x gradient row: not reported
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "biases' share of the logit" in table


def test_seqpg_report_shows_where_each_methods_evidence_lands(bench, setup, tmp_path):
    from bcos_plugins.metrics import SeqPGExamples, seqpg_evidence_split, seqpg_score

    tok, conv, bcos, cfg, texts = setup
    cfg = dataclasses.replace(cfg, out=tmp_path)
    seg = 3
    pieces = [tok(t, add_special_tokens=False)["input_ids"][:seg] for t in ("a gripping , funny film",
                                                                            "dull and far too long")]
    ids = torch.tensor([[tok.cls_token_id, *pieces[0], tok.sep_token_id, *pieces[1], tok.sep_token_id]] * 2)
    segment_masks = torch.zeros(2, 2, ids.shape[1], dtype=torch.bool)
    segment_masks[:, 0, 1 : 1 + seg] = True
    segment_masks[:, 1, 2 + seg : 2 + 2 * seg] = True
    examples = SeqPGExamples(ids, torch.ones_like(ids), segment_masks, torch.tensor([[1, 0], [0, 1]]),
                             torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long))
    methods = bench.make_methods(conv, bcos, tok.mask_token_id, cfg)
    results: dict = {}
    bench.evaluate_sst2(methods, {"conventional": conv, "bcos": bcos}, tok, texts, cfg, results)
    bench.evaluate_seqpg(methods, {"conventional": conv, "bcos": bcos}, tok, examples, cfg, results)
    rows = bench.write_report(results, {"sst2": {"conventional": 0.5, "bcos": 0.6}}, cfg,
                              {"n_eval": len(texts), "n_seqpg": len(examples), "device": "CPU",
                               "seqpg_source": "SST-2", "memory_method": results["B-cos"].memory_method})
    b_ids, b_mask, targets = examples.explanation_batch()
    bcos_scores = methods["B-cos"].run(bench.Batch(b_ids, b_mask, targets, torch.zeros_like(b_ids, dtype=torch.bool)))
    bcos_row = next(r for r in rows if r["method"] == "B-cos")
    expected = 100 * seqpg_evidence_split(bcos_scores, segment_masks).mean(0)
    assert bcos_row["seqpg_x100"] == pytest.approx(100 * seqpg_score(bcos_scores, segment_masks).mean().item(),
                                                   abs=1e-3)
    assert [bcos_row["seqpg_x100"], bcos_row["seqpg_wrong_segment_x100"],
            bcos_row["seqpg_special_tokens_x100"]] == pytest.approx(expected.tolist(), abs=1e-3)
    for r in rows:
        parts = (r["seqpg_x100"], r["seqpg_wrong_segment_x100"], r["seqpg_special_tokens_x100"])
        assert all(0 <= p <= 100 for p in parts), r["method"]
        # each explanation's shares sum to 1, or to 0 when it has no positive evidence (4 explanations here)
        assert min(abs(sum(parts) - k) for k in (0, 25, 50, 75, 100)) < 1e-3, r["method"]
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    split = table[table.index("| model | method | right segment"):]
    assert sum(line.startswith("| ") for line in split.splitlines()) == len(methods) + 1
    assert (tmp_path / "results.csv").read_text().splitlines()[0].count("seqpg_wrong_segment_x100") == 1


def _curves(values: list[float]):
    """Constant comprehensiveness curves (one value per sentence), sufficiency the negative; AOPC = 0.8 x value."""
    from bcos_plugins.metrics import PerturbationCurves
    from bcos_plugins.metrics.perturbation import DEFAULT_FRACTIONS

    comp = torch.tensor(values, dtype=torch.float64)[:, None].expand(-1, len(DEFAULT_FRACTIONS))
    n = len(values)
    return PerturbationCurves(comp, -comp, tuple(DEFAULT_FRACTIONS), torch.ones(n), torch.zeros(n, dtype=torch.long),
                              torch.ones(n, len(DEFAULT_FRACTIONS), dtype=torch.long))


def test_the_reports_numbers_pool_sentences_not_batches_and_divide_by_b_cos(bench, tmp_path):
    """Hand-made results: 2 s over 4 explanations against B-cos's 0.5 s over 5 is 5.0x B-cos's time; a batch of
    1 sentence scoring 1 and one of 3 scoring 0 give Comp 0.8 x 1/4 (not the mean of the batches, 0.8 x 1/2)."""
    cfg = bench.Config(ig_steps=4, shapley_samples=3, lime_samples=10, batch=3, n_eval=4, out=tmp_path)
    ones = [torch.ones(4)]
    results = {
        "IG (4 steps)": bench.MethodResult(seconds=2.0, n=4, peak_mib=30.0, curves=[_curves([1.0]), _curves([0.0] * 3)],
                                           entropy=[torch.tensor([1.0]), torch.tensor([2.0, 2.0, 2.0])],
                                           point="p", kind="conventional"),
        "B-cos": bench.MethodResult(seconds=0.5, n=5, peak_mib=10.0, curves=[_curves([0.5] * 4)], entropy=ones,
                                    completeness=[torch.tensor([0.0, 1e-6, 3e-6, 1.0])], point="p", kind="bcos"),
    }
    rows = {r["method"]: r for r in bench.write_report(
        results, {"sst2": {"conventional": 0.5, "bcos": 0.75}}, cfg,
        {"n_eval": 4, "n_seqpg": 0, "device": "CPU", "seqpg_source": None, "memory_method": "sampled_rss"})}
    ig, b = rows["IG (4 steps)"], rows["B-cos"]
    assert ig["seconds_per_explanation"] == pytest.approx(0.5) and b["seconds_per_explanation"] == pytest.approx(0.1)
    assert ig["times_bcos_time"] == pytest.approx(5.0) and b["times_bcos_time"] == pytest.approx(1.0)
    assert ig["comp_aopc_x100"] == pytest.approx(20.0) and ig["suff_aopc_x100"] == pytest.approx(-20.0)
    assert b["comp_aopc_x100"] == pytest.approx(40.0)
    assert ig["entropy"] == pytest.approx(7.0 / 4)  # per sentence: (1 + 2 + 2 + 2) / 4
    assert b["completeness_error_median"] == pytest.approx(2e-6)  # even count: the two middle values' mean
    assert b["completeness_error_mean"] == pytest.approx((1.0 + 4e-6) / 4)
    assert (ig["sst2_accuracy"], b["sst2_accuracy"]) == (0.5, 0.75)
    assert "B-cos is 5x faster than IG (4 steps)." in (tmp_path / "results.md").read_text(encoding="utf-8")
