"""Every ``>>>`` example in a docstring of the package (bcos_plugins and its adapters) runs as written.

The API pages render these docstrings (mkdocstrings), so an example that fails here is a broken example on the
site. The standard library's doctest runs them: an example that raises fails, and an example that shows output
must show that output (ELLIPSIS and NORMALIZE_WHITESPACE only: a long table may be cut with ``...``).
An example starts from an empty namespace, as a reader does: it imports what it uses. What it takes as given (a
tiny model, a tokenised batch) comes from the named setups the README's and docs' blocks use
(tests/snippet_setups.py), declared per docstring in ``GIVEN`` below with the reason.
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest
from snippet_setups import SETUPS

ROOT = Path(__file__).resolve().parents[1]
# the import name of each source folder: adapters/ installs as bcos_plugins.adapters (pyproject.toml)
PACKAGES = {"bcos_plugins": ROOT / "bcos_plugins", "bcos_plugins.adapters": ROOT / "adapters"}
PROMPT = re.compile(r"^\s*>>>", flags=re.M)
# a docstring stops at its first failure (the later examples would fail on names it did not define)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.FAIL_FAST
MIN_EXAMPLES = 61  # every example runs; lower it only when an example is removed on purpose

# docstring (doctest's name for it) -> (setups run before its first example, why its own lines do not build them).
# Building a B-cos model is bcosify's and the quickstart's example; repeating it in every docstring would bury
# what the docstring shows.
GIVEN: dict[str, tuple[tuple[str, ...], str]] = {
    "bcos_plugins.attribution.targets.Direction": (
        ("bcos_gpt2",), "a B-cos LM (GPT-2) and its tokenizer"),
    "bcos_plugins.explain.explain": (
        ("bcos_bert",), "a B-cos classifier (BERT), its tokenizer and a tokenised batch, as in the README"),
    "bcos_plugins.adapters.inseq": (
        ("bcos_gpt2",), "a B-cos LM (GPT-2) and its tokenizer"),
    "bcos_plugins.adapters.inseq.load_classifier": (
        ("bcos_bert",), "a B-cos classifier (BERT) and its tokenizer"),
    "bcos_plugins.adapters.captum": (
        ("bcos_bert",), "a B-cos classifier (BERT) and a tokenised batch, as on the Captum page"),
    "bcos_plugins.space.modeling.SpaceModelForSequenceClassification": (
        ("space_inputs",), "a saved encoder folder (`path`) and four labelled sentences, as on the Space Model page"),
}


def modules_with_examples() -> list[str]:
    """The import names of the package's modules whose source holds a ``>>>`` line."""
    names = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            if PROMPT.search(path.read_text(encoding="utf-8")):
                parts = path.relative_to(folder).with_suffix("").parts
                names.append(".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


def docstring_examples(module_name: str) -> list[doctest.DocTest]:
    """The docstrings of ``module_name`` (the module's, its classes', functions' and methods') that hold examples."""
    module = importlib.import_module(module_name)
    tests = [test for test in doctest.DocTestFinder().find(module, globs={}) if test.examples]
    for test in tests:
        if test.lineno is None:  # a decorated function (@contextmanager) hides its line: find the first example
            first = ">>> " + test.examples[0].source.splitlines()[0]
            text = Path(test.filename).read_text(encoding="utf-8")
            test.lineno = text[:text.index(first)].count("\n") - test.examples[0].lineno
    return tests


def run_examples(test: doctest.DocTest, setups: tuple[str, ...] = ()) -> int:
    """Run one docstring's examples in a fresh namespace (after ``setups``); returns how many ran.

    Fails with doctest's report: the file and line of the example, what it showed and what it should show.
    """
    import torch

    torch.manual_seed(0)
    test.globs = {"__name__": "__docstring_example__"}
    for name in setups:
        SETUPS[name](test.globs)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    results = runner.run(test, out=report.append, clear_globs=True)
    if results.failed:
        raise AssertionError(f"{results.failed} of {results.attempted} examples of {test.name} failed:\n"
                             + "".join(report))
    return results.attempted


MODULES = modules_with_examples()


def test_every_example_line_belongs_to_a_docstring_that_runs():
    """A ``>>>`` line doctest does not find (a comment, a nested function's docstring) would silently not run."""
    found, written = 0, 0
    for name in MODULES:
        tests = docstring_examples(name)
        found += sum(len(test.examples) for test in tests)
        written += len(PROMPT.findall(Path(importlib.import_module(name).__file__).read_text(encoding="utf-8")))
    assert found == written, f"{written - found} `>>>` line(s) are outside the docstrings doctest finds"
    assert found >= MIN_EXAMPLES, "examples that run may only become more"
    named = {test.name for name in MODULES for test in docstring_examples(name)}
    assert not set(GIVEN) - named, f"GIVEN names docstrings without examples: {sorted(set(GIVEN) - named)}"
    unknown = [setup for setups, _ in GIVEN.values() for setup in setups if setup not in SETUPS]
    assert not unknown, f"no such setup (known: {sorted(SETUPS)}): {unknown}"
    assert all(reason.strip() for _, reason in GIVEN.values()), "say why an example takes a setup as given"


def _docstring(text: str, name: str = "example.add") -> doctest.DocTest:
    return doctest.DocTestParser().get_doctest(text, {}, name, "example.py", 10)


def test_a_wrong_example_fails_with_its_line():
    wrong = _docstring("Add.\n\n>>> 1 + 2\n3\n>>> 0.1 + 0.2\n0.3\n")
    with pytest.raises(AssertionError, match=r"(?s)1 of 2 examples of example.add failed:.*line 15.*"
                                             r"Expected:\s+0.3\s+Got:\s+0.30000000000000004"):
        run_examples(wrong)
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        run_examples(_docstring(">>> x = 1 / 0\n"))
    # a long output may be cut with `...`, and the line breaks of a table are not compared
    assert run_examples(_docstring(">>> print('Heatmap\\n' + 'a b\\n' * 3)\nHeatmap\n...\n")) == 1


def test_an_example_starts_from_an_empty_namespace_plus_its_setups():
    with pytest.raises(AssertionError, match="NameError: name 'images' is not defined"):
        run_examples(_docstring(">>> images.shape\n"))
    assert run_examples(_docstring(">>> images.shape\ntorch.Size([4, 1, 16, 16])\n"), ("images",)) == 1


def under_examples_heading(test: doctest.DocTest) -> bool:
    """Whether the docstring's examples sit under an ``Examples:`` line, indented below it."""
    first = test.examples[0]
    heading = test.docstring.splitlines()[first.lineno - 1] if first.lineno else ""
    indent = len(heading) - len(heading.lstrip())
    return heading.strip() == "Examples:" and all(example.indent > indent for example in test.examples)


def test_examples_sit_under_an_examples_heading():
    """The API pages parse docstrings in Google style: examples under ``Examples:`` render as Python sessions, while
    a ``>>>`` line in running text renders as a three-level Markdown quote with its prompts and line breaks lost."""
    assert not under_examples_heading(_docstring("Add.\n\n>>> 1 + 2\n3\n"))
    assert not under_examples_heading(_docstring("Add.\n\nExamples:\n    >>> 1 + 2\n    3\n>>> 2 + 2\n4\n"))
    assert under_examples_heading(_docstring("Add.\n\n    Examples:\n        >>> 1 + 2\n        3\n    "))
    misplaced = [f"{test.filename}:{test.lineno + test.examples[0].lineno + 1}: {test.name}"
                 for name in MODULES for test in docstring_examples(name) if not under_examples_heading(test)]
    assert not misplaced, "put the examples under an `Examples:` line, indented below it:\n" + "\n".join(misplaced)


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run_as_written(module_name, tmp_path, monkeypatch):
    """Offline (HF_HUB_OFFLINE), in a scratch folder: examples and setups save models into the current folder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the printed text as in a log, not a terminal's: rich (inseq's show and progress) would otherwise add colour
    # codes and a transient spinner when the environment forces a terminal
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)
    tests = docstring_examples(module_name)
    ran = sum(run_examples(test, GIVEN.get(test.name, ((), ""))[0]) for test in tests)
    assert ran == sum(len(test.examples) for test in tests)
