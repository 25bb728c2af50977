"""``MultiLoader``: webdataset's multiprocess loader, with exact state and no hangs.

Over a :class:`resumewds.WebDataset` (or an exact DataPipeline) worker ``w`` of ``W`` produces
the plan's steps ``k % W == w`` and the loader hands them out in step order (one process's
sequence, resumable with any worker count); over anything else every worker iterates the
dataset and items come as they arrive, as in webdataset.  A worker that dies is reported
(:class:`resumewds.errors.ResumeWDSError`) within ``poll_interval`` instead of a hang.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import weakref
from typing import Any, Dict, Iterator, List, Optional

from ..errors import ResumeWDSError, StateError
from ..plan import Layout
from ..run import check_seal, seal
from .webdataset import WebDataset

__all__ = ["EOF", "MultiLoader", "all_pids", "reader", "the_protocol"]

STATE_FORMAT = "resumewds.multiloader"
STATE_VERSION = 1
_CHUNK = 64
all_pids: weakref.WeakSet[Any] = weakref.WeakSet()
#: the pickle protocol of :func:`reader`'s messages (webdataset's)
the_protocol = pickle.HIGHEST_PROTOCOL


class EOF:
    """The end of one reader's stream (webdataset's message; keyword arguments become attributes)."""

    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


def reader(dataset: Any, sockname: str, index: int, num_workers: int) -> None:
    """webdataset's zmq reader process: send each sample of ``dataset``, pickled, to ``sockname``,
    then an :class:`EOF`.  Needs ``pyzmq`` (:class:`MultiLoader` uses pipes).

    Raises:
        ImportError: ``zmq`` is not installed.
    """
    import zmq  # type: ignore[import-not-found]  # an optional dependency, as webdataset's multi needs it

    os.environ["WORKER"] = str(index)
    os.environ["NUM_WORKERS"] = str(num_workers)
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(sockname)
    for sample in dataset:
        sock.send(pickle.dumps(sample, protocol=the_protocol))
    sock.send(pickle.dumps(EOF(index=index)))
    sock.close()


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover
        return


def _send(conn: Any, msg: Any) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _worker(dataset: Any, conn: Any, others: List[Any], index: int, num_workers: int,
            plan: Optional[Dict[str, Any]]) -> None:
    for c in others:  # so that our pipe sees EOF when *we* die, not when everyone does
        c.close()
    _die_with_parent()
    os.environ["WORKER"] = str(index)
    os.environ["NUM_WORKERS"] = str(num_workers)
    try:
        if plan is not None:
            layout = Layout(**plan["layout"])
            for k, batch, meta in dataset.iter_steps(plan["epoch"], plan["start"], layout, index,
                                                     num_workers, collate=plan["collate"]):
                _send(conn, ("step", k, batch, meta.get("samples", 0)))
        else:
            for sample in dataset:
                _send(conn, ("item", sample))
        _send(conn, ("eof", index))
    except BaseException as exc:  # report it; the main process raises it
        try:
            _send(conn, ("error", exc))
        except Exception:
            _send(conn, ("error", ResumeWDSError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()
        if hasattr(dataset, "close"):
            try:
                dataset.close()
            except Exception:
                pass


class MultiLoader:
    """Iterate ``dataset`` in ``workers`` processes (webdataset's signature; ``prefix`` is unused).

    ``poll_interval``: seconds between checks that the awaited worker is alive.

    Example:
        >>> MultiLoader(range(3), workers=1).workers
        1
    """

    def __init__(self, dataset: Any, workers: int = 4, verbose: bool = False, nokill: bool = False,
                 prefix: str = "/tmp/_multi-", poll_interval: float = 0.2):
        if int(workers) < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.dataset = dataset
        self.workers = int(workers)
        self.verbose = verbose
        self.nokill = nokill
        self.prefix = prefix
        self.poll_interval = poll_interval
        self.pids: List[Any] = []
        self._conns: List[Any] = []
        self.exact = isinstance(dataset, WebDataset) and bool(getattr(dataset, "exact", True))
        self.epoch = 0
        self.position = 0
        self.skip = 0
        if self.exact:
            self.config = dataset.config()  # resolve and index once, before forking

    def kill(self) -> None:
        """Kill the worker processes and close their pipes."""
        for p in self.pids:
            if p is not None and p.is_alive():
                if self.verbose:
                    print("killing", p.pid)
                p.kill()
            if p is not None:
                p.join(1.0)
        self.pids = []
        for c in self._conns:
            c.close()
        self._conns = []

    def _start(self, plan: Optional[Dict[str, Any]]) -> None:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        pipes = [ctx.Pipe(duplex=False) for _ in range(self.workers)]
        self.pids, self._conns = [], []
        for i in range(self.workers):
            r, w = pipes[i]
            others = [c for j, (rr, ww) in enumerate(pipes) for c in (rr, ww) if j != i] + [r]
            p = ctx.Process(target=_worker, args=(self.dataset, w, others, i, self.workers, plan), daemon=True)
            p.start()
            w.close()  # the child holds the only write end
            self.pids.append(p)
            self._conns.append(r)
            if self.verbose:
                print("# started worker", i, p.pid)
        all_pids.update(self.pids)

    def _recv(self, w: int) -> Any:
        conn, proc = self._conns[w], self.pids[w]
        while True:
            if conn.poll(self.poll_interval):
                try:
                    return pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    proc.join(1.0)
                    raise self._died(w) from None
            if not proc.is_alive() and not conn.poll(0):
                raise self._died(w)

    def _died(self, w: int) -> ResumeWDSError:
        proc = self.pids[w]
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        self.kill()
        return ResumeWDSError(f"MultiLoader worker {w} (pid {proc.pid}) died ({how}); progress up to "
                              f"the last item handed out is in state_dict(): epoch {self.epoch}, "
                              f"position {self.position}")

    def _layout(self) -> Layout:
        bs = self.dataset.batch_size
        return Layout(int(bs) if bs is not None else _CHUNK)

    def __iter__(self) -> Iterator[Any]:
        if not self.nokill:
            self.kill()
        if not self.exact:
            yield from self._iter_generic()
            return
        ds = self.dataset
        layout = self._layout()
        batched = ds.batch_size is not None
        epoch, start, skip = self.epoch, self.position, self.skip
        total = len(ds.plan.epoch(epoch))
        nsteps = layout.num_steps(total, start)
        plan = {"epoch": epoch, "start": start, "collate": batched,
                "layout": {"batch_size": layout.batch_size, "world_size": 1, "rank": 0,
                           "remainder": layout.remainder}}
        self._start(plan)
        try:
            for k in range(nsteps):
                w = k % self.workers
                msg = self._recv(w)
                if msg[0] == "error":
                    raise msg[1]
                if msg[0] != "step" or msg[1] != k:
                    raise ResumeWDSError(f"MultiLoader worker {w} sent {msg[0]} {msg[1]!r}, expected step {k}")
                _, _, batch, n = msg
                items = ([batch] if n else []) if batched else batch
                self.position = start + k * layout.step_size
                for i, x in enumerate(items):
                    if i < skip:
                        continue
                    self.skip = i + 1
                    yield x
                skip = 0
                self.position, self.skip = layout.position_after(total, start, k), 0
            self.epoch, self.position, self.skip = epoch + 1, 0, 0
        finally:
            self.kill()

    def _iter_generic(self) -> Iterator[Any]:
        self._start(None)
        live = set(range(self.workers))
        try:
            while live:
                ready = mp.connection.wait([self._conns[w] for w in live], timeout=self.poll_interval)
                if not ready:
                    for w in list(live):
                        if not self.pids[w].is_alive() and not self._conns[w].poll(0):
                            raise self._died(w)
                    continue
                for conn in ready:
                    w = self._conns.index(conn)
                    msg = self._recv(w)
                    if msg[0] == "eof":
                        if self.verbose:
                            print("# subprocess finished", w)
                        live.discard(w)
                    elif msg[0] == "error":
                        raise msg[1]
                    else:
                        yield msg[1]
        finally:
            self.kill()

    def state_dict(self) -> Dict[str, Any]:
        """Load it into any MultiLoader over the same dataset (any worker count)."""
        d = {"format": STATE_FORMAT, "version": STATE_VERSION, "exact": self.exact, "epoch": self.epoch,
             "position": self.position, "skip": self.skip}
        if self.exact:
            d["config"] = dict(self.config)
            d["step_size"] = self._layout().step_size
        return seal(d)

    get_state = state_dict

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state``.

        Raises:
            StateError: not a MultiLoader state, or taken on other data / order settings.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError("not a resumewds MultiLoader state (missing format field)")
        if int(state.get("version", 0)) > STATE_VERSION:
            raise StateError(f"MultiLoader state version {state.get('version')} is newer than this resumewds")
        check_seal(state, "this MultiLoader state")
        if self.exact:
            theirs = state.get("config") or {}
            diffs = [k for k in self.config if theirs.get(k) != self.config.get(k)]
            if diffs or state.get("step_size") != self._layout().step_size:
                raise StateError("MultiLoader state was taken on other data or settings: "
                                 + ", ".join(diffs or ["step_size"]))
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.skip = int(state.get("skip", 0))

    set_state = load_state_dict

    def __del__(self) -> None:
        try:
            self.kill()
        except Exception:
            pass
