"""The B-cos record in a saved model's ``config.json`` (``config.bcos``) and the versions of its format.

:func:`~bcos_plugins.bcosify` writes the record, :mod:`bcos_plugins.persistence` reads it back. It sits below
both so that the converter does not depend on the loader that is built on it.
"""

from __future__ import annotations

__all__ = ["BCOS_CONFIG_KEY", "FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "STOCK_QUERY_KEY_FORMAT_VERSION"]

BCOS_CONFIG_KEY = "bcos"
# 1: B only in config.bcos["b"]. 2: every B-cos layer also stores the B it runs with (buffer ``bcos_b``).
# 3: query/key projections kept stock (config.bcos["query_key"] == "stock"); written only for such models.
FORMAT_VERSION = 2
STOCK_QUERY_KEY_FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
