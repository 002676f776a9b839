"""The support matrix is tested, not asserted: every lower bound pyproject.toml declares for torch and the host
libraries is pinned in .ci/min-versions.txt (the environment `make test` builds as .venv-min), and the README's
matrix names exactly the versions the Makefile installs."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("torch", "transformers", "captum", "transformer-lens", "sae-lens", "datasets")


# .ci/check_pins.py is a script the Makefile runs in each environment it builds, not a package module: its folder
# goes on the import path so that its parser reads the pins here too (imported, not loaded by its file path)
sys.path.insert(0, str(ROOT / ".ci"))
from check_pins import read_pins as _pins  # noqa: E402


def _declared_lower_bounds() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    bounds: dict[str, set[str]] = {}
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)", requirement)
        name, spec = match.group(1).lower(), match.group(2)
        lower = re.search(r">=\s*([\w.]+)", spec) or re.search(r"==\s*([\w.]+)", spec)
        if lower:
            bounds.setdefault(name, set()).add(lower.group(1))
    return bounds


def _same_version(a: str, b: str) -> bool:
    def parts(v):
        return [int(p) for p in v.split(".")] + [0] * (3 - len(v.split(".")))
    return parts(a) == parts(b)


def test_every_declared_lower_bound_is_the_pinned_minimum():
    minimum = _pins(ROOT / ".ci" / "min-versions.txt")
    bounds = _declared_lower_bounds()
    assert sorted(minimum) == sorted(HOSTS)
    for name in HOSTS:
        assert bounds.get(name), f"pyproject.toml declares no lower bound for {name}"
        # the lowest bound over the core and the extras (lens4's transformer-lens>=4.3 is .venv-tl4's version)
        bound = min(bounds[name], key=lambda v: [int(p) for p in v.split(".")])
        assert _same_version(bound, minimum[name]), (
            f"pyproject.toml declares {name}>={bound} but .venv-min tests {name}=={minimum[name]}: "
            f"change .ci/min-versions.txt and pyproject.toml together")


def test_the_readme_matrix_names_the_tested_and_the_lowest_versions():
    tested = _pins(ROOT / ".ci" / "tested-versions.txt")
    minimum = _pins(ROOT / ".ci" / "min-versions.txt")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Support matrix", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in (line for line in section.splitlines() if line.startswith("|")):
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = re.search(r"`([\w-]+)`", cells[0])
        if key:
            rows[key.group(1)] = cells
    for name, version in tested.items():
        assert name in rows, f"README support matrix has no row for `{name}`"
        assert version in rows[name][1], f"README: tested {name} is {version} (.ci/tested-versions.txt)"
    for name, version in minimum.items():
        assert version in rows[name][2], f"README: lowest tested {name} is {version} (.ci/min-versions.txt)"


def test_the_newest_torch_is_installed_in_the_tl4_environment_and_named_in_the_readme():
    newest = _pins(ROOT / ".ci" / "newest-versions.txt")
    assert newest.get("torch"), ".ci/newest-versions.txt pins no torch"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    tl4_recipe = makefile.split("$(TL4)/.installed:", 1)[1].split("\n\n", 1)[0]
    # the pins file must reach pip (it replaces a machine-wide constraint file) and be checked after the install
    assert tl4_recipe.count("PIP_CONSTRAINT=$(NEWEST)") == 2, tl4_recipe
    assert ".ci/check_pins.py $(NEWEST)" in tl4_recipe, tl4_recipe
    assert "NEWEST := .ci/newest-versions.txt" in makefile
    torch_row = next(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                     if line.startswith("| `torch`"))
    assert f"{newest['torch']}" in torch_row and ".venv-tl4" in torch_row, (
        f"README: the torch row must name the newest torch {newest['torch']} and .venv-tl4: {torch_row}")


def test_the_pins_parser_refuses_a_line_that_is_no_exact_pin(tmp_path):
    # the CI script skipped such a line before (a pin written torch>=2.15 was then never checked)
    pins = tmp_path / "pins.txt"
    pins.write_text("# comment\ntorch==2.15.0  # newest\n\ntransformers>=5.9\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pins\.txt, line 4: 'transformers>=5\.9' is not a name==version pin"):
        _pins(pins)
    pins.write_text("# comment\ntorch==2.15.0  # newest\n", encoding="utf-8")
    assert _pins(pins) == {"torch": "2.15.0"}
