"""The package's import graph, read from the source with ``ast`` (function-level imports included, which a
packaging test that only imports modules cannot see): no module imports one that is built on it, and no
modules import each other (docs/design.md, "One explanation mechanism").
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where each top-level folder installs (pyproject's package-dir: adapters/ is bcos_plugins.adapters)
PACKAGES = {"bcos_plugins": "bcos_plugins", "adapters": "bcos_plugins.adapters"}

# Layers, lowest first: a module may import its own layer and the ones below, never one above. The
# attribution core (one input x gradient loop, target parsing, results) sits under every explanation path.
LAYERS = [
    ("foundation", ("bcos_plugins._version", "bcos_plugins.errors", "bcos_plugins._checks")),
    ("layers and conversion", ("bcos_plugins.nn", "bcos_plugins.convert")),
    ("attribution core", ("bcos_plugins.attribution",)),
    ("explanation paths", ("bcos_plugins.explain", "bcos_plugins.corpus")),
]
# host libraries the core never imports (docs/design.md "Rules of the house"); Captum lives in adapters/ only
HOST_LIBRARIES = ("captum", "inseq", "transformer_lens", "sae_lens")


def _modules() -> dict[str, Path]:
    found = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((dotted, *parts))] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> tuple[set[str], set[str]]:
    """(package modules, external top-level names) that module ``name`` imports anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if _is_package(name) else name.rpartition(".")[0]
    internal, external = set(), set()

    def add(target: str) -> None:
        if target.split(".")[0] != "bcos_plugins":
            external.add(target.split(".")[0])
            return
        while target and target not in MODULES:  # an imported name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            internal.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)
    return internal, external


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return None


def test_the_walk_sees_the_package_and_the_adapters():
    assert {"bcos_plugins.attribution.targets", "bcos_plugins.explain", "bcos_plugins.adapters.captum",
            "bcos_plugins.adapters._lens.explain"} <= set(MODULES)
    assert "bcos_plugins.explain" in GRAPH["bcos_plugins.corpus"][0]  # a module-level import is seen
    assert "bcos_plugins.attribution.targets" in GRAPH["bcos_plugins.explain"][0]


def test_no_module_imports_a_layer_built_on_it():
    upward = []
    for name, (internal, _) in GRAPH.items():
        own = _layer(name)
        if own is None:
            continue
        for target in internal:
            other = _layer(target)
            if other is None or other > own:  # unlisted modules (metrics, vision, adapters, ...) are above
                upward.append(f"{name} ({LAYERS[own][0]}) imports {target}")
    assert not upward, "\n".join(sorted(upward))


def test_the_attribution_core_never_imports_an_explanation_path():
    for name in (n for n in GRAPH if _layer(n) == 2):
        internal, _ = GRAPH[name]
        assert not {"bcos_plugins.explain", "bcos_plugins.corpus"} & internal, name
        assert not any(t.startswith("bcos_plugins.adapters") for t in internal), name


# Loops that predate this test; each entry left when its loop was cut (the last, convert's architectures <->
# bcosify, when UnsupportedModuleError moved to the registry), and the tests fail while a listed loop no longer
# exists, so this list only shrinks: it stays empty.
KNOWN_MUTUAL: set[tuple[str, str]] = set()


def _mutual() -> set[tuple[str, str]]:
    return {(a, b) for a, (internal, _) in GRAPH.items() for b in internal if a < b and a in GRAPH[b][0]}


def test_the_known_loops_still_exist():
    assert not KNOWN_MUTUAL - _mutual(), "a listed loop is gone: remove it from KNOWN_MUTUAL"


def test_no_two_modules_import_each_other():
    # a package's __init__ re-exports its submodules; a submodule importing the package it belongs to would
    # close a loop through that __init__, so that counts too
    mutual = sorted(f"{a} <-> {b}" for a, b in _mutual() - KNOWN_MUTUAL)
    assert not mutual, "\n".join(mutual)


def _underscore_imports(sources: dict[str, str] | None = None) -> set[tuple[str, str]]:
    """(importing module, ``module.name``) for every ``from module import _name`` across modules, and every
    ``module._name`` read off an imported module (``from . import functional`` ... ``functional._FLAG``), where
    ``_name`` is not itself a module (``from . import _version`` imports a module: allowed). ``sources``:
    module name -> source text in place of the files (for the test of this check)."""
    found = set()
    for name, path in MODULES.items():
        package = name if _is_package(name) else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8") if sources is None else sources.get(name, ""))
        bound = {}  # a local name -> the package module it holds
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound.update({alias.asname: alias.name for alias in node.names
                              if alias.asname and alias.name in MODULES})
                if any(not alias.asname and alias.name.split(".")[0] == "bcos_plugins" for alias in node.names):
                    bound["bcos_plugins"] = "bcos_plugins"  # `import bcos_plugins.x` binds the package
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                module = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "bcos_plugins" or module == name:
                continue
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add((name, f"{module}.{alias.name}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and f"{bound[node.value.id]}.{node.attr}" not in MODULES and bound[node.value.id] != name:
                found.add((name, f"{bound[node.value.id]}.{node.attr}"))
    return found


def test_the_private_name_check_sees_each_spelling():
    sources = {"bcos_plugins.explain": "from .attribution.targets import _private\nfrom .nn import functional\n"
                                       "functional._REFERENCE_PATH\nfrom . import _checks\n_checks.require_int\n"
                                       "import bcos_plugins.nn.functional as F\nF._FLAG\nF.__name__\n",
               "bcos_plugins.corpus": "import bcos_plugins.nn.functional\nbcos_plugins._version\n"
                                      "bcos_plugins._hidden\n"}
    assert _underscore_imports(sources) == {
        ("bcos_plugins.explain", "bcos_plugins.attribution.targets._private"),
        ("bcos_plugins.explain", "bcos_plugins.nn.functional._REFERENCE_PATH"),
        ("bcos_plugins.explain", "bcos_plugins.nn.functional._FLAG"),
        ("bcos_plugins.corpus", "bcos_plugins._hidden")}


# Private names a module took from another; each entry left when its import went (convert/'s activation tables,
# gelu_kind and unsupported_message are internal names now), and the test below fails while a listed import no
# longer exists, so this list only shrinks.
KNOWN_UNDERSCORE_IMPORTS: set[tuple[str, str]] = set()


def test_no_module_imports_another_modules_private_names():
    # a helper two modules share is an internal name (no underscore) of the lower one (docs/design.md)
    offenders = sorted(f"{a} imports {b}" for a, b in _underscore_imports() - KNOWN_UNDERSCORE_IMPORTS)
    assert not offenders, "\n".join(offenders)


def test_the_known_private_imports_still_exist():
    gone = sorted(f"{a} imports {b}" for a, b in KNOWN_UNDERSCORE_IMPORTS - _underscore_imports())
    assert not gone, "gone: remove from KNOWN_UNDERSCORE_IMPORTS\n" + "\n".join(gone)


def _part(name: str) -> str:
    """The part of the package a module belongs to: a top-level module or subpackage of ``bcos_plugins``, or
    one adapter (``bcos_plugins.adapters.captum``; the TransformerLens adapter with its ``_lens`` parts)."""
    parts = name.split(".")
    if parts[1:2] == ["adapters"] and len(parts) > 2:
        return "bcos_plugins.adapters." + ("transformer_lens" if parts[2] == "_lens" else parts[2])
    return ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """``"a -> b -> a"`` for each loop a depth-first walk of ``graph`` closes (one at least when there is any)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(node, path):
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycles_between_the_parts_of_the_package():
    # between parts (attribution, explain, vision, metrics, an adapter, ...) every import goes one way
    graph: dict[str, set[str]] = {}
    for name, (internal, _) in GRAPH.items():
        graph.setdefault(_part(name), set()).update(_part(t) for t in internal if _part(t) != _part(name))
    cycles = _cycles(graph)
    assert not cycles, "\n".join(cycles)


def test_no_import_cycles_between_modules():
    # inside a part too, over any number of modules, function-level imports included: a registry that imports
    # its entries lazily and an entry that imports the registry's helpers close a loop all the same (the last
    # one, convert's architectures -> gemma -> dynamic_linear -> architectures, was cut when tanh_ratio moved
    # to nn.activation); a helper two modules share lives in a module below both
    cycles = _cycles({name: internal for name, (internal, _) in GRAPH.items()})
    assert not cycles, "\n".join(cycles)


def test_nothing_outside_the_adapters_imports_an_adapter():
    offenders = sorted(f"{name} imports {target}" for name, (internal, _) in GRAPH.items()
                       if not name.startswith("bcos_plugins.adapters") for target in internal
                       if target.startswith("bcos_plugins.adapters"))
    assert not offenders, "\n".join(offenders)


def test_the_core_never_imports_a_host_library():
    offenders = sorted(f"{name} imports {lib}" for name, (_, external) in GRAPH.items()
                       if not name.startswith("bcos_plugins.adapters") for lib in external & set(HOST_LIBRARIES))
    assert not offenders, "\n".join(offenders)


def test_captums_private_modules_are_imported_in_one_place_only():
    # adapters/_captum_private.py holds (and tests) every private Captum helper the adapters use
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imported = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                        else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for module in imported:
                if module.split(".")[0] == "captum" and any(p.startswith("_") for p in module.split(".")):
                    offenders.append(f"{name} imports {module}")
    assert offenders == ["bcos_plugins.adapters._captum_private imports captum._utils",
                         "bcos_plugins.adapters._captum_private imports captum._utils.typing",
                         "bcos_plugins.adapters._captum_private imports captum.attr._utils.visualization"], offenders
