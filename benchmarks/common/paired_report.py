"""Results files of several seeds, each model paired by seed against a baseline model on the same evaluation pairs.

The engine of ``examples/guided_esnli.py --report`` (a results file per run and seed, as that example writes
them: ``labels``, ``settings.seed``, ``chance.iou`` and per model ``predictions`` and ``attention.iou``); the
statistics are ``bcos_plugins.metrics.paired_accuracy_difference``. Its messages name the example's options.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bcos_plugins.metrics import paired_accuracy_difference
from bcos_plugins.metrics.paired import NoSpreadError

__all__ = ["paired_report"]


def paired_report(files: list[Path], baseline: str, margin: float, confidence: float = 0.95) -> dict:
    """Every model of the results ``files`` against the ``baseline`` model, paired by seed on the same evaluation
    pairs (``paired_accuracy_difference``), with each seed's attention IoU over chance; prints a table and
    returns it. A model is named ``<run>/<model>``, the run being the file name without ``_seed<N>`` (so that
    two runs of the same seed may both train ``stock-supervised``); ``baseline`` is a full name or a model name
    that only one run has.

    A seed on which the model or the baseline did not learn (its ``did_not_learn`` reasons, written by the
    example) is left out of that model's pairing and printed with the reasons, never averaged in: its accuracy
    difference and attention say nothing about the training mode. Files written before the example checked
    this are paired and named as unchecked."""
    runs: dict[str, dict[int, dict]] = {}
    labels = None
    for file in files:
        if not Path(file).is_file():
            raise SystemExit(f"--report: no results file {file}; run the seeds first (make guided-esnli-seeds)")
        results = json.loads(Path(file).read_text(encoding="utf-8"))
        if "labels" not in results:
            raise SystemExit(f"--report: {file} has no per-example predictions (written before they were "
                             "stored); re-run it with this version")
        if labels is not None and results["labels"] != labels:
            raise SystemExit(f"--report: {file} was evaluated on other pairs than {files[0]} (--train/--eval "
                             "differ); compare runs of one evaluation set")
        labels = results["labels"]
        run = re.sub(r"_seed\d+$", "", Path(file).stem)
        seed = results["settings"]["seed"]
        for name, value in results.items():
            if isinstance(value, dict) and "predictions" in value:
                iou = value["attention"]["iou"] / results["chance"]["iou"]
                model = runs.setdefault(f"{run}/{name}", {})
                if seed in model:
                    raise SystemExit(f"--report: {run}/{name} appears twice for seed {seed}; pass each run once")
                # None: written before the example judged whether a model learnt (unchecked)
                model[seed] = {"predictions": value["predictions"], "iou_x_chance": iou,
                               "did_not_learn": value.get("did_not_learn")}
    matches = [key for key in runs if key == baseline or key.split("/", 1)[1] == baseline]
    if len(matches) != 1:
        raise SystemExit(f"--baseline: {baseline!r} names {len(matches)} models of {sorted(runs)}; name one")
    reference = runs[matches[0]]
    report = {}
    print(f"paired against {matches[0]} (margin {margin * 100:g} points; {confidence:.1%} t-interval over seeds)")
    print(f"{'model':44s} {'seeds':>5s} {'acc':>6s} {'diff':>6s} {'interval':>15s} {'McNemar p':>9s} "
          f"{'no worse':>8s} {'attn IoU x chance (min-max)':>27s}")
    notes = []
    for key, model in runs.items():
        common = sorted(set(model) & set(reference))
        if key == matches[0] or not common:
            continue
        excluded = {s: [f"{who}: {reason}" for who, found in ((key, model[s]), (matches[0], reference[s]))
                        for reason in found["did_not_learn"] or []] for s in common}
        excluded = {s: reasons for s, reasons in excluded.items() if reasons}
        unchecked = [s for s in common if model[s]["did_not_learn"] is None or reference[s]["did_not_learn"] is None]
        notes += [f"{key} seed {s}: left out, did not learn ({'; '.join(reasons)})" for s, reasons in excluded.items()]
        if unchecked:
            notes.append(f"{key} seeds {unchecked}: unchecked (results written before the did-not-learn check)")
        seeds = [s for s in common if s not in excluded]
        if not seeds:
            report[key] = {"seeds": [], "excluded_seeds": excluded}
            print(f"{key:44s} {0:5d}  no seed left to pair: every one did not learn")
            continue
        try:
            paired = paired_accuracy_difference([reference[s]["predictions"] for s in seeds],
                                                [model[s]["predictions"] for s in seeds], labels, confidence)
        except NoSpreadError as error:
            # the seeds' differences are all equal: no spread over seeds, so no interval and no non-inferiority (only
            # that refusal: an input error, such as a label of -1, showed as "no interval" and the report went on)
            report[key] = {"seeds": seeds, "no_interval": str(error), "excluded_seeds": excluded,
                           "unchecked_seeds": unchecked}
            print(f"{key:44s} {len(seeds):5d}  no interval: {error}")
            continue
        ious = [model[s]["iou_x_chance"] for s in seeds]
        report[key] = {**paired.as_dict(), "seeds": seeds, "non_inferior": paired.non_inferior(margin),
                       "iou_x_chance": ious, "excluded_seeds": excluded, "unchecked_seeds": unchecked}
        mean = sum(paired.accuracy_b) / len(seeds)
        print(f"{key:44s} {len(seeds):5d} {mean * 100:6.2f} {paired.difference * 100:+6.2f} "
              f"[{paired.ci_low * 100:+6.2f}, {paired.ci_high * 100:+5.2f}] {paired.mcnemar_p:9.3f} "
              f"{'yes' if paired.non_inferior(margin) else 'no':>8s} {min(ious):13.2f} - {max(ious):.2f}")
    for note in notes:
        print(note)
    return report
