"""The examples' environment settings go through bcos_plugins._env: unset variables keep the documented
defaults, set ones parse, and a bad value (a typo, an out-of-range count, a switch other than 0 or 1) stops the
script naming the variable, the value and the fix instead of falling back to a default or a bare ValueError.

Each script's own settings function is called here (the scripts' runs take minutes; their settings are read
before any work).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
# script -> (its settings function, the prefix of its variables)
SCRIPTS = {"demo_sst2": ("demo_settings", "DEMO_"), "blimp_mrr": ("blimp_settings", "BLIMP_"),
           "vit_digits": ("vit_digits_settings", "VIT_"), "inseq_quickstart": ("quickstart_settings", "QUICKSTART_")}


@functools.cache
def example(name: str):
    """The example script as a module, imported with none of its variables set (two read them at import)."""
    prefix = SCRIPTS[name][1]
    with mock.patch.dict(os.environ, {k: v for k, v in os.environ.items() if not k.startswith(prefix)}, clear=True):
        spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def settings(name: str):
    module = example(name)
    return getattr(module, SCRIPTS[name][0])()


@pytest.fixture
def clean_environment(monkeypatch):
    for variable in [v for v in os.environ if v.startswith(tuple(prefix for _, prefix in SCRIPTS.values()))]:
        monkeypatch.delenv(variable)


@pytest.mark.parametrize(("name", "expected"), [
    ("demo_sst2", dict(n_train=2000, n_test=400, epochs=2.0, max_length=48, n_explain=4, threads=3)),
    ("blimp_mrr", dict(epochs=8.0, n_eval=100, seed=0, threads=1)),
    ("vit_digits", dict(epochs=12, baseline_epochs=30, n_grids=60, n_perturb=150, ablation=False, reuse=False,
                        threads=1)),
    ("inseq_quickstart", dict(steps=80, threads=1)),
])
def test_unset_variables_give_the_documented_defaults(clean_environment, monkeypatch, name, expected):
    if name == "demo_sst2":  # its default thread count is the cores the load leaves free, whatever they are now
        monkeypatch.setattr(example(name), "free_cores", lambda: 3)
    assert settings(name)._asdict() == expected


@pytest.mark.parametrize(("name", "variables", "field", "value"), [
    ("demo_sst2", {"DEMO_EPOCHS": "0.5", "DEMO_THREADS": "1"}, "epochs", 0.5),
    ("blimp_mrr", {"BLIMP_EVAL": "299"}, "n_eval", 299),
    ("vit_digits", {"VIT_REUSE": "1"}, "reuse", True),
    ("vit_digits", {"VIT_PRIOR_ABLATION": "1"}, "ablation", True),
    ("inseq_quickstart", {"QUICKSTART_STEPS": " 5 "}, "steps", 5),
])
def test_set_variables_reach_the_settings(clean_environment, monkeypatch, name, variables, field, value):
    for variable, raw in variables.items():
        monkeypatch.setenv(variable, raw)
    assert getattr(settings(name), field) == value


@pytest.mark.parametrize(("name", "variable", "raw", "message"), [
    # before, 0 was raised to 1 threads silently
    ("demo_sst2", "DEMO_THREADS", "0", "DEMO_THREADS='0': out of range (must be >= 1)"),
    ("demo_sst2", "DEMO_EPOCHS", "two", "DEMO_EPOCHS='two': not a number. Set DEMO_EPOCHS to a number > 0, e.g. "
                                        "DEMO_EPOCHS=2, or unset it for the default 2."),
    ("demo_sst2", "DEMO_MAX_LENGTH", "2", "DEMO_MAX_LENGTH='2': out of range (must be >= 3)"),
    ("blimp_mrr", "BLIMP_EVAL", "300", "BLIMP_EVAL='300': out of range (must be >= 1 and <= 299)"),
    ("blimp_mrr", "BLIMP_EPOCHS", "0", "BLIMP_EPOCHS='0': out of range (must be > 0)"),
    # before, any switch value but 1 was silently off
    ("vit_digits", "VIT_REUSE", "yes", "VIT_REUSE='yes': not a switch. Set VIT_REUSE to 1 (on) or 0 (off), or unset "
                                       "it for the default 0."),
    ("vit_digits", "VIT_PRIOR_ABLATION", "true", "VIT_PRIOR_ABLATION='true': not a switch"),
    ("vit_digits", "VIT_GRIDS", "6e1", "VIT_GRIDS='6e1': not a whole number"),
    ("inseq_quickstart", "QUICKSTART_STEPS", "80.5", "QUICKSTART_STEPS='80.5': not a whole number. Set "
                                                     "QUICKSTART_STEPS to a whole number >= 1, e.g. "
                                                     "QUICKSTART_STEPS=80, or unset it for the default 80."),
])
def test_a_bad_value_stops_the_script_naming_the_variable(clean_environment, monkeypatch, name, variable, raw,
                                                          message):
    example(name)  # imported before the bad value is set: two scripts read their settings at import
    monkeypatch.setenv(variable, raw)
    with pytest.raises(SystemExit) as excinfo:
        settings(name)
    assert str(excinfo.value).startswith(message)
