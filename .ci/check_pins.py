"""Fail unless this environment has the versions a pins file (``name==version`` lines) names.

``read_pins`` is also the parser of tests/test_support_matrix.py, which imports this file (its folder on the
import path).
"""

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def read_pins(path) -> dict[str, str]:
    """``{name: version}`` of a pins file: one ``name==version`` per line, ``#`` comments and blank lines aside; any
    other line is refused, naming the file and the line."""
    pins = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        if line.count("==") != 1:
            raise ValueError(f"{path}, line {number}: {line!r} is not a name==version pin")
        name, pinned = (part.strip() for part in line.split("=="))
        pins[name] = pinned
    return pins


def main(path: str) -> None:
    pins = read_pins(path)
    wrong = {}
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "not installed"
        if installed.split("+")[0] != pinned:
            wrong[name] = f"pinned {pinned}, installed {installed}"
    if wrong:
        sys.exit(f"{sys.prefix} does not have the versions of {path}: {wrong}. Rebuild it (rm -r {sys.prefix}).")
    print(f"{sys.prefix}: {', '.join(f'{k} {v}' for k, v in pins.items())}")


if __name__ == "__main__":
    main(sys.argv[1])
