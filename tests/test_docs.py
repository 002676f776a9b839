"""The documentation site: every document a docstring cites exists (down to the section), every page is in
the navigation, and the API reference covers every module. `make docs` builds the site strictly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SOURCES = ("bcos_plugins", "adapters", "examples", "benchmarks", ".ci")
# A cited document: a page of the site (docs/design.md#metrics, with an optional section) or a project document
# named in capitals (README.md, CHANGELOG.md, SOURCE.md). Lower-case bare names (results.md) are files a
# script writes, not citations.
CITATION = re.compile(r"(?<![\w/.-])(docs/(?:[\w.-]+/)*[\w.-]+\.md|[A-Z][A-Z_]*\.md)(#[\w-]+)?")
EXPLICIT_ID = re.compile(r"\{#([\w-]+)\}\s*$")


def _anchors(page: Path) -> set[str]:
    """Section ids of a Markdown page as MkDocs makes them: an explicit {#id} or the slug of the heading."""
    anchors = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not re.match(r"#{1,6} ", line):
            continue
        heading = line.lstrip("#").strip()
        explicit = EXPLICIT_ID.search(heading)
        anchors.add(explicit.group(1) if explicit else slugify(heading, "-"))
    return anchors


def broken_citations(text: str, where: str) -> list[str]:
    """Citations in ``text`` of documents (or sections) that do not exist in the repository."""
    problems = []
    for match in CITATION.finditer(text):
        name, section = match.group(1), match.group(2)
        target = ROOT / name
        if "/" not in name and not target.exists():
            # a bare file name (SOURCE.md sits in every shipped data folder): it must exist somewhere
            found = [p for p in ROOT.rglob(name) if not {".venv", "build", ".git"} & set(p.parts)]
            target = found[0] if found else target
        if not target.exists():
            problems.append(f"{where}: cites {name}, which does not exist")
        elif section and target.suffix == ".md" and section[1:] not in _anchors(target):
            problems.append(f"{where}: cites {name}{section}; {name} has no such section "
                            f"(sections: {sorted(_anchors(target))})")
    return problems


def test_citation_check_catches_a_missing_document_and_a_missing_section():
    assert broken_citations("maths in DESIGN.md §3", "x") == ["x: cites DESIGN.md, which does not exist"]
    assert broken_citations("see docs/design.md#no-such-section", "x")[0].startswith(
        "x: cites docs/design.md#no-such-section; docs/design.md has no such section")
    assert broken_citations("see docs/design.md#metrics, README.md and SOURCE.md; writes results.md", "x") == []
    assert broken_citations("docs/no-such-page.md", "x") == ["x: cites docs/no-such-page.md, which does not exist"]


def test_every_document_a_docstring_or_comment_cites_exists():
    problems = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            problems += broken_citations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


def test_links_between_docs_pages_point_to_existing_sections():
    problems = []
    for page in sorted(DOCS.rglob("*.md")):
        for target, section in re.findall(r"\]\(([\w./-]*\.md)(#[\w-]+)?\)", page.read_text(encoding="utf-8")):
            linked = (page.parent / target).resolve()
            if not linked.exists():
                problems.append(f"{page.relative_to(ROOT)}: links to missing {target}")
            elif section and section[1:] not in _anchors(linked):
                problems.append(f"{page.relative_to(ROOT)}: links to {target}{section}, no such section")
    assert not problems, "\n".join(problems)


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.fixture(scope="module")
def mkdocs_config() -> dict:
    # mkdocs.yml has no Python-specific tags, so a plain YAML load reads it
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def test_every_page_is_in_the_navigation_and_every_entry_exists(mkdocs_config):
    assert mkdocs_config["strict"] is True
    in_nav = _nav_pages(mkdocs_config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(in_nav) == on_disk


def test_every_host_library_and_method_has_its_page(mkdocs_config):
    pages = set(_nav_pages(mkdocs_config["nav"]))
    for host in ("inseq", "captum", "transformer-lens", "sae-lens"):
        assert f"hosts/{host}.md" in pages
    for method in ("bcos-lms", "bcos-vits", "bilinear", "space-model", "self-guided-attention"):
        page = DOCS / "methods" / f"{method}.md"
        assert f"methods/{method}.md" in pages
        text = page.read_text(encoding="utf-8")
        assert "**Paper**" in text and "## The maths" in text, f"{page.name}: states its paper and its maths"


def test_the_api_reference_covers_every_module():
    documented = set()
    for page in (DOCS / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)", page.read_text(encoding="utf-8"), flags=re.M))
    expected = {"adapters." + p.stem for p in (ROOT / "adapters").glob("*.py") if not p.stem.startswith("_")}
    for path in (ROOT / "bcos_plugins").iterdir():
        if path.name.startswith("_"):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            expected.add(f"bcos_plugins.{path.name}")
        elif path.suffix == ".py":
            expected.add(f"bcos_plugins.{path.stem}")
    missing = sorted(m for m in expected if m not in documented)
    assert not missing, f"add these to a page under docs/api/: {missing}"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_bcos_plugins_import_in_the_docs_and_readme_works():
    """The hand-written pages' imports name things that exist (a renamed function fails here, not for users)."""
    statements = set()
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in _python_blocks(page.read_text(encoding="utf-8")):
            # join parenthesised multi-line imports, then keep the package's own import statements
            block = re.sub(r"\(\s*([^)]*?)\s*\)", lambda m: " ".join(m.group(1).split()), block)
            for line in block.splitlines():
                line = line.split("#")[0].strip()
                if re.match(r"(from bcos_plugins[\w.]* import |import bcos_plugins)", line):
                    statements.add(line.rstrip(","))
    assert len(statements) >= 10
    failures = []
    for statement in sorted(statements):
        try:
            exec(statement, {})
        except Exception as error:  # every broken import reported at once
            failures.append(f"{statement}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


# A Python block of the README or the docs runs as written (tests below), unless the line right before its
# fence is this marker with a reason: then skipping it is a visible decision in the page, not silence here.
NOT_RUN = re.compile(r"<!-- snippet: not run: (.+?) -->\s*$")


def _snippets() -> list[tuple[str, int, str, str | None]]:
    """(page, line, code, reason it is not run or None) for every ```python block of README.md and docs/."""
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            end = next(i for i in range(number + 1, len(lines)) if lines[i].strip().startswith("```"))
            before = lines[number - 1] if number else ""
            marker = NOT_RUN.search(before)
            found.append((str(page.relative_to(ROOT)), number + 1, "\n".join(lines[number + 1:end]),
                          marker.group(1) if marker else None))
    return found


def test_the_snippet_collector_sees_markers_and_blocks():
    snippets = _snippets()
    assert len(snippets) >= 30
    assert all(reason.strip() for *_, reason in snippets if reason is not None)
    assert ("README.md" in {page for page, _, _, reason in snippets if reason is None}), "the quickstart runs"


RUNNABLE = [pytest.param(code, id=f"{page}:{line}") for page, line, code, reason in _snippets() if reason is None]


@pytest.mark.parametrize("code", RUNNABLE)
def test_readme_and_docs_snippets_run_as_written(code, tmp_path, monkeypatch):
    """Offline (HF_HUB_OFFLINE): a snippet that reaches for the hub fails here instead of on a user's machine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # snippets may save models into the current folder
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})
