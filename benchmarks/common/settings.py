"""Settings read from environment variables by the benchmark and example scripts.

The scripts are configured through ``BENCH_*``-style variables. A value that does not parse, or is out of range,
stops the script before any work with a message naming the variable, the bad value and the fix; a typo such as
``BENCH_RETRAIN=yes`` or ``BENCH_EVAL=1e3`` must never fall back to a default silently (a silently wrong
configuration is a silently wrong number in a results table). An unset variable gives the default; a variable
set to the empty string is an error, like any other value that is not a setting.

Errors are ``SystemExit`` so a command-line user sees the message without a traceback.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["env_choice", "env_choices", "env_flag", "env_float", "env_int", "env_numbers", "env_path",
           "epochs_text", "no_command_line_arguments", "option_float", "option_int"]


def _bad(name: str, raw: str, problem: str, fix: str, default) -> SystemExit:
    shown = "" if default is None else f", or unset it for the default {default}"
    return SystemExit(f"{name}={raw!r}: {problem}. Set {name} to {fix}{shown}.")


def _bounds(minimum, maximum, *, exclusive_minimum: bool = False) -> str:
    low = None if minimum is None else (f"> {minimum}" if exclusive_minimum else f">= {minimum}")
    high = None if maximum is None else f"<= {maximum}"
    return " and ".join(part for part in (low, high) if part)


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``int(os.environ[name])``, ``default`` when unset; a whole number within ``[minimum, maximum]``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    bounds = _bounds(minimum, maximum)
    wanted = f"a whole number{f' {bounds}' if bounds else ''}, e.g. {name}={default}"
    try:
        value = int(raw.strip())
    except ValueError:
        raise _bad(name, raw, "not a whole number", wanted, default) from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _bad(name, raw, f"out of range (must be {bounds})", wanted, default)
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None,
              exclusive_minimum: bool = False) -> float:
    """``float(os.environ[name])``, ``default`` when unset; finite, within the bounds (``exclusive_minimum``:
    strictly above ``minimum``, e.g. a learning rate or a number of epochs)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    bounds = _bounds(minimum, maximum, exclusive_minimum=exclusive_minimum)
    wanted = f"a number{f' {bounds}' if bounds else ''}, e.g. {name}={default:g}"
    try:
        value = float(raw.strip())
    except ValueError:
        raise _bad(name, raw, "not a number", wanted, f"{default:g}") from None
    if not math.isfinite(value):
        raise _bad(name, raw, "not a finite number", wanted, f"{default:g}")
    too_low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    if too_low or (maximum is not None and value > maximum):
        raise _bad(name, raw, f"out of range (must be {bounds})", wanted, f"{default:g}")
    return value


def env_flag(name: str, default: bool) -> bool:
    """``True`` for ``1``, ``False`` for ``0``, ``default`` when unset; anything else (``yes``, ``true``) is an
    error rather than a silent ``False``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip() not in ("0", "1"):
        raise _bad(name, raw, "not a switch", "1 (on) or 0 (off)", int(default))
    return raw.strip() == "1"


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    """One of ``choices`` (exactly as spelled there), ``default`` when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw not in choices:
        listed = " or ".join(repr(c) for c in choices)
        raise _bad(name, raw, f"not one of {listed}", f"one of {listed}", repr(default))
    return raw


def env_path(name: str, default: Path | str) -> Path:
    """``Path(os.environ[name])``, ``Path(default)`` when unset; an empty (or blank) value is an error, not the
    current folder (``Path("")`` is ``.``: a run would write its results wherever it was started)."""
    raw = os.environ.get(name)
    if raw is None:
        return Path(default)
    if not raw.strip():
        raise _bad(name, raw, "empty, which would be the current folder", f"a folder, e.g. {name}={default}",
                   default)
    return Path(raw)


def env_numbers(name: str, default: Sequence[float], *, kind: type = float, minimum: float | None = None) -> tuple:
    """A comma-separated list of numbers (``kind``: ``int`` or ``float``), each finite and ``>= minimum``, no
    repeats, at least one; ``default`` when unset. ``BENCH_FRONTIER_B=1.1,1.5``."""
    raw = os.environ.get(name)
    if raw is None:
        return tuple(default)
    shown = ",".join(f"{v:g}" if kind is float else str(v) for v in default)
    what = "whole numbers" if kind is int else "numbers"
    wanted = f"comma-separated {what}{f' >= {minimum}' if minimum is not None else ''}, e.g. {name}={shown}"
    try:
        values = tuple(kind(part.strip()) for part in raw.split(","))
    except ValueError:
        raise _bad(name, raw, f"not a comma-separated list of {what}", wanted, shown) from None
    if any(not math.isfinite(v) for v in values) or (minimum is not None and any(v < minimum for v in values)):
        raise _bad(name, raw, f"out of range (each must be finite{f' and >= {minimum}' if minimum is not None else ''})",
                   wanted, shown)
    if len(set(values)) != len(values):
        raise _bad(name, raw, "lists a value twice", wanted, shown)
    return values


def env_choices(name: str, default: Sequence[str], choices: Sequence[str]) -> tuple[str, ...]:
    """A comma-separated list of distinct ``choices`` (at least one), ``default`` when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return tuple(default)
    listed = ",".join(choices)
    values = tuple(part.strip() for part in raw.split(","))
    if any(v not in choices for v in values) or len(set(values)) != len(values):
        raise _bad(name, raw, f"not a comma-separated list of distinct values from {listed}",
                   f"some of {listed}, e.g. {name}={listed}", ",".join(default))
    return values


def option_int(minimum: int | None = None, maximum: int | None = None):
    """An argparse ``type=`` for a whole-number option within ``[minimum, maximum]``: argparse stops the script before
    any work with "argument --epochs: must be >= 1, got 0" (exit status 2). The example scripts took any int:
    ``--epochs 0`` reported an untrained model's numbers, ``--k 0`` failed after minutes of training."""
    import argparse

    def read(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {raw!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {_bounds(minimum, maximum)}, got {value}")
        return value

    read.__name__ = "whole number"  # argparse names the type in its own messages
    return read


def option_float(minimum: float | None = None, maximum: float | None = None, *, exclusive_minimum: bool = False):
    """An argparse ``type=`` for a finite number within the bounds, as :func:`option_int` (``--noise -1`` ran with
    noise of std 1, ``--mask-strength nan`` drew NaN masks, silently)."""
    import argparse

    def read(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {raw!r}") from None
        too_low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
        if not math.isfinite(value) or too_low or (maximum is not None and value > maximum):
            bounds = _bounds(minimum, maximum, exclusive_minimum=exclusive_minimum)
            raise argparse.ArgumentTypeError(f"must be a finite number{f' {bounds}' if bounds else ''}, got {raw}")
        return value

    read.__name__ = "number"
    return read


def settings_from_argv(argv: Sequence[str], script: str, flag: str, env_name: str, preset: dict[str, str], read):
    """``read()`` (a ``Config.from_env``) over ``preset`` when ``argv`` holds ``flag`` or ``env_name`` is set; a
    variable the user set wins over the preset. Any other argument stops the run with the usage line."""
    from unittest import mock

    unknown = [a for a in argv if a != flag]
    if unknown:
        raise SystemExit(f"unknown arguments {unknown}; usage: {script} [{flag}]")
    chosen = flag in argv or env_flag(env_name, False)
    applied = {k: v for k, v in preset.items() if k not in os.environ} if chosen else {}
    with mock.patch.dict(os.environ, applied):
        return read()


def no_command_line_arguments(doc: str, argv: Sequence[str] | None = None) -> None:
    """For a script configured by environment variables alone: ``-h`` / ``--help`` prints ``doc`` (the script's
    docstring, which lists its variables) and exits with status 0; any other argument stops the script before any
    work, naming the variables. Both were ignored: ``python examples/demo_sst2.py --help`` started the whole
    minutes-long run and overwrote its outputs, and ``--epochs 1`` ran with the defaults, silently."""
    import sys

    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments:
        return
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "the script"
    if "-h" in arguments or "--help" in arguments:
        print(doc.strip())
        raise SystemExit(0)
    raise SystemExit(f"{script}: unknown arguments {arguments}: it takes its settings from environment variables "
                     f"only. Set them before the command (NAME=value python {script}); {script} --help lists them.")


def epochs_text(epochs: float) -> str:
    """``"1 epoch"``, ``"2 epochs"``, ``"0.5 epochs"``: a run's epochs (a float setting) as the scripts print them
    (``make demo`` printed "1 epochs" with ``DEMO_EPOCHS=1``)."""
    return f"{epochs:g} epoch" + ("" if epochs == 1 else "s")
