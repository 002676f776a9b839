"""Which TransformerLens is installed: 3.x has ``HookedTransformer`` and ``TransformerBridge``, 4.x only the bridge.

sae-lens 6 needs TransformerLens < 4, so both series are in use; the adapter offers everything on 3.x and the
bridge (:func:`~.bridge.transformer_bridge_from_hf`, the token x component decomposition) on both.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    from transformer_lens import HookedTransformer  # noqa: F401  (only probing for it)
except ImportError:  # TransformerLens 4.x removed it
    HAS_HOOKED_TRANSFORMER = False
else:
    HAS_HOOKED_TRANSFORMER = True

try:
    TRANSFORMER_LENS_VERSION = version("transformer-lens")
except PackageNotFoundError:  # pragma: no cover - an unusual install (e.g. a source checkout on the path)
    TRANSFORMER_LENS_VERSION = "unknown"

__all__ = ["HAS_HOOKED_TRANSFORMER", "TRANSFORMER_LENS_VERSION"]
