"""The frontier benchmark end to end in --quick mode on a tiny random BERT (with the real MiniLM tokenizer) and small
data files written here: the files it writes, the paired bootstrap intervals, resumption, and its settings errors."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os

import pytest
import torch
import transformers as T
from captum.attr import Lime, ShapleyValueSampling

from bcos_plugins.pretrained import minilm_path

pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients",
                                        "ignore:You are providing multiple inputs for Lime")

POSITIVE = ["a gripping , funny and moving film", "the best picture of the year by far", "warm , witty and wise",
            "i liked every minute of it", "a triumph of acting and writing"]
NEGATIVE = ["dull , slow and far too long", "a mess from start to finish", "i hated every minute of it",
            "the plot makes no sense at all", "flat jokes and wooden acting"]
TOPICS = {"World": "president minister election war president minister election {}",
          "Sports": "football goal league coach football goal league {}",
          "Business": "shares profit earnings market shares profit earnings {}",
          "Sci/Tech": "software chip computer internet software chip computer {}"}
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "today", "sunday night"]


@pytest.fixture(scope="module")
def bench():
    from benchmarks import bench_frontier

    return bench_frontier


@pytest.fixture()
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("BENCH_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny random BERT saved with the MiniLM tokenizer, and SST-2 / AG News files in the shared layout."""
    root = tmp_path_factory.mktemp("frontier")
    tok = T.AutoTokenizer.from_pretrained(minilm_path())
    config = T.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    T.BertModel(config).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    sst2 = root / "sst2"
    sst2.mkdir()
    rows = [f"{t}\t{y}" for pos, neg in zip(POSITIVE, NEGATIVE, strict=True) for t, y in ((pos, 1), (neg, 0))]
    (sst2 / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows * 4) + "\n", encoding="utf-8")
    (sst2 / "dev.tsv").write_text("sentence\tlabel\nshort\t1\n" + "\n".join(rows) + "\n", encoding="utf-8")
    ag = root / "ag_news"
    ag.mkdir()
    news = [f"{text.format(day)}\t{topic}" for day in DAYS for topic, text in TOPICS.items()]
    (ag / "dev.tsv").write_text("\n".join(news * 5) + "\n", encoding="utf-8")
    return root


def quick_env(env, inputs, out):
    env.setenv("BENCH_OUT", str(out))
    env.setenv("BENCH_FRONTIER_MODEL", str(inputs / "model"))
    env.setenv("BENCH_FRONTIER_SST2", str(inputs / "sst2"))
    env.setenv("BENCH_FRONTIER_AG_NEWS", str(inputs / "ag_news"))
    env.setenv("BENCH_EPOCHS", "3")
    env.setenv("BENCH_TRAIN_BATCH", "4")
    env.setenv("BENCH_CONV_LR", "3e-3")  # the tiny random model learns the topic words only at a larger rate
    env.setenv("BENCH_AG_TRAIN", "40")
    env.setenv("BENCH_AG_EVAL", "60")


def test_quick_run_writes_the_frontier_and_a_rerun_trains_nothing(bench, clean_env, inputs, tmp_path, capsys):
    quick_env(clean_env, inputs, tmp_path / "out")
    first = bench.main(["--quick"])
    out = tmp_path / "out"
    for name in ("results.csv", "results.md", "frontier.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    cells = sorted(out.glob("cells/*/*/*.json"))
    assert [f"{c.parents[1].name}/{c.name}" for c in cells] == [
        "ag_news/B1.25-stockqk-task-then-bcos-seed0.json", "ag_news/conventional-seed0.json",
        "sst2/B1.25-stockqk-task-then-bcos-seed0.json", "sst2/conventional-seed0.json"]
    assert first["computed"] == 4 and first["trained"] >= 3  # 2 conventional models, 2 B-cos models
    [row] = first["rows"]
    assert row["setting"] == "B1.25-stockqk-task-then-bcos"
    assert sorted(r["setting"] for r in first["posthoc"]) == [
        "post-hoc: IG (4 steps, [MASK] baseline)", "post-hoc: LIME (10)", "post-hoc: Occlusion",
        "post-hoc: ShapSampl (2)"]
    sst2_cell = json.loads(cells[3].read_text())
    explained = sst2_cell["n_units"]
    assert explained == 6  # BENCH_EVAL=6 sentences of >= 3 words: the one-word dev row is not explained
    for metric in ("comp", "suff", "seqpg"):
        low, diff, high = row[f"{metric}_low"], row[f"{metric}_diff"], row[f"{metric}_high"]
        assert all(math.isfinite(v) for v in (low, diff, high)) and low <= diff <= high, metric
        # the difference is B-cos minus the named best post-hoc method, mean over the paired units
        bcos_cell = json.loads(cells[2 if metric != "seqpg" else 0].read_text())
        conv_cell = json.loads(cells[3 if metric != "seqpg" else 1].read_text())
        best = conv_cell["methods"][row[f"best_posthoc_{metric}"]][metric]
        own = bcos_cell["methods"]["B-cos"][metric]
        assert len(own) == len(best) == row[f"{metric}_units"]
        assert diff == pytest.approx(sum(own) / len(own) - sum(best) / len(best))
    assert row["comp_units"] == explained and row["seqpg_units"] == 3  # BENCH_SEQPG=3 examples
    with (out / "results.csv").open(encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == 1 + 4
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "B1.25-stockqk-task-then-bcos" in table and "paired bootstrap 95 % interval" in table

    def no_training(*args, **kwargs):
        raise AssertionError("a rerun trained a model")

    clean_env.setattr(bench, "fine_tune_classifier", no_training)
    second = bench.main(["--quick"])
    assert second["computed"] == 0 and second["trained"] == 0
    assert second["rows"] == first["rows"]
    assert "0 to do: about 0.00 CPU-hours (nothing to do" in capsys.readouterr().out


def test_the_budget_uses_measured_cells_of_the_same_kind_else_the_estimate(bench):
    cfg = bench.Config(n_train=1000, epochs=2, n_eval=400, n_acc=100)
    conv, bcos = bench.Setting(), bench.Setting(1.1, "stock", "task-then-bcos")
    estimated = bench.estimate_seconds(cfg, conv, "sst2")
    e = bench.ESTIMATE
    assert estimated == pytest.approx(e["accuracy_per_row"] * 100 + e["train_row_epoch"] * 1000 * 2
                                      + e["posthoc_per_sentence"] * 400)
    done = [{"b": None, "dataset": "sst2", "cpu_seconds": 100.0}, {"b": None, "dataset": "sst2", "cpu_seconds": 300.0}]
    seconds, source = bench.budget(cfg, [(conv, 1, "sst2"), (bcos, 1, "sst2")], done)
    assert seconds == pytest.approx(200.0 + bench.estimate_seconds(cfg, bcos, "sst2"))
    assert source == "estimated and measured"


@pytest.mark.parametrize(("name", "raw", "problem"), [
    ("BENCH_FRONTIER_B", "", "not a comma-separated list of numbers"),
    ("BENCH_FRONTIER_B", "1.1,0.5", "out of range"),
    ("BENCH_FRONTIER_B", "1.1,1.1", "lists a value twice"),
    ("BENCH_FRONTIER_SEEDS", "1.5", "not a comma-separated list of whole numbers"),
    ("BENCH_FRONTIER_QK", "stock,query", "not a comma-separated list of distinct values"),
    ("BENCH_FRONTIER_START", "", "not a comma-separated list of distinct values"),
    ("BENCH_EVAL", "", "not a whole number"),
    ("BENCH_OUT", "", "empty, which would be the current folder"),
    ("BENCH_FRONTIER_QUICK", "yes", "not a switch"),
    ("BENCH_PERTURBATIONS_PER_EVAL", "-1", "out of range"),
    ("BENCH_FRONTIER_SCHEDULE", "default,short", "not a comma-separated list of distinct values"),
])
def test_a_bad_setting_stops_the_run_naming_the_variable(bench, clean_env, tmp_path, name, raw, problem):
    clean_env.setenv("BENCH_OUT", str(tmp_path / "out"))
    clean_env.setenv(name, raw)
    with pytest.raises(SystemExit, match=f"^{name}={raw!r}: {problem}"):
        bench.main([])
    assert not (tmp_path / "out").exists(), "nothing was written"


def test_missing_data_and_overlapping_rows_are_refused(bench, clean_env, inputs, tmp_path):
    clean_env.setenv("BENCH_FRONTIER_SST2", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="^BENCH_FRONTIER_SST2=.*nowhere.*no train.tsv there"):
        bench.config_from([])
    with pytest.raises(SystemExit, match=r"unknown arguments \['--full'\]"):
        bench.config_from(["--full"])
    quick_env(clean_env, inputs, tmp_path / "out")
    clean_env.setenv("BENCH_AG_TRAIN", "150")
    clean_env.setenv("BENCH_AG_EVAL", "100")
    with pytest.raises(SystemExit, match="BENCH_AG_TRAIN=150 \\+ BENCH_AG_EVAL=100 exceed the 180 rows"):
        bench.data(bench.config_from(["--quick"]), "ag_news")


def key_without_the_setting(bench, cfg, dataset):
    """Config.key as it was before BENCH_PERTURBATIONS_PER_EVAL and BENCH_FRONTIER_SCHEDULE existed: the key of the
    cells measured then."""
    ignored = {"b_values", "query_keys", "starts", "seeds", "datasets", "out", "threads", "bootstrap",
               "perturbations_per_eval", "schedules"} | (bench.AG_NEWS_ONLY if dataset == "sst2" else bench.SST2_ONLY)
    changing = {f.name: str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in ignored}
    return hashlib.sha256(json.dumps(changing, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- BENCH_FRONTIER_SCHEDULE


def test_a_schedule_other_than_the_default_is_a_setting_of_its_own_and_keeps_the_cell_keys(bench, clean_env):
    default = bench.Setting(1.5, "stock", "task-then-bcos")
    assert default.name == "B1.5-stockqk-task-then-bcos"  # the name of the cells measured before schedules
    assert bench.Setting(1.5, "stock", "task-then-bcos", "long-distilled").name == \
        "B1.5-stockqk-task-then-bcos-long-distilled"
    assert bench.Setting().name == bench.Setting(schedule="long-distilled").name == "conventional"  # one model
    both = bench.Config(b_values=(1.5,), query_keys=("stock",), starts=("task-then-bcos",),
                        schedules=("default", "long-distilled"))
    assert [s.name for s in bench.grid(both)] == ["B1.5-stockqk-task-then-bcos",
                                                  "B1.5-stockqk-task-then-bcos-long-distilled"]
    for dataset in ("sst2", "ag_news"):
        assert both.key(dataset) == bench.Config().key(dataset) == key_without_the_setting(bench, both, dataset)
    clean_env.setenv("BENCH_FRONTIER_SCHEDULE", "default,long-distilled")
    assert bench.Config.from_env().schedules == ("default", "long-distilled")
    cfg = bench.Config(n_train=1000, epochs=2, n_eval=400, n_acc=100)
    default_estimate = bench.estimate_seconds(cfg, default, "sst2")
    long_estimate = bench.estimate_seconds(cfg, bench.Setting(1.5, "stock", "task-then-bcos", "long-distilled"),
                                           "sst2")
    assert long_estimate - default_estimate == pytest.approx(
        bench.ESTIMATE["bcos_training_factor"] * bench.ESTIMATE["train_row_epoch"] * 1000 * 2)
    # a default B-cos cell's measured time (a cell written before schedules existed) is not the new schedule's
    done = [{"b": 1.5, "dataset": "sst2", "cpu_seconds": 100.0}]
    long_todo = [(bench.Setting(1.5, "stock", "task-then-bcos", "long-distilled"), 0, "sst2")]
    assert bench.budget(cfg, long_todo, done) == (pytest.approx(long_estimate), "estimated")
    assert bench.budget(cfg, [(default, 0, "sst2")], done) == (100.0, "measured")


def test_a_new_schedule_trains_only_its_own_b_cos_cell_longer_and_distilled_and_reuses_the_default_cells(
        bench, clean_env, inputs, tmp_path):
    quick_env(clean_env, inputs, tmp_path / "out")
    clean_env.setenv("BENCH_FRONTIER_DATA", "ag_news")
    real = bench.fine_tune_classifier
    trained = []  # (epochs, teacher, distill_weight) of every fine-tuning

    def recording(*args, **kwargs):
        trained.append((kwargs["epochs"], kwargs.get("teacher"), kwargs.get("distill_weight")))
        return real(*args, **kwargs)

    clean_env.setattr(bench, "fine_tune_classifier", recording)
    before = bench.main(["--quick"])  # BENCH_FRONTIER_SCHEDULE unset: the default schedule only
    assert before["computed"] == 2 and trained == [(3.0, None, None)] * 2  # the conventional model, then B-cos
    cells = tmp_path / "out" / "cells" / "ag_news"
    default_cells = {f: f.read_bytes() for f in cells.glob("*/*.json")}
    assert sorted(f.name for f in default_cells) == ["B1.25-stockqk-task-then-bcos-seed0.json",
                                                     "conventional-seed0.json"]
    clean_env.setenv("BENCH_FRONTIER_SCHEDULE", "default,long-distilled")
    after = bench.main(["--quick"])
    assert after["computed"] == 1 and after["trained"] == 1 and len(trained) == 3  # no conventional retraining
    epochs, teacher, weight = trained[2]
    assert epochs == 6.0 and weight == 1.0  # the B-cos stage only, at twice BENCH_EPOCHS, distilled
    conventional = tmp_path / "out" / "models" / "ag_news" / next(iter(default_cells)).parent.name / \
        "conventional-seed0"
    saved = T.BertForSequenceClassification.from_pretrained(conventional)
    teacher_weights = teacher.state_dict()  # the teacher is the seed's saved conventional model
    assert teacher_weights.keys() == saved.state_dict().keys()
    for name, value in saved.state_dict().items():
        assert torch.equal(teacher_weights[name].cpu(), value), name
    assert {f: f.read_bytes() for f in default_cells} == default_cells
    [new_cell] = set(cells.glob("*/*.json")) - set(default_cells)
    assert new_cell.parent == next(iter(default_cells)).parent  # the same settings key
    assert new_cell.name == "B1.25-stockqk-task-then-bcos-long-distilled-seed0.json"
    assert json.loads(new_cell.read_text())["schedule"] == "long-distilled"
    assert [(r["setting"], r["schedule"]) for r in after["rows"]] == [
        ("B1.25-stockqk-task-then-bcos", "default"), ("B1.25-stockqk-task-then-bcos-long-distilled", "long-distilled")]

    def measured(row):  # the SST-2 columns of an AG News-only run are NaN, which no comparison equals
        return {k: v for k, v in row.items() if v == v}

    assert measured(after["rows"][0]) == measured(before["rows"][0])


# ---------------------------------------------------------------- BENCH_PERTURBATIONS_PER_EVAL


@pytest.fixture(scope="module")
def tiny_classifier():
    """A tiny random BERT classifier, the MiniLM tokenizer and a batch of five sentences of different lengths."""
    from benchmarks.common import faithfulness

    tok = T.AutoTokenizer.from_pretrained(minilm_path())
    config = T.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, num_labels=2, attn_implementation="eager")
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(config).eval()
    texts = POSITIVE[:3] + NEGATIVE[:2]
    ids, mask = faithfulness.encode(tok, texts)
    [batch] = faithfulness.batches(ids, mask, torch.tensor([1, 1, 1, 0, 0]), tok, len(texts))
    return model, tok, texts, batch


def count_forwards(model) -> list[int]:
    """Rows of every full forward call of ``model`` (the classifier head runs once per call)."""
    rows: list[int] = []
    model.classifier.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    return rows


def test_the_setting_is_read_per_method_and_defaults_to_todays_cpu_values_and_256_on_cuda(bench):
    from benchmarks.common.faithfulness import perturbation_curve_rows, perturbations_per_eval

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = bench.Config()
    assert auto.perturbations_per_eval == 0
    assert [perturbations_per_eval(auto, m, cpu) for m in ("ShapSampl", "LIME", "Occlusion")] == [16, 32, 16]
    assert perturbation_curve_rows(auto, 8, cpu) == 64  # perturbation_curves' default, as before the setting
    assert [perturbations_per_eval(auto, m, cuda) for m in ("ShapSampl", "LIME", "Occlusion")] == [256] * 3
    assert perturbation_curve_rows(auto, 8, cuda) == 256 * 8
    chosen = bench.Config(perturbations_per_eval=4)
    for device in (cpu, cuda):
        assert [perturbations_per_eval(chosen, m, device) for m in ("ShapSampl", "LIME", "Occlusion")] == [4] * 3
        assert perturbation_curve_rows(chosen, 8, device) == 4 * 8


def test_the_setting_is_not_part_of_the_settings_key_so_finished_cells_stay_valid(bench, clean_env):
    for dataset in ("sst2", "ag_news"):
        keys = {bench.Config(perturbations_per_eval=n).key(dataset) for n in (0, 1, 16, 256)}
        assert keys == {key_without_the_setting(bench, bench.Config(), dataset)}, dataset
    clean_env.setenv("BENCH_PERTURBATIONS_PER_EVAL", "256")
    read = bench.Config.from_env()
    assert read.perturbations_per_eval == 256
    assert read.key("sst2") == dataclasses.replace(read, perturbations_per_eval=0).key("sst2")


def test_the_token_feature_mask_is_broadcast_and_gives_bitwise_the_expanded_masks_attributions(tiny_classifier):
    """Captum's ShapleyValueSampling reads its feature mask element by element with .item(); an expanded
    (batch, pos, hidden) mask made that, not the forward calls, the cost on a GPU."""
    from adapters.captum import EmbeddingForward
    from benchmarks.common.faithfulness import mask_baseline, token_feature_mask

    model, tok, _, b = tiny_classifier
    fwd = EmbeddingForward(model)
    emb = fwd.embed(b.ids, b.mask)
    mask = token_feature_mask(emb)
    assert mask.shape == (1, emb.shape[1], 1)
    expanded = mask.expand_as(emb).contiguous()
    baseline = mask_baseline(fwd, b, tok.mask_token_id)
    for method, kwargs in ((ShapleyValueSampling, {"n_samples": 3}), (Lime, {"n_samples": 20})):
        attributions = []
        for feature_mask in (expanded, mask):
            torch.manual_seed(1)
            attributions.append(method(fwd).attribute(emb, target=b.target, additional_forward_args=(b.mask,),
                                                      baselines=baseline, feature_mask=feature_mask,
                                                      perturbations_per_eval=16, **kwargs))
        assert torch.equal(*attributions), method.__name__
    item_calls = [0]
    real_item = torch.Tensor.item

    def counted_item(tensor):
        item_calls[0] += 1
        return real_item(tensor)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "item", counted_item)
        ShapleyValueSampling(fwd).attribute(emb, target=b.target, additional_forward_args=(b.mask,),
                                            baselines=baseline, feature_mask=mask, n_samples=3)
    # per permutation sample one read per token and one per forward call (one per token here) and a few more, not
    # one per element of batch x tokens x hidden (3 x 5 x 10 x 32 = 4,800 with the expanded mask)
    assert item_calls[0] <= 3 * 2 * emb.shape[1] + 5, item_calls[0]


def test_a_large_setting_makes_fewer_forward_calls_and_the_same_scores_and_curves(bench, tiny_classifier):
    from benchmarks.common.faithfulness import MethodResult, evaluate_sst2, make_methods

    model, tok, texts, b = tiny_classifier
    base = bench.Config(batch=len(texts), ig_steps=4, shapley_samples=3, lime_samples=20)
    settings = {"one per call": 1, "today's CPU values": 0, "large": 256}
    scores, forwards, curves = {}, {}, {}
    for label, per_eval in settings.items():
        cfg = dataclasses.replace(base, perturbations_per_eval=per_eval)
        methods = bench.posthoc_methods(model, tok.mask_token_id, cfg)
        assert sorted(methods) == ["IG (4 steps, [MASK] baseline)", "LIME (20)", "Occlusion", "ShapSampl (3)"]
        for name, method in methods.items():
            rows = count_forwards(model)
            torch.manual_seed(2)
            scores[label, name] = method.run(b)
            forwards[label, name] = len(rows)
            model.classifier._forward_hooks.clear()
        rows = count_forwards(model)
        results: dict[str, MethodResult] = {}
        torch.manual_seed(2)
        evaluate_sst2(make_methods(model, None, tok.mask_token_id, cfg), {"conventional": model}, tok, texts, cfg,
                      results)
        model.classifier._forward_hooks.clear()
        forwards[label, "evaluate_sst2"] = len(rows)
        curves[label] = {name: bench.PerturbationCurves.concatenate(r.curves) for name, r in results.items()}
    n_tokens = b.ids.shape[1]
    for name in ("ShapSampl (3)", "Occlusion"):  # one call per token (and sample) at 1; one per sample at 256
        assert forwards["one per call", name] > forwards["today's CPU values", name] >= forwards["large", name]
    assert forwards["large", "ShapSampl (3)"] == 3 + 1 and forwards["one per call", "ShapSampl (3)"] > 3 * n_tokens
    assert forwards["large", "LIME (20)"] == len(texts) + 1 < forwards["one per call", "LIME (20)"]
    assert forwards["large", "evaluate_sst2"] < forwards["today's CPU values", "evaluate_sst2"]
    for label in ("one per call", "large"):
        for name in {n for _, n in scores}:
            torch.testing.assert_close(scores[label, name], scores["today's CPU values", name], rtol=1e-5,
                                       atol=1e-6, msg=f"{label}: {name}")
        assert curves[label].keys() == curves["today's CPU values"].keys()
        for name, curve in curves[label].items():
            reference = curves["today's CPU values"][name]
            for part in ("comprehensiveness", "sufficiency", "full_probability"):
                torch.testing.assert_close(getattr(curve, part), getattr(reference, part), rtol=1e-5, atol=1e-6,
                                           msg=f"{label}: {name} {part}")
            assert torch.equal(curve.k, reference.k), name


def test_the_budget_reads_as_cpu_time_and_says_a_gpu_run_is_much_shorter(bench):
    """On a GPU the budget's CPU-hours of one torch thread are not the run's wall time (it said they were)."""
    on_cpu = bench.budget_wording(7200.0, "estimated", torch.device("cpu"))
    assert on_cpu == "about 2.00 CPU-hours (estimated; one torch thread, so about the wall time on an idle core)"
    on_gpu = bench.budget_wording(7200.0, "estimated", torch.device("cuda", 0))
    assert on_gpu == ("about 2.00 CPU-hours (estimated; a CPU-time estimate for one torch thread: this run is on cuda, "
                      "so it takes much less wall time)")
    assert "wall time on an idle core" not in on_gpu


def _synthetic_cell(bench, setting: str, seed: int, dataset: str, method: str, shift: float) -> dict:
    """A finished cell of ``dataset`` whose one method scores ``shift`` plus a per-unit pattern."""
    units = [float(i % 5) for i in range(20)]
    labels = [i % 2 for i in range(10)]
    record = ({"comp": [u + shift for u in units], "suff": [u - shift for u in units], "entropy": [1.0] * 20}
              if dataset == "sst2" else {"seqpg": [u + shift for u in units], "seqpg_wrong": [0.0] * 20})
    predictions = labels if setting == bench.CONVENTIONAL else [1 - y if i < seed else y for i, y in enumerate(labels)]
    b = None if setting == bench.CONVENTIONAL else 1.5
    return {"setting": setting, "b": b, "query_key": "stock", "start": "task-then-bcos", "schedule": "default",
            "seed": seed, "dataset": dataset, "n_units": 20, "labels": labels, "predictions": predictions,
            "accuracy": sum(p == y for p, y in zip(predictions, labels, strict=True)) / len(labels),
            "methods": {method: record}}


def _one_b_cos_setting(bench, clean_env, tmp_path):
    """The config of a run over one B-cos setting (B = 1.5, stock query/key, task then B-cos) writing to ``tmp_path``,
    and that setting's name."""
    clean_env.setenv("BENCH_OUT", str(tmp_path))
    clean_env.setenv("BENCH_FRONTIER_B", "1.5")
    clean_env.setenv("BENCH_FRONTIER_QK", "stock")
    clean_env.setenv("BENCH_FRONTIER_START", "task-then-bcos")
    clean_env.setenv("BENCH_FRONTIER_BOOTSTRAP", "200")
    cfg = bench.Config.from_env()
    return cfg, bench.grid(cfg)[0].name


def test_the_report_has_a_row_per_seed_whose_differences_are_that_seeds_alone(bench, clean_env, tmp_path):
    cfg, name = _one_b_cos_setting(bench, clean_env, tmp_path)
    # seed 0: B-cos leads by 2 on every metric; seed 1: by 6 (Suff: lower is better, so -2 and -6)
    cells = [cell for seed, lead in ((0, 2.0), (1, 6.0)) for ds in ("sst2", "ag_news")
             for cell in (_synthetic_cell(bench, bench.CONVENTIONAL, seed, ds, "Occlusion", 0.0),
                          _synthetic_cell(bench, name, seed, ds, "B-cos", lead))]
    rows, posthoc = bench.aggregate(cells, cfg)
    per_seed = bench.seed_rows(rows, cells, cfg)
    assert [(r["setting"], r["seed"]) for r in per_seed] == [(name, 0), (name, 1)]
    for r, lead in zip(per_seed, (2.0, 6.0), strict=True):
        assert r["comp_diff"] == pytest.approx(lead) and r["seqpg_diff"] == pytest.approx(lead)
        assert r["suff_diff"] == pytest.approx(-lead)
        # a constant difference has no interval (it was a zero-width one, [lead, lead]: session 22 refuses that
        # certainty in paired_bootstrap_difference, tests/test_leftovers_s22.py)
        assert math.isnan(r["comp_low"]) and math.isnan(r["comp_high"])
    assert per_seed[0]["sst2_accuracy_diff"] == 0.0 and per_seed[1]["sst2_accuracy_diff"] == pytest.approx(-10.0)
    assert rows[0]["comp_diff"] == pytest.approx(4.0)  # pooled over both seeds' sentences
    bench.write_report(rows, posthoc, cfg, cells)
    report = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "Per seed" in report
    assert f"| {name} | 1 | -10.0 [" in report and "| +6.0 [no interval] | -6.0 [no interval] | +6.0 [no interval] |" \
        in report
    one_seed = [c for c in cells if c["seed"] == 0]
    bench.write_report(*bench.aggregate(one_seed, cfg), cfg, one_seed)
    assert "Per seed" not in (tmp_path / "results.md").read_text(encoding="utf-8")


class Stopped(Exception):
    """A run stopped from outside (Ctrl-C, the end of a session) while a method was being evaluated."""


def test_a_cell_stopped_between_methods_resumes_at_the_next_with_the_uninterrupted_numbers(
        bench, clean_env, inputs, tmp_path):
    real = bench.evaluate_sst2
    calls = []  # (method names, torch's random state as the call starts) of every evaluation call
    stop_at = []

    def recording(methods, *args, **kwargs):
        calls.append((list(methods), torch.get_rng_state()))
        if len(calls) in stop_at:
            raise Stopped
        return real(methods, *args, **kwargs)

    clean_env.setattr(bench, "evaluate_sst2", recording)
    quick_env(clean_env, inputs, tmp_path / "straight")
    clean_env.setenv("BENCH_FRONTIER_DATA", "sst2")
    straight = bench.main(["--quick"])
    [straight_cell] = (tmp_path / "straight" / "cells" / "sst2").glob(f"*/{bench.CONVENTIONAL}-seed0.json")
    straight_calls = list(calls)
    assert [len(names) for names, _ in straight_calls] == [1] * 5  # four post-hoc methods one call each, B-cos

    clean_env.setenv("BENCH_OUT", str(tmp_path / "stopped"))
    calls.clear()
    stop_at.append(3)  # the conventional cell's third post-hoc method (LIME, which samples): stopped there
    with pytest.raises(Stopped):
        bench.main(["--quick"])
    cells = tmp_path / "stopped" / "cells" / "sst2"
    assert not list(cells.glob("*/*.json"))  # no cell was finished ...
    [progress] = cells.glob(f"*/{bench.CONVENTIONAL}-seed0{bench.PROGRESS_SUFFIX}")
    assert list(json.loads(progress.read_text())["methods"]) == calls[0][0] + calls[1][0]  # ... but two methods were

    calls.clear()
    stop_at.clear()
    resumed = bench.main(["--quick"])
    assert [names for names, _ in calls] == [names for names, _ in straight_calls[2:]]  # on from the third method
    for (_, state), (_, straight_state) in zip(calls, straight_calls[2:], strict=True):
        assert torch.equal(state, straight_state)  # the random numbers an uninterrupted run draws
    assert not progress.exists()
    [resumed_cell] = cells.glob(f"*/{bench.CONVENTIONAL}-seed0.json")
    a, b = json.loads(straight_cell.read_text()), json.loads(resumed_cell.read_text())
    assert list(a["methods"]) == list(b["methods"])
    for name in a["methods"]:
        for key in ("comp", "suff", "entropy"):
            assert a["methods"][name][key] == b["methods"][name][key], (name, key)
    assert a["predictions"] == b["predictions"]
    assert [r["comp_diff"] for r in straight["rows"]] == [r["comp_diff"] for r in resumed["rows"]]


def test_the_best_post_hoc_method_is_the_highest_comp_and_seqpg_and_the_lowest_suff(bench, clean_env, tmp_path):
    """Two post-hoc methods, each the best on another metric: every Δ is B-cos minus that metric's best."""
    cfg, name = _one_b_cos_setting(bench, clean_env, tmp_path)
    cells = []
    for ds in ("sst2", "ag_news"):
        conv = _synthetic_cell(bench, bench.CONVENTIONAL, 0, ds, "Occlusion", 3.0)  # Comp, SeqPG +3; Suff -3
        lime = _synthetic_cell(bench, bench.CONVENTIONAL, 0, ds, "LIME (5)", 1.0)  # Comp, SeqPG +1; Suff -1
        # LIME worse on Comp and SeqPG, and on Suff (-1 > -3, lower is better) too: make its Suff the best
        if ds == "sst2":
            lime["methods"]["LIME (5)"]["suff"] = [v - 10.0 for v in lime["methods"]["LIME (5)"]["suff"]]
        conv["methods"].update(lime["methods"])
        cells += [conv, _synthetic_cell(bench, name, 0, ds, "B-cos", 3.0)]  # B-cos equals Occlusion's scores
    rows, posthoc = bench.aggregate(cells, cfg)
    assert {r["setting"]: r["comp"] for r in posthoc} == {"post-hoc: LIME (5)": pytest.approx(3.0),
                                                          "post-hoc: Occlusion": pytest.approx(5.0)}
    row = rows[0]
    assert (row["best_posthoc_comp"], row["best_posthoc_suff"], row["best_posthoc_seqpg"]) == (
        "Occlusion", "LIME (5)", "Occlusion")
    # B-cos has Occlusion's very scores: a zero difference, without an interval (a zero-width one before session 22)
    assert row["comp_diff"] == 0.0 and math.isnan(row["comp_low"]) and math.isnan(row["comp_high"])
    assert row["seqpg_diff"] == 0.0
    assert row["suff_diff"] == pytest.approx(10.0 - 2.0)  # B-cos (u - 3) minus LIME's (u - 1 - 10)
    assert math.isnan(row["suff_low"]) and math.isnan(row["suff_high"])  # the same 8.0 on every unit: no interval
