"""webdataset's ``typecheck`` module: the list of its modules to type-check at run time.

resumewds installs no import hook (webdataset's installs ``typeguard``'s): ``modules`` is the list only.
"""

from __future__ import annotations

from typing import List

__all__ = ["modules"]

#: webdataset's module names (``cborsiterators`` is one of webdataset's, without a counterpart)
modules: List[str] = ["tenbin", "autodecode", "cache", "cborsiterators", "compat", "extradatasets", "filters",
                      "gopen", "handlers", "mix", "pipeline", "shardlists", "tariterators", "utils", "writer"]
