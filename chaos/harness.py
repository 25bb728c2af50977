"""What every row of ``python -m chaos run`` shares: the row, the suite, the bound, small helpers.

A *row* is a callable taking the :class:`Suite` and returning a :class:`Row`
(one line of the table).  The row modules (``chaos/*rows.py``,
``chaos/integrity.py``, ``chaos/workerfaults.py``) import from here, and
``chaos/run.py`` assembles their rows into the matrix and runs it; nothing
here imports a row module or ``chaos.run``.

Example:
    >>> r = Row("x", "exact")
    >>> r.verdict
    'PASS'
    >>> last_line("first\\n\\nlast\\n")
    'last'
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import resumewds as rw
from chaos.crash import Dataset, Proc, Tally, cat_cmd, compare, make_dataset, run
from chaos.faultserver import FaultServer

__all__ = ["BOUND", "Row", "Scenario", "Suite", "children", "cli", "labelled", "last_line", "name_of", "serve",
           "shard_paths", "signal_a_worker", "strict_error", "tar_paths"]

BOUND = 60.0  # seconds a single run may take before it counts as hung


@dataclasses.dataclass
class Row:
    """One line of the table: what was run, what was injected, what came out."""

    fault: str
    expect: str
    runs: int = 0
    faults: int = 0
    tally: Tally = dataclasses.field(default_factory=Tally)
    clear_errors: int = 0
    bad_exits: List[str] = dataclasses.field(default_factory=list)
    hung: int = 0
    skip: Optional[str] = None
    note: str = ""
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if self.skip:
            return "SKIP"
        if self.hung or self.bad_exits or not self.tally.ok:
            return "FAIL"
        return "PASS"


def serve(root: str, faults: str = "", *, manifest: Optional[str] = None, **kw: Any) -> FaultServer:
    """A started :class:`FaultServer` over ``root``; with ``manifest``, the
    manifest is served without faults (they hit shards, not the manifest)."""
    srv = FaultServer(root, faults=faults, manifest=manifest, **kw).start()
    if manifest is not None:
        srv.script("/manifest.json", [None] * 1000)
    return srv


class Suite:
    """Data, reference outputs and servers shared by the scenarios.

    The data set (:attr:`data`) and its reference output (:attr:`ref`) are
    made on first use; :meth:`shared` keeps what other rows share.
    """

    def __init__(self, work: str, seed: int, quick: bool):
        self.work = work
        self.seed = seed
        self.quick = quick
        self._n = 0
        self._lock = threading.Lock()
        self._shared: Dict[str, Any] = {}
        self._shared_lock = threading.RLock()  # a shared thing may be made of another

    @property
    def data(self) -> Dataset:
        """6 shards x 60 samples and their manifest (made on first use)."""
        return self.shared("data", lambda: make_dataset(os.path.join(self.work, "data"), shards=6, samples=60,
                                                        size_range=(1000, 12000), seed=self.seed))

    @property
    def ref(self) -> List[str]:
        """What ``cat`` (:func:`chaos.crash.cat_cmd`, no workers, one epoch) prints over :attr:`data`."""
        def make() -> List[str]:
            ref = run(cat_cmd(self.data.manifest, workers=0, epochs=1), bound=120)
            if ref.rc != 0:
                raise RuntimeError(f"reference run failed: {ref.err[-2000:]}")
            return ref.lines
        return self.shared("ref", make)

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``'s result, made once per suite and then shared (rows run in threads)."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = make()
            return self._shared[key]

    def tmp(self, name: str) -> str:
        with self._lock:
            self._n += 1
            d = os.path.join(self.work, f"{self._n:03d}-{name}")
        os.makedirs(d)
        return d

    def server(self, faults: str = "", **kw: Any) -> FaultServer:
        """A fault server over the suite's data set and manifest."""
        kw.setdefault("seed", self.seed)
        kw.setdefault("stall_seconds", 3.0)
        kw.setdefault("retry_after", 0.2)
        kw.setdefault("manifest", self.data.manifest)
        return serve(self.data.root, faults, **kw)

    def v3_server(self, d: str, faults: str = "", **kw: Any) -> FaultServer:
        """A fault server over a copy of the shards in ``d/srv`` with a v3
        manifest (sample digests); the server's ``root_dir`` is that copy."""
        root = os.path.join(d, "srv")
        shutil.copytree(self.data.root, root)
        rw.build_manifest(tar_paths(root), os.path.join(root, "manifest.json"), digests=True)  # version 3
        kw.setdefault("seed", self.seed)
        return serve(root, faults, manifest=os.path.join(root, "manifest.json"), **kw)

    def server_without_manifest(self, faults: str = "", **kw: Any) -> FaultServer:
        """A fault server over the data set's shards alone (a copy without the
        ``manifest.json`` beside them, made once): shards named one by one are
        indexed from their bytes, as a data set without an index is."""
        root = os.path.join(self.work, "bare")
        with self._lock:
            if not os.path.isdir(root):
                tmp = root + ".tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)
                for path in shard_paths(self.data):
                    shutil.copy(path, tmp)
                os.replace(tmp, root)
        kw.setdefault("seed", self.seed)
        kw.setdefault("stall_seconds", 3.0)
        kw.setdefault("retry_after", 0.2)
        kw.setdefault("manifest", self.data.manifest)  # (where the samples lie, for the faults)
        return serve(root, faults, **kw)

    def brace_source(self, url: str) -> str:
        """``url{shard-a.tar,shard-b.tar,...}``: the data set's shards without a manifest."""
        return url + "{" + ",".join(sorted(os.path.basename(p) for p in shard_paths(self.data))) + "}"

    def judge(self, row: Row, p: Proc, expect: Optional[str] = None, data: Optional[Dataset] = None,
              ref: Optional[List[str]] = None) -> None:
        """Count one run into ``row`` (against ``data`` and its ``ref`` output, by
        default the suite's)."""
        expect = expect or row.expect
        data = data or self.data
        ref = self.ref if ref is None else ref
        row.runs += 1
        if p.hung:
            row.hung += 1
            row.bad_exits.append(f"hung > {BOUND:.0f}s")
            return
        got = p.lines
        ok_exact = p.rc == 0
        if p.clear_error:
            row.clear_errors += 1
        if expect == "exact" or (expect == "either" and ok_exact):
            row.tally.add(compare(ref, got, data.digests))
            if not ok_exact:
                row.bad_exits.append(f"exit {p.rc}: {last_line(p.err)}")
        else:  # an error is expected (or allowed): what was printed must be a correct prefix
            row.tally.add(compare(ref[:len(got)], got, data.digests))
            if ok_exact and expect == "error":
                row.bad_exits.append("exit 0 where an error was expected")
            elif not ok_exact and not p.clear_error:
                row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
        if not row.note and p.rc and p.clear_error:
            row.note = last_line(p.err)


Scenario = Callable[[Suite], Row]


def last_line(text: str) -> str:
    """The last non-blank line of ``text``, at most 160 characters."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:160]


def tar_paths(root: str) -> List[str]:
    """The ``.tar`` files directly under ``root``, sorted."""
    return sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar"))


def shard_paths(data: Dataset) -> List[str]:
    """The data set's shard files, sorted."""
    return tar_paths(data.root)


def children(pid: int) -> List[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == str(pid):
                        kids.append(int(d))
            except (OSError, IndexError):
                pass
    return kids


def signal_a_worker(sig: int, hit: List[int]) -> Callable[[subprocess.Popen], None]:
    """An ``on_start`` for :func:`chaos.crash.run`: once the run has two
    children (its DataLoader workers), wait 0.6 s and send ``sig`` to the
    first one; its pid is appended to ``hit``."""
    def on_start(p: subprocess.Popen) -> None:
        def go() -> None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20 and p.poll() is None:
                kids = children(p.pid)
                if len(kids) >= 2:
                    time.sleep(0.6)
                    os.kill(kids[0], sig)
                    hit.append(kids[0])
                    return
                time.sleep(0.02)
        threading.Thread(target=go, daemon=True).start()
    return on_start


def strict_error(p: Proc, *words: str) -> bool:
    """A strict clear error: exit > 0, no traceback, and the LAST stderr line
    is ``Error: ...`` containing every one of ``words``."""
    lines = [ln for ln in p.err.splitlines() if ln.strip()]
    return (not p.hung and p.rc is not None and p.rc > 0 and "Traceback" not in p.err and bool(lines)
            and lines[-1].startswith("Error: ") and all(w in lines[-1] for w in words))


def cli(*args: str) -> List[str]:
    """``python -m resumewds ARGS...``"""
    return [sys.executable, "-m", "resumewds", *args]


def labelled(label: str, fn: Scenario) -> Scenario:
    """``fn`` with the name ``--only`` matches and a failing harness reports."""
    fn.label = label  # type: ignore[attr-defined]
    return fn


def name_of(sc: Callable[..., Any]) -> str:
    """A scenario's label, or its function name."""
    return str(getattr(sc, "label", None) or getattr(sc, "__name__", "?"))
