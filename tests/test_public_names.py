"""Every public class name is unique across the package (adapters included), so a name says what it is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import bcos_plugins


def test_no_two_public_classes_share_a_name():
    defined = defaultdict(set)
    for info in pkgutil.walk_packages(bcos_plugins.__path__, prefix="bcos_plugins."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and not name.startswith("_") and obj.__module__ == module.__name__:
                defined[name].add(module.__name__)
    assert len(defined) > 50  # the walk really saw the package
    clashes = {name: sorted(where) for name, where in defined.items() if len(where) > 1}
    assert not clashes, f"public class names defined in more than one module: {clashes}"


def test_a_public_name_means_one_thing_everywhere():
    # e.g. bcos_plugins.Explanation once named TokenExplanation while bcos_plugins.attribution.Explanation was
    # the base class: one name, two classes
    meaning = defaultdict(dict)
    modules = [bcos_plugins] + [importlib.import_module(info.name)
                                for info in pkgutil.walk_packages(bcos_plugins.__path__, prefix="bcos_plugins.")]
    for module in modules:
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                meaning[name][f"{obj.__module__}.{obj.__qualname__}"] = module.__name__
    several = {name: sorted(objects) for name, objects in meaning.items() if len(objects) > 1}
    assert not several, f"public names bound to different objects in different modules: {several}"
    assert bcos_plugins.Explanation is bcos_plugins.attribution.Explanation
    assert bcos_plugins.Explanation is not bcos_plugins.TokenExplanation
