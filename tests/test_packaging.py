"""The installed package layout: adapters/ installs as bcos_plugins.adapters, every package is listed,
and importing the core pulls in no host library."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _packages_on_disk() -> set[str]:
    found = set()
    for init in (ROOT / "bcos_plugins").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "adapters").rglob("__init__.py"):
        found.add(".".join(("bcos_plugins", *init.parent.relative_to(ROOT).parts)))
    return found


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == _packages_on_disk()


def test_adapters_import_as_subpackage_and_no_top_level_adapters_module():
    import bcos_plugins.adapters

    assert Path(bcos_plugins.adapters.__file__).parent == ROOT / "adapters"
    assert not (ROOT / "bcos.py").exists() and not (ROOT / "bcos").exists()


def test_importing_the_core_imports_no_host_library():
    code = ("import sys, bcos_plugins, bcos_plugins.explain, bcos_plugins.train; "
            "print(sorted(m for m in ('inseq', 'captum', 'transformer_lens', 'sae_lens') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_version_has_one_source_and_a_dated_changelog_section():
    import re

    import bcos_plugins
    from bcos_plugins import _version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert bcos_plugins.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", bcos_plugins.__version__)
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), flags=re.M)
    assert headings[0] == "Unreleased", "CHANGELOG.md opens with '## Unreleased' (this round's lines go there)"
    released = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", h) for h in headings[1:]]
    assert all(released), f"released sections are '## [X.Y.Z] - YYYY-MM-DD', got {headings[1:]}"
    versions = [tuple(map(int, m.group(1).split("."))) for m in released]
    dates = [m.group(2) for m in released]
    assert versions == sorted(versions, reverse=True) and dates == sorted(dates, reverse=True)
    assert bcos_plugins.__version__ in {m.group(1) for m in released}, (
        f"version {bcos_plugins.__version__} has no dated CHANGELOG section: rename '## Unreleased' when releasing")


def test_package_data_ships_every_data_file_and_every_dataset_has_its_source():
    from fnmatch import fnmatch

    from bcos_plugins.data import SHIPPED_DATA

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "bcos_plugins.data"]
    package = ROOT / "bcos_plugins" / "data"
    files = [p for p in SHIPPED_DATA.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert files and SHIPPED_DATA.parent == package

    def globbed(relative: Path, pattern: str) -> bool:  # setuptools' glob: '*' never crosses a '/'
        parts = pattern.split("/")
        return len(parts) == len(relative.parts) and all(map(fnmatch, relative.parts, parts))

    unshipped = [str(p.relative_to(package)) for p in files
                 if not any(globbed(p.relative_to(package), pattern) for pattern in patterns)]
    assert not unshipped, f"not matched by [tool.setuptools.package-data]: {unshipped}"
    for folder in (p for p in SHIPPED_DATA.iterdir() if p.is_dir()):
        assert (folder / "SOURCE.md").is_file(), f"{folder.name} has no SOURCE.md (origin and licence)"


def test_shipped_data_names_what_is_missing():
    import pytest

    from bcos_plugins.data import shipped_data
    from bcos_plugins.errors import BcosFileError

    assert shipped_data("sst2", "train.tsv").is_file()
    with pytest.raises(BcosFileError, match=r"parts: 'sst3/train.tsv' is not shipped with bcos_plugins .*'sst2'"):
        shipped_data("sst3", "train.tsv")
