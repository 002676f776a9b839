"""The benchmark scripts (``python benchmarks/bench_<name>.py`` from the repository root, or their `make`
targets) and, in ``benchmarks.common``, the code they share with the example scripts.

A package so that tests and the examples import the scripts' parts by name instead of loading files by path.
Not part of the installed distribution: pyproject.toml lists the shipped packages, all under ``bcos_plugins``.
"""
