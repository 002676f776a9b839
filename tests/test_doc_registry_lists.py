"""The lists of supported model families and classes the docs repeat are the architecture registry's.

Each list was written by hand next to a registry that grows (ModernBERT, Mistral, Qwen2, Qwen3 and Gemma 2 came
after docs/methods/bcos-lms.md named "GPT-2 and Llama" as the decoders, which it kept saying): these tests read
the lists out of the pages and compare them with ``SPECS``, so a family added to one and not the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bcos_plugins.convert.architectures import SPECS, specs_where, supported_architectures

ROOT = Path(__file__).resolve().parents[1]

# How the docs spell each family of the registry (the class name's prefix). A family added to SPECS without a
# spelling here fails test_every_registry_family_has_a_doc_spelling: add it, then name it in the pages below.
FAMILY_SPELLING = {"Bert": "BERT", "DistilBert": "DistilBERT", "Roberta": "RoBERTa", "ModernBert": "ModernBERT",
                   "GPT2": "GPT-2", "Llama": "Llama", "Mistral": "Mistral", "Qwen2": "Qwen2", "Qwen3": "Qwen3",
                   "Gemma2": "Gemma 2"}
_HEADS = re.compile(r"(Model|LMHeadModel|ForCausalLM|ForSequenceClassification|ForMaskedLM|ForTokenClassification)$")


def _family(class_name: str) -> str:
    return _HEADS.sub("", class_name)  # the leftmost match wins: GPT2LMHeadModel loses "LMHeadModel", not "Model"


def _registry_families() -> set[str]:
    return {_family(name) for name in supported_architectures()}


def _spelled(names: str) -> set[str]:
    """The families a page names in ``names``, by their spelling (longest first: "DistilBERT" holds "BERT")."""
    found = set()
    for family, spelling in sorted(FAMILY_SPELLING.items(), key=lambda item: -len(item[1])):
        pattern = rf"(?<![\w-]){re.escape(spelling)}(?![\w-])"
        if re.search(pattern, names):
            found.add(family)
            names = re.sub(pattern, " ", names)
    return found


def test_every_registry_family_has_a_doc_spelling():
    assert _family("GPT2LMHeadModel") == "GPT2" and _family("ModernBertForSequenceClassification") == "ModernBert"
    missing = _registry_families() - set(FAMILY_SPELLING)
    assert not missing, f"families in SPECS without a spelling in FAMILY_SPELLING (and so in no page): {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_bcos_lm_summary_names_every_registry_family(page):
    text = (ROOT / page).read_text()
    match = re.search(r"turns a stock transformers (.+?) into a B-cos model", text)
    assert match, f"{page}: the B-cos LMs row no longer says 'turns a stock transformers ... into a B-cos model'"
    assert _spelled(match.group(1)) == _registry_families()


def test_the_bcos_lm_page_names_every_registry_family_by_kind():
    text = (ROOT / "docs/methods/bcos-lms.md").read_text()
    match = re.search(r"^- Families .*?encoders (.+?); decoders (.+?);", text, re.M | re.S)
    assert match, "docs/methods/bcos-lms.md: the '- Families ... encoders ...; decoders ...;' bullet is gone"
    encoders, decoders = (_spelled(group) for group in match.groups())
    assert encoders == {_family(name) for name, spec in SPECS.items() if spec.kind == "encoder"}
    assert decoders == {_family(name) for name, spec in SPECS.items() if spec.kind == "decoder"}


def test_the_conversion_api_page_names_every_registry_family():
    text = (ROOT / "docs/api/convert.md").read_text()
    match = re.search(r"one `ArchitectureSpec` per supported transformers class \((.+?) classes;", text, re.S)
    assert match, "docs/api/convert.md: the registry sentence no longer lists the families"
    assert _spelled(match.group(1)) == _registry_families()


@pytest.mark.parametrize("page, lead", [
    ("docs/hosts/inseq.md", r"Supported\**: the B-cos causal LMs of the registry"),
    ("docs/in-depth.md", r"Supported: the B-cos causal LMs of the registry"),
    ("adapters/inseq.py", r"decoder-only B-cos LMs: the registry's causal LMs"),
])
def test_the_inseq_pages_list_exactly_the_registry_causal_lms(page, lead):
    text = (ROOT / page).read_text()
    match = re.search(lead + r"(.+?)(\. |``bcosify``)", text, re.S)
    assert match, f"{page}: the list of supported causal LMs is gone"
    named = set(re.findall(r"\b\w+(?:ForCausalLM|LMHeadModel)\b", match.group(1)))
    assert named == set(specs_where(lambda spec: spec.head == "causal_lm"))


def test_the_nn_page_lists_every_detachable_activation_kind():
    from bcos_plugins.nn.activation import GATES

    text = (ROOT / "docs/api/nn.md").read_text()
    match = re.search(r"^\| `DetachableActivation` \(its kinds, `GATES`: (.+?)\) \|", text, re.M)
    assert match, "docs/api/nn.md: the DetachableActivation row no longer lists its kinds"
    assert set(re.findall(r"`(\w+)`", match.group(1))) == set(GATES)


def test_the_readme_names_every_first_column_classifier():
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^- Encoder classifiers \((.+?)\) read the first column", text, re.M)
    assert match, "README.md: the known limit on first-column classifiers no longer lists them"
    reading = {_family(name) for name, spec in SPECS.items() if spec.first_column_pooling}
    assert _spelled(match.group(1)) == reading
