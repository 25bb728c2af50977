"""webdataset's ``typecheck`` module: the list of its modules to type-check at run time.

webdataset's module installs ``typeguard``'s import hook on those modules
when ``typeguard`` is installed.  resumewds installs no import hook (importing
a library must change nothing else in the process): here ``modules`` is the
list only; run ``typeguard`` yourself (``install_import_hook("resumewds....")``)
to check types at run time.

Example:
    >>> "filters" in modules
    True
"""

from __future__ import annotations

from typing import List

__all__ = ["modules"]

#: webdataset's module names (``cborsiterators`` is one of webdataset's, without a counterpart)
modules: List[str] = ["tenbin", "autodecode", "cache", "cborsiterators", "compat", "extradatasets", "filters",
                      "gopen", "handlers", "mix", "pipeline", "shardlists", "tariterators", "utils", "writer"]
