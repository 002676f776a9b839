"""The example scripts (``python examples/<name>.py`` from the repository root, or their `make` targets).

A package so that tests import a script's functions by name; not part of the installed distribution. What the
examples share with the benchmarks lives in ``benchmarks.common``.
"""
