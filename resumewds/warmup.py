"""Imports started early, off the path to the first sample.

A data set over http(s) will import requests (and urllib3 under it: 0.1-0.5 s)
at its first fetch, which is on the path to the first sample.  Building the
data set starts that import on a background thread instead
(:func:`import_in_background`), while the manifest, the plan and the store are
set up; the first fetch then finds it done, or waits only for the rest of it.

A fork while a background import is under way would leave the child with a
module lock held by a thread that does not exist there, so every fork first
waits for the imports under way (``os.register_at_fork``): a DataLoader's
forked workers then inherit the imported modules instead of each importing
them again.

Example:
    >>> import_in_background("json")   # already imported: nothing to do
    >>> wait()
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Dict

__all__ = ["import_in_background", "wait"]

_threads: Dict[str, threading.Thread] = {}
_lock = threading.Lock()


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # the real first use reports it, with its own message
        pass


def import_in_background(name: str) -> None:
    """Start importing module ``name`` on a daemon thread (once; no-op if imported)."""
    if name in sys.modules:
        return
    with _lock:
        if name in _threads:
            return
        t = threading.Thread(target=_import, args=(name,), name=f"resumewds-import-{name}", daemon=True)
        _threads[name] = t
        t.start()


def wait() -> None:
    """Block until every background import has ended."""
    for t in list(_threads.values()):
        if t.is_alive() and t is not threading.current_thread():
            t.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait)
