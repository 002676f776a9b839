"""The scripts' environment settings (benchmarks.common.settings): values parse, bad ones stop with the variable,
the value and the fix in the message, and nothing falls back to a default silently."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common.settings import env_choice, env_flag, env_float, env_int, env_path


def message(excinfo) -> str:
    return str(excinfo.value)


def test_unset_gives_the_default_and_set_values_parse(monkeypatch):
    monkeypatch.delenv("BENCH_X", raising=False)
    assert env_int("BENCH_X", 16) == 16
    assert env_float("BENCH_X", 2e-4) == 2e-4
    assert env_flag("BENCH_X", True) is True
    assert env_choice("BENCH_X", "local", ("local", "hub")) == "local"
    monkeypatch.setenv("BENCH_X", " 32 ")
    assert env_int("BENCH_X", 16, minimum=1) == 32
    monkeypatch.setenv("BENCH_X", "1e-4")
    assert env_float("BENCH_X", 2e-4, minimum=0, exclusive_minimum=True) == 1e-4
    monkeypatch.setenv("BENCH_X", "0")
    assert env_flag("BENCH_X", True) is False
    assert env_int("BENCH_X", 1200, minimum=0) == 0  # the bound is inclusive
    monkeypatch.setenv("BENCH_X", "hub")
    assert env_choice("BENCH_X", "local", ("local", "hub")) == "hub"


@pytest.mark.parametrize("raw", ["abc", "1e3", "2.0", "", "16 sentences"])
def test_an_integer_that_does_not_parse_names_variable_value_and_fix(monkeypatch, raw):
    monkeypatch.setenv("BENCH_EVAL", raw)
    with pytest.raises(SystemExit) as excinfo:
        env_int("BENCH_EVAL", 16, minimum=1)
    assert message(excinfo) == (f"BENCH_EVAL={raw!r}: not a whole number. Set BENCH_EVAL to a whole number >= 1, "
                                "e.g. BENCH_EVAL=16, or unset it for the default 16.")


def test_an_integer_out_of_range_says_the_range(monkeypatch):
    monkeypatch.setenv("BENCH_THREADS", "-1")
    with pytest.raises(SystemExit) as excinfo:
        env_int("BENCH_THREADS", 0, minimum=0)
    assert message(excinfo) == ("BENCH_THREADS='-1': out of range (must be >= 0). Set BENCH_THREADS to a whole "
                                "number >= 0, e.g. BENCH_THREADS=0, or unset it for the default 0.")
    monkeypatch.setenv("BENCH_THREADS", "9")
    with pytest.raises(SystemExit, match=r"out of range \(must be >= 1 and <= 8\)"):
        env_int("BENCH_THREADS", 1, minimum=1, maximum=8)


@pytest.mark.parametrize("raw, problem", [("fast", "not a number"), ("nan", "not a finite number"),
                                          ("inf", "not a finite number"), ("0", "out of range (must be > 0)"),
                                          ("-2", "out of range (must be > 0)")])
def test_a_bad_float_names_variable_value_and_fix(monkeypatch, raw, problem):
    monkeypatch.setenv("BENCH_EPOCHS", raw)
    with pytest.raises(SystemExit) as excinfo:
        env_float("BENCH_EPOCHS", 2.0, minimum=0, exclusive_minimum=True)
    assert message(excinfo) == (f"BENCH_EPOCHS={raw!r}: {problem}. Set BENCH_EPOCHS to a number > 0, e.g. "
                                "BENCH_EPOCHS=2, or unset it for the default 2.")


def test_a_float_above_its_maximum(monkeypatch):
    monkeypatch.setenv("BENCH_SEQPG_MIN_CONF", "1.5")
    with pytest.raises(SystemExit, match=r"^BENCH_SEQPG_MIN_CONF='1.5': out of range \(must be >= 0 and <= 1\)"):
        env_float("BENCH_SEQPG_MIN_CONF", 0.75, minimum=0, maximum=1)


@pytest.mark.parametrize("raw", ["yes", "true", "2", ""])
def test_a_switch_other_than_0_or_1_is_an_error_not_false(monkeypatch, raw):
    monkeypatch.setenv("BENCH_RETRAIN", raw)
    with pytest.raises(SystemExit) as excinfo:
        env_flag("BENCH_RETRAIN", False)
    assert message(excinfo) == (f"BENCH_RETRAIN={raw!r}: not a switch. Set BENCH_RETRAIN to 1 (on) or 0 (off), or "
                                "unset it for the default 0.")


def test_a_choice_outside_the_list_names_the_choices(monkeypatch):
    monkeypatch.setenv("BENCH_DATA_SOURCE", "Hub")  # spelled exactly as listed, no case folding
    with pytest.raises(SystemExit) as excinfo:
        env_choice("BENCH_DATA_SOURCE", "local", ("local", "hub"))
    assert message(excinfo) == ("BENCH_DATA_SOURCE='Hub': not one of 'local' or 'hub'. Set BENCH_DATA_SOURCE to one "
                                "of 'local' or 'hub', or unset it for the default 'local'.")


def test_a_folder_is_any_path_and_an_empty_one_is_an_error_not_the_current_folder(monkeypatch):
    monkeypatch.delenv("BENCH_OUT", raising=False)
    assert env_path("BENCH_OUT", "outputs/bench") == Path("outputs/bench")
    monkeypatch.setenv("BENCH_OUT", "runs/one two")
    assert env_path("BENCH_OUT", "outputs/bench") == Path("runs/one two")
    for raw in ("", "  "):
        monkeypatch.setenv("BENCH_OUT", raw)
        with pytest.raises(SystemExit) as excinfo:
            env_path("BENCH_OUT", Path("outputs/bench"))
        assert message(excinfo) == (f"BENCH_OUT={raw!r}: empty, which would be the current folder. Set BENCH_OUT to a "
                                    "folder, e.g. BENCH_OUT=outputs/bench, or unset it for the default outputs/bench.")


def test_the_recipe_benchmark_stops_on_a_bad_setting_before_any_work(tmp_path):
    """bench_recipes reads its settings when the run starts: a bad one ends the script with status 1 and the
    message."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_recipes.py"
    env = {**os.environ, "BENCH_SEED": "-1", "BENCH_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), "conv"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "BENCH_SEED='-1': out of range (must be >= 0). Set BENCH_SEED to a whole number >= 0, e.g. BENCH_SEED=0, "
        "or unset it for the default 0.")
    assert not any(tmp_path.iterdir()), "nothing was written"


def _benchmark(monkeypatch, name: str):
    """``benchmarks.<name>`` imported anew (importing it reads no variable); the module imported before, if
    any, is back after the test (in ``sys.modules`` and on the package)."""
    import benchmarks

    monkeypatch.delitem(sys.modules, f"benchmarks.{name}", raising=False)
    monkeypatch.delattr(benchmarks, name, raising=False)
    return importlib.import_module(f"benchmarks.{name}")


class _Started(Exception):
    """Raised in place of the run's first call after reading its settings, so no work is done."""


def _stop_at_first_call(monkeypatch, bench) -> list[int]:
    """Make the benchmark's ``torch.set_num_threads`` (the first thing a run does with its settings) record
    its argument and raise ``_Started``; returns the record."""
    used: list[int] = []

    def set_num_threads(n):
        used.append(n)
        raise _Started

    monkeypatch.setattr(bench.torch, "set_num_threads", set_num_threads)
    return used


@pytest.fixture
def no_bench_variables(monkeypatch):
    for variable in [v for v in os.environ if v.startswith("BENCH_")]:
        monkeypatch.delenv(variable)


def test_the_recipe_benchmark_reads_its_settings_when_the_run_starts(no_bench_variables, monkeypatch, tmp_path):
    """Importing bench_recipes reads no variable (a bad one set before the import stops the run, not the import);
    ``Settings.from_env()`` and ``main`` see the variables set after the import."""
    monkeypatch.setenv("BENCH_SEED", "-1")
    bench = _benchmark(monkeypatch, "bench_recipes")
    with pytest.raises(SystemExit, match=r"^BENCH_SEED='-1': out of range \(must be >= 0\)"):
        bench.Settings.from_env()
    monkeypatch.delenv("BENCH_SEED")
    assert bench.Settings.from_env() == bench.Settings()
    monkeypatch.setenv("BENCH_DATA", "ag_news")  # BENCH_TRAIN's default follows the data set
    monkeypatch.setenv("BENCH_THREADS", "3")
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "out"))
    cfg = bench.Settings.from_env()
    assert (cfg.data, cfg.n_train, cfg.threads, cfg.out) == ("ag_news", 600, 3, tmp_path / "out")
    used = _stop_at_first_call(monkeypatch, bench)
    with pytest.raises(_Started):
        bench.main(["conv"])
    assert used == [3]
    assert not (tmp_path / "out").exists(), "nothing was written"


@pytest.mark.parametrize(("name", "settings", "default"), [("bench_faithfulness", "Config", "outputs/bench_faithfulness"),
                                                           ("bench_decoders", "Settings", "outputs/bench_decoders")])
def test_the_benchmarks_read_their_output_folder_when_the_run_starts(no_bench_variables, monkeypatch, tmp_path, name,
                                                                      settings, default):
    """BENCH_OUT set after the import is the folder the run writes to; unset, the documented default."""
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "at-import"))
    bench = _benchmark(monkeypatch, name)
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "at-start"))
    assert getattr(bench, settings).from_env().out == tmp_path / "at-start"
    monkeypatch.delenv("BENCH_OUT")
    assert getattr(bench, settings).from_env().out == Path(default)


def test_the_decoder_benchmark_writes_nothing_before_its_settings_are_read(no_bench_variables, monkeypatch, tmp_path):
    bench = _benchmark(monkeypatch, "bench_decoders")
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("BENCH_THREADS", "3")
    monkeypatch.setattr(bench.hf_logging, "set_verbosity_error", lambda: None)
    used = _stop_at_first_call(monkeypatch, bench)
    monkeypatch.setattr(sys, "argv", ["bench_decoders.py"])  # as the Makefile runs it (pytest's arguments are not its)
    with pytest.raises(_Started):
        bench.main()
    assert used == [3]
    assert not (tmp_path / "out").exists(), "nothing was written"


@pytest.mark.parametrize(("name", "settings", "variable"), [("bench_recipes", "Settings", "BENCH_OUT"),
                                                            ("bench_faithfulness", "Config", "BENCH_OUT"),
                                                            ("bench_decoders", "Settings", "BENCH_OUT"),
                                                            ("bench_vision", "Config", "BENCH_VISION_OUT")])
def test_an_empty_output_folder_stops_the_benchmark_before_any_work(no_bench_variables, monkeypatch, name,
                                                                      settings, variable):
    """Before, BENCH_OUT= (empty) was Path(""), the current folder: the results landed wherever the run started."""
    bench = _benchmark(monkeypatch, name)
    monkeypatch.setenv(variable, "")
    with pytest.raises(SystemExit, match=f"^{variable}='': empty, which would be the current folder. Set {variable} "
                                         "to a folder"):
        getattr(bench, settings).from_env()


def test_bench_train_0_is_the_whole_split_in_bench_faithfulness_only_and_each_script_says_so(no_bench_variables,
                                                                                            monkeypatch):
    """BENCH_TRAIN's minimum differs on purpose: 0 trains bench_faithfulness on the whole split (its paper scale);
    bench_recipes and bench_frontier count rows from 1 and refuse 0. Each script's docstring says which."""
    monkeypatch.setenv("BENCH_TRAIN", "0")
    faithfulness = _benchmark(monkeypatch, "bench_faithfulness")
    assert faithfulness.Config.from_env().n_train == 0
    assert faithfulness.PAPER_SCALE["BENCH_TRAIN"] == "0"
    assert "BENCH_TRAIN=1200 SST-2 training rows (0: the whole split)" in faithfulness.__doc__
    for name, settings in (("bench_recipes", "Settings"), ("bench_frontier", "Config")):
        bench = _benchmark(monkeypatch, name)
        with pytest.raises(SystemExit, match=r"^BENCH_TRAIN='0': out of range \(must be >= 1\)"):
            getattr(bench, settings).from_env()
    assert "BENCH_TRAIN=0 is not the whole split" in _benchmark(monkeypatch, "bench_recipes").__doc__
