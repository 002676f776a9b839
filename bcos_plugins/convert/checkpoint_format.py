"""The B-cos record in a saved model's ``config.json`` (``config.bcos``) and the versions of its format.

:func:`~bcos_plugins.bcosify` writes the record, :mod:`bcos_plugins.persistence` reads it back. It sits below
both so that the converter does not depend on the loader that is built on it.
"""

from __future__ import annotations

__all__ = ["BCOS_CONFIG_KEY", "FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "RECORD_KEYS", "RECORD_ENTRY_TYPES",
           "STOCK_QUERY_KEY_FORMAT_VERSION"]

BCOS_CONFIG_KEY = "bcos"
# 1: B only in config.bcos["b"]. 2: every B-cos layer also stores the B it runs with (buffer ``bcos_b``).
# 3: query/key projections kept stock (config.bcos["query_key"] == "stock"); written only for such models.
FORMAT_VERSION = 2
STOCK_QUERY_KEY_FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
# Every key any version has written into the record: b, architecture, format_version (format 1 on), query_key (format
# 3), gate_branch_activations, activations and norm_eps (after 0.2.0, within format 2 / 3; an older save lacks them).
# A load refuses any other key: a misspelt one (norm_epss) meant its record was not applied, silently. A key a later
# version writes goes here, so that every save an older version wrote still loads.
RECORD_KEYS = ("b", "architecture", "format_version", "query_key", "gate_branch_activations", "activations",
               "norm_eps")
# the per-module records ({module path: value}) and the type of each value, as bcosify writes them
RECORD_ENTRY_TYPES = {"gate_branch_activations": (str,), "activations": (str,), "norm_eps": (int, float)}
