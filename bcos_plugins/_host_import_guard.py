"""TransformerLens' own bridge construction refuses B-cos models however the imports are ordered.

``TransformerBridge.boot_transformers(name, hf_model=bcos_model)`` rewrites the model it is given in place (for
GPT-2 the fused ``c_attn`` becomes plain q/k/v built from the raw weights): the user's B-cos model changes and its
logits move, without a word. The guard that refuses this lives with the TransformerLens adapter
(``bcos_plugins.adapters._lens.boot_guard``), but a user who calls TransformerLens directly never imports the
adapter, so :func:`guard_transformer_lens_on_import` (run by ``import bcos_plugins``) installs it as soon as both
packages are imported: at once when TransformerLens already is, else right after ``import transformer_lens``
finishes. Importing bcos_plugins still imports no host library: the guard's module is imported by name, only once
TransformerLens has been imported by someone else.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["guard_transformer_lens_on_import"]

HOST = "transformer_lens"
# imported by name: the core never imports an adapter, and this one only once the host is there
GUARD_MODULE = "bcos_plugins.adapters._lens.boot_guard"


def _install() -> None:
    """Install the guard; a TransformerLens without bridges (2.x) has nothing to guard. Where the guard cannot be
    installed (a TransformerLens release that moved what it patches), warn instead of breaking the user's import
    of TransformerLens; importing bcos_plugins.adapters.transformer_lens raises the same problem as an error."""
    if importlib.util.find_spec(f"{HOST}.model_bridge") is None:
        return
    from bcos_plugins.errors import BcosRuntimeError

    try:
        importlib.import_module(GUARD_MODULE).install_boot_guard()
    except BcosRuntimeError as error:
        warnings.warn(f"TransformerLens' own bridge construction is not guarded against B-cos models, which it "
                      f"would rewrite in place: {error}. Build bridges over B-cos models with bcos_plugins.adapters."
                      f"transformer_lens.transformer_bridge_from_hf, or install a tested TransformerLens "
                      f"(README, support matrix).", stacklevel=2)


class _GuardingLoader(importlib.abc.Loader):
    """The host package's own loader, which installs the guard once the package's ``__init__`` has run."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # the package keeps its own loader (resource readers, reloads); this wrapper only runs the import
        module.__loader__ = self.loader
        module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _install()


class _AfterHostImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders return for the host package (one import)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != HOST:
            return None
        sys.meta_path.remove(self)  # once: the host package is imported at most once per process
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _GuardingLoader(spec.loader)
        return spec


def guard_transformer_lens_on_import() -> None:
    """Install the boot guard now if TransformerLens is imported, else right after it is."""
    if HOST in sys.modules:
        _install()
    elif not any(isinstance(finder, _AfterHostImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterHostImport())
