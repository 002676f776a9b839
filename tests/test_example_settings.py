"""The examples' environment settings go through benchmarks.common.settings: unset variables keep the documented
defaults, set ones parse, and a bad value (a typo, an out-of-range count, a switch other than 0 or 1) stops the
script naming the variable, the value and the fix instead of falling back to a default or a bare ValueError.

Each script's own settings function is called here (the scripts' runs take minutes; their settings are read
before any work). The scripts read their variables when the run starts, not when they are imported: a module
imported once sees the variables set after it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys

import pytest

# script -> (its settings function, the prefix of its variables)
SCRIPTS = {"demo_sst2": ("demo_settings", "DEMO_"), "blimp_mrr": ("blimp_settings", "BLIMP_"),
           "vit_digits": ("vit_digits_settings", "VIT_"), "inseq_quickstart": ("quickstart_settings", "QUICKSTART_")}


@functools.cache
def example(name: str):
    """The example script as a module, imported once for all the tests, whatever the variables are then."""
    return importlib.import_module(f"examples.{name}")


def settings(name: str):
    module = example(name)
    return getattr(module, SCRIPTS[name][0])()


def as_dict(values) -> dict:
    return dataclasses.asdict(values) if dataclasses.is_dataclass(values) else values._asdict()


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
    assert as_dict(settings(name)) == expected


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
    example(name)  # imported before the bad value is set: the settings function reads it
    monkeypatch.setenv(variable, raw)
    with pytest.raises(SystemExit) as excinfo:
        settings(name)
    assert str(excinfo.value).startswith(message)


@pytest.mark.parametrize(("name", "variable", "raw"), [("blimp_mrr", "BLIMP_EVAL", "300"),
                                                       ("vit_digits", "VIT_REUSE", "yes")])
def test_importing_a_script_reads_no_variable(clean_environment, monkeypatch, name, variable, raw):
    """A bad value set before the import stops the run, not the import (the module's helpers stay usable, e.g.
    by a test)."""
    import examples

    monkeypatch.setenv(variable, raw)
    # imported anew; the module imported before is back after the test (in sys.modules and on the package)
    monkeypatch.delitem(sys.modules, f"examples.{name}", raising=False)
    monkeypatch.delattr(examples, name, raising=False)
    module = importlib.import_module(f"examples.{name}")
    with pytest.raises(SystemExit, match=f"^{variable}={raw!r}"):
        getattr(module, SCRIPTS[name][0])()


class _Started(Exception):
    """Raised in place of the run's first call after reading its settings, so no work is done."""


@pytest.mark.parametrize(("name", "variable", "field"), [("blimp_mrr", "BLIMP_THREADS", "threads"),
                                                         ("vit_digits", "VIT_THREADS", "threads")])
def test_a_variable_set_after_the_import_reaches_the_run(clean_environment, monkeypatch, name, variable, field):
    """``main`` reads the settings when it starts: a variable set after the import (here its thread count, the
    first thing the run uses) is the one the run uses, not a value frozen when the module was imported."""
    module = example(name)
    monkeypatch.setenv(variable, "3")
    assert getattr(settings(name), field) == 3
    used = []

    def set_num_threads(n):
        used.append(n)
        raise _Started

    monkeypatch.setattr(module.hf_logging, "set_verbosity_error", lambda: None)  # leaves transformers' logging
    monkeypatch.setattr(module.torch, "set_num_threads", set_num_threads)
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])  # run as the Makefile runs it: pytest's own arguments are not its
    with pytest.raises(_Started):
        module.main()
    assert used == [3]
