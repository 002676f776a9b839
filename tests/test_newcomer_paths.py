"""What a newcomer meets on a clean clone (issue 29): install commands that work, a short README, a docs site that
works opened from disk, and a build without pages of setuptools warnings."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# a pip requirement naming this package (with extras or a version), as opposed to a path ('.', a wheel file)
PACKAGE_REQUIREMENT = re.compile(r"^bcos[-_]plugins(\[[^\]]*\])?([<>=!~].*)?$", re.IGNORECASE)
# the package's name with extras anywhere in a line (a hint split over lines: "(or bcos-plugins[captum])")
NAME_WITH_EXTRAS = re.compile(r"(?<![\w/.-])bcos[-_]plugins\[", re.IGNORECASE)


def _pip_install_requirements(line: str) -> list[str]:
    """The arguments of the ``pip install`` in ``line`` that are not options, quotes and backticks removed."""
    command = line.split("pip install", 1)[1].split("#", 1)[0]
    arguments = [a.strip("\"'`").rstrip(",;:)") for a in command.split()]
    return [a for a in arguments if a and not a.startswith("-")]


def _asks_pypi_for_the_package(line: str) -> bool:
    if NAME_WITH_EXTRAS.search(line):
        return True
    return "pip install" in line and any(PACKAGE_REQUIREMENT.match(a) for a in _pip_install_requirements(line))


def _code_lines(markdown: str) -> list[str]:
    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line)
    return lines


def _install_commands() -> list[tuple[str, str]]:
    """(where, line) for every ``pip install`` a user is told to run, and every mention of the package with extras:
    code blocks of the README and the docs, and the package's messages and docstrings."""
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for line in _code_lines(page.read_text(encoding="utf-8")):
            if "pip install" in line:
                found.append((str(page.relative_to(ROOT)), line))
    for folder in ("bcos_plugins", "adapters"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            for line in source.read_text(encoding="utf-8").splitlines():
                if "pip install" in line or NAME_WITH_EXTRAS.search(line):
                    found.append((str(source.relative_to(ROOT)), line))
    return found


def test_no_install_command_asks_pypi_for_bcos_plugins_before_a_release_is_there():
    """``pip install "bcos-plugins[captum]"`` fails: there is no such distribution on PyPI (README, Install). Install
    from a clone (``pip install ".[captum]"``) or a built wheel; drop this test once a release is on PyPI."""
    commands = _install_commands()
    assert len(commands) > 10  # the walk sees the README's, the docs' and the messages' commands
    from_pypi = [f"{where}: {line.strip()}" for where, line in commands if _asks_pypi_for_the_package(line)]
    assert not from_pypi, "\n".join(from_pypi)
    assert _asks_pypi_for_the_package('pip install "bcos-plugins[lens]"   # comment')
    assert _asks_pypi_for_the_package("pip install bcos_plugins==0.2.0")
    assert _asks_pypi_for_the_package('"(or bcos-plugins[captum])") from None')
    assert not _asks_pypi_for_the_package('pip install ".[captum]"    # from the clone')
    assert not _asks_pypi_for_the_package('pip install "dist/bcos_plugins-0.2.0-py3-none-any.whl[captum]"')


def test_the_readme_is_short_and_its_quickstart_is_ten_lines():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) < 12 * 1024, "the README stays under 12 KB: results go to docs/benchmarks.md"
    quickstart = readme.split("## Quickstart", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = [line for line in quickstart.strip().splitlines() if not line.lstrip().startswith("#")]
    assert len(code) <= 10, "the README's quickstart is 10 lines: what does not fit goes to Getting started"


def test_the_docs_site_works_opened_from_disk():
    """``make docs``, then build/site/index.html opened from disk: directory URLs showed a folder listing for every
    link, and MathJax from a CDN left the maths as raw TeX offline."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config.get("use_directory_urls") is False
    scripts = config.get("extra_javascript", []) + config.get("extra_css", [])
    assert any("mathjax" in s for s in scripts)
    for script in scripts:
        assert "://" not in script and not script.startswith("//"), f"{script} is fetched when a page is viewed"
        assert (DOCS / script).is_file(), f"mkdocs.yml names {script}, which docs/ does not hold"


def test_building_the_wheel_prints_no_ignored_package_warnings(tmp_path):
    """setuptools' default include-package-data printed about 360 lines of 'Package would be ignored' (one
    warning per shipped data folder) on every build, `make demo`'s first one included."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("bcos_plugins", "adapters"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert list((tmp_path / "dist").glob("bcos_plugins-*.whl"))
    output = build.stdout + build.stderr
    assert "would be ignored" not in output, output[output.find("would be ignored") - 2000:][:3000]
