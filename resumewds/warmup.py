"""Imports started early, off the path to the first sample.

A data set over http(s) reads its manifest and first ranges with
``http.client`` (:mod:`resumewds.fetch.lite`); requests (and urllib3 under
it: 0.1-0.5 s) is imported by the first whole-shard download.  With
``RESUMEWDS_FETCH_LITE=0`` every fetch goes through requests, and building the
data set starts that import on a background thread
(:func:`import_in_background`), while the manifest, the plan and the store are
set up; the first fetch then finds it done, or waits only for the rest of it.

A fork while a background import is under way would leave the child with a
module lock held by a thread that does not exist there, so every fork first
waits for the imports under way (``os.register_at_fork``): a DataLoader's
forked workers then inherit the imported modules instead of each importing
them again.

The same holds for other work started early (:class:`Background`): a data set
over http(s) resolves its manifest on a background thread from construction,
and a fork waits for it, so a DataLoader's forked workers inherit the manifest
instead of each fetching and parsing it again.

A fork also freezes the heap for the child (:func:`gc.freeze` before it,
:func:`gc.unfreeze` in the parent right after: the parent's objects are
collected as before), as Python's documentation advises for a process that
forks without exec: a forked DataLoader worker's garbage collector then never
walks the objects it inherited (in a process that imported torch, a full
collection of them takes ~100 ms of each worker's start, and writes to every
page that holds one, which copies it).  Not done when the collector is off or
objects are frozen already (the caller manages it), nor with
``RESUMEWDS_FORK_FREEZE=0``.

Example:
    >>> import_in_background("json")   # already imported: nothing to do
    >>> Background(lambda: 6 * 7).result()
    42
    >>> wait()
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Optional

from . import config as _config

__all__ = ["Background", "import_in_background", "wait"]

_threads: Dict[str, threading.Thread] = {}
_work: weakref.WeakSet[Background] = weakref.WeakSet()
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


class Background:
    """``fn()`` run on a daemon thread from now; :meth:`result` waits for it.

    Its exception (an ``Exception``) is raised by :meth:`result`, in the
    caller's thread, as if the caller had run ``fn`` itself.  A fork waits for it.
    """

    def __init__(self, fn: Callable[[], Any], name: str = "resumewds-background"):
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        with _lock:
            _work.add(self)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except Exception as exc:  # raised again by result(), in the caller's thread
            self._error = exc

    def join(self) -> None:
        """Wait for ``fn`` to end (no-op from its own thread)."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def result(self) -> Any:
        """``fn()``'s value, waiting for it; its exception is raised here."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def wait() -> None:
    """Block until every background import and :class:`Background` work has ended."""
    for t in list(_threads.values()):
        if t.is_alive() and t is not threading.current_thread():
            t.join()
    with _lock:
        work = list(_work)
    for w in work:
        w.join()


_froze = False  # this fork's before-hook froze the heap (the parent unfreezes it after)


def _before_fork() -> None:
    global _froze
    wait()
    _froze = False
    if gc.isenabled() and gc.get_freeze_count() == 0 and _config.fork_freeze():
        gc.freeze()
        _froze = True


def _after_fork_in_parent() -> None:
    global _froze
    if _froze:
        _froze = False
        gc.unfreeze()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
