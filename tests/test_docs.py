"""The documentation site: every document a docstring cites exists (down to the section), every page is in
the navigation, and the API reference covers every module. `make docs` builds the site strictly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify
from snippet_setups import SETUPS

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


# A Python block of the README or the docs runs as written. The blocks of a page run in order in one namespace,
# so a block may use what an earlier block of its page defined. The line right before a block's fence may hold
# one marker, so that what the test adds is a visible decision in the page, not silence here:
#   <!-- snippet: uses NAME, NAME -->   the named setups (tests/snippet_setups.py) run first: they define the
#                                       tiny models and inputs the block takes as given; the shown code itself
#                                       runs unchanged
#   <!-- snippet: not run: REASON -->   the block is not run; REASON names what it needs (a GPU, ...)
# and the lines right after its closing fence may hold checks of what the block's comments claim:
#   <!-- snippet: check: EXPRESSION -->   evaluated in the page's namespace after the block; must be true
MARKER = re.compile(r"<!-- snippet: (?:not run: (?P<reason>.+?)|uses (?P<setups>[\w, ]+?)) -->\s*$")
CHECK = re.compile(r"^<!-- snippet: check: (.+) -->\s*$")
# reasons too vague to keep a block out of the test: say what the block needs instead
VAGUE_REASONS = ("fragment", "sets up in its text")
MIN_RUN = 34  # every block runs; lower it only with a not-run reason the collector accepts


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason it is not run, or None
    setups: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()


def _snippets_of(page: Path) -> list[Snippet]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(i for i in range(number + 1, len(lines)) if lines[i].strip().startswith("```"))
        marker = MARKER.search(lines[number - 1]) if number else None
        reason = marker.group("reason") if marker else None
        setups = tuple(s.strip() for s in marker.group("setups").split(",")) if marker and marker.group("setups") else ()
        where = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
        checks = []
        for after in lines[end + 1:]:
            if not CHECK.match(after):
                break
            checks.append(CHECK.match(after).group(1))
        found.append(Snippet(where, number + 1, "\n".join(lines[number + 1:end]), reason, setups, tuple(checks)))
    return found


def _snippets() -> list[Snippet]:
    """Every ```python block of README.md and docs/, in page order."""
    return [s for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))] for s in _snippets_of(page)]


def run_page(snippets: list[Snippet]) -> int:
    """Run a page's blocks in order in one namespace (setups first); returns how many ran.

    A block that raises fails with its page and line; the traceback points at the line in the page.
    """
    import torch

    torch.manual_seed(0)
    namespace = {"__name__": "__snippet__"}
    ran = 0
    for snippet in snippets:
        if snippet.not_run is not None:
            continue
        for name in snippet.setups:
            SETUPS[name](namespace)
        # padded with the lines above it, so that tracebacks give the block's line numbers in the page
        code = compile("\n" * snippet.line + snippet.code, str(ROOT / snippet.page), "exec")
        try:
            exec(code, namespace)
        except Exception as error:
            raise AssertionError(f"{snippet.page}:{snippet.line}: the snippet raised "
                                 f"{type(error).__name__}: {error}") from error
        for check in snippet.checks:
            assert eval(check, namespace), f"{snippet.page}:{snippet.line}: the block's claim `{check}` is false"
        ran += 1
    return ran


# The named setups (tiny random models from configs, the shipped data and tokenizers) are shared with the
# docstring examples' test: tests/snippet_setups.py.


def test_the_snippet_collector_sees_markers_and_blocks():
    snippets = _snippets()
    assert len(snippets) >= 30
    not_run = [s for s in snippets if s.not_run is not None]
    assert all(s.not_run.strip() for s in not_run)
    vague = [f"{s.page}:{s.line}: {s.not_run}" for s in not_run if any(v in s.not_run for v in VAGUE_REASONS)]
    assert not vague, "say what the block needs to run, or give it setups (`uses ...`):\n" + "\n".join(vague)
    unknown = [f"{s.page}:{s.line}: {name}" for s in snippets for name in s.setups if name not in SETUPS]
    assert not unknown, f"no such setup (known: {sorted(SETUPS)}):\n" + "\n".join(unknown)
    assert len(snippets) - len(not_run) >= MIN_RUN, "blocks that run may only become more"
    # a misspelt or misplaced marker would be ignored silently: every one must belong to a block
    written = sum(line.lstrip().startswith("<!-- snippet:") for page in [ROOT / "README.md", *DOCS.rglob("*.md")]
                  for line in page.read_text(encoding="utf-8").splitlines())
    understood = sum(bool(s.not_run is not None or s.setups) + len(s.checks) for s in snippets)
    assert written == understood, (f"{written - understood} `<!-- snippet: ... -->` line(s) are not understood: "
                                   "`uses`/`not run` go right before a ```python fence, `check` right after its end")
    assert "README.md" in {s.page for s in snippets if s.not_run is None}, "the quickstart runs"


def test_a_broken_snippet_fails_with_its_page_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\n<!-- snippet: not run: needs a GPU -->\n```python\n"
                    "import no_such_module\n```\n\nText.\n\n```python\ny = x + 1\nassert y == 3, 'wrong sum'\n```\n",
                    encoding="utf-8")
    snippets = _snippets_of(page)
    assert [(s.line, s.not_run) for s in snippets] == [(3, None), (8, "needs a GPU"), (14, None)]
    with pytest.raises(AssertionError, match="page.md:14: the snippet raised AssertionError: wrong sum") as caught:
        run_page(snippets)
    # the traceback points at the failing line of the page (line 16), and the second block saw the first's x
    assert caught.value.__cause__.__traceback__.tb_next.tb_lineno == 16


def test_a_false_claim_of_a_snippet_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\ntotal = 0.1 + 0.2   # == 0.3\n```\n<!-- snippet: check: abs(total - 0.3) < 1e-12 -->\n"
                    "<!-- snippet: check: total == 0.3 -->\n", encoding="utf-8")
    (snippet,) = _snippets_of(page)
    assert snippet.checks == ("abs(total - 0.3) < 1e-12", "total == 0.3")
    with pytest.raises(AssertionError, match=r"page.md:1: the block's claim `total == 0.3` is false"):
        run_page([snippet])


PAGES = sorted({s.page for s in _snippets() if s.not_run is None})


@pytest.mark.parametrize("page", PAGES)
def test_readme_and_docs_snippets_run_as_written(page, tmp_path, monkeypatch):
    """Offline (HF_HUB_OFFLINE): a snippet that reaches for the hub fails here instead of on a user's machine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # snippets and setups save models into the current folder
    snippets = [s for s in _snippets() if s.page == page]
    assert run_page(snippets) == sum(s.not_run is None for s in snippets)
