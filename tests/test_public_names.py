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
