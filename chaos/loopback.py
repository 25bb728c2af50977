"""What chaos's two fault-injecting servers share: their lifecycle on
127.0.0.1, their counters, and how they decide a request's fault.

:class:`chaos.faultserver.FaultServer` (files over HTTP) and
:class:`chaos.s3proxy.S3FaultProxy` (a proxy in front of an S3 endpoint)
differ in what they serve and which faults they know; they choose a fault the
same way: scripted faults first (:meth:`LoopbackFaultServer.script`), then a
first attempt's fault (``first_attempt``), then ``max_faults_per_path``, then
the profile's rates drawn from an RNG keyed on
``(seed, path, n)``, where ``n`` counts the requests of that path.  The same
seed and the same per-path request order give the same faults.

Named profiles (:data:`PROFILES`, :func:`profile`) are what a user on a bad
network sees, the same for both servers: ``mixed30`` (30% of requests get one
of :data:`MIXED_KINDS`, a stall lasting 0.5 s), ``flip40`` (40% of responses
carry one flipped byte), ``cut50`` (50% cut at a sample boundary with no
Content-Length), ``firsttry`` (the first attempt of every distinct request,
a range or a piece, fails), ``flipheader40`` and ``flipdata40`` (a flipped
byte in a tar header, or in member data).  A profile's faults hit every
request of a data file with no cap per path (``max_faults_per_path`` stays
None), so only a fetch that retries each request, not one budget per shard,
gets through.  :meth:`LoopbackFaultServer.at_request` runs an action (the
object replaced on the server) just before a given request is answered.

Example:
    >>> class Echo(LoopbackFaultServer):
    ...     all_faults = transport_faults = ("reset",)
    >>> s = Echo()
    >>> s._setup("127.0.0.1", 0, seed=1, max_faults_per_path=None, mixed=0.0, rates={})
    >>> s.script("a", ["reset", None])
    >>> [s._decide("/a")[0] for _ in range(3)], s.requests["/a"]
    (['reset', None, None], 3)
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import random
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: what a ``mixed30`` request may get: a reset, a 5xx, a body cut short with and without
#: Content-Length, a flipped byte in member data or in a tar header, a stall (0.5 s, then a reset)
MIXED_KINDS = ("reset", "500", "503", "truncate", "truncate_nolen", "flip_data", "flip_header", "stall")
#: what the first attempt of each request gets under ``firsttry``: a fault a retry heals
FIRST_ATTEMPT_KINDS = ("reset", "500", "503", "truncate", "truncate_nolen", "stall")


@dataclasses.dataclass(frozen=True)
class Profile:
    """A named fault profile (:data:`PROFILES`).

    Attributes:
        name: its name.
        faults: the per-request rates, in the servers' profile syntax.
        first_attempt: kinds drawn (seeded) for the first attempt of every
            distinct request (a path and its ``Range``); empty: none.
        stall_seconds: how long a ``stall`` keeps silent before its reset.
        retry_after: the Retry-After of a 503 (seconds).
        doc: one line for tables and ``--help``.
    """

    name: str
    faults: str
    first_attempt: Tuple[str, ...] = ()
    stall_seconds: float = 0.5
    retry_after: float = 1.0
    doc: str = ""


PROFILES: Dict[str, Profile] = {p.name: p for p in (
    Profile("mixed30", ",".join(f"{k}={0.3 / len(MIXED_KINDS)!r}" for k in MIXED_KINDS),
            doc="30% of requests: reset, 500, 503, cut with/without Content-Length, a flipped byte in data or "
                "a tar header, a 0.5 s stall"),
    Profile("flip40", "flip=0.4", doc="40% of responses carry one flipped byte"),
    Profile("cut50", "truncate_nolen=0.5", doc="50% of responses cut at a sample boundary, no Content-Length"),
    Profile("firsttry", "", first_attempt=FIRST_ATTEMPT_KINDS,
            doc="the first attempt of every request (each range, each piece) fails"),
    Profile("flipheader40", "flip_header=0.4", doc="40% of responses: one flipped byte in a tar header"),
    Profile("flipdata40", "flip_data=0.4", doc="40% of responses: one flipped byte in member data"),
)}


def profile(name: str) -> Profile:
    """The named profile.

    Raises:
        ValueError: no profile has that name.

    Example:
        >>> profile("cut50").faults
        'truncate_nolen=0.5'
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown fault profile {name!r}; known: {', '.join(PROFILES)}") from None


class QuietServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server that prints no traceback when a client resets."""

    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # no tracebacks on resets
        pass


class LoopbackFaultServer:
    """The shared half of a fault-injecting server (see the module docstring).

    A subclass sets :attr:`all_faults`, :attr:`transport_faults` (what a
    ``mixed`` profile draws from), :attr:`handler_class` (its request
    handler, which finds the server as ``handler_attr``), and calls
    :meth:`_setup` from its ``__init__``.
    """

    all_faults: Tuple[str, ...] = ()
    transport_faults: Tuple[str, ...] = ()
    handler_class: Any = http.server.BaseHTTPRequestHandler
    handler_attr = "server_obj"
    thread_name = "loopback"
    url_suffix = ""
    down_seconds = 1.0
    stall_seconds = 5.0  # how long a ``stall`` keeps silent (each server sets its own)
    retry_after: Optional[float] = None  # the Retry-After of a 503/429 (None: none)

    def _setup(self, host: str, port: int, seed: int, max_faults_per_path: Optional[int],
               mixed: float, rates: Dict[str, float]) -> None:
        self.host, self.port, self.seed = host, port, seed
        self.max_faults_per_path = max_faults_per_path
        self.mixed, self.rates = mixed, rates
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._down_until = 0.0
        self._held: Optional[threading.Event] = None  # set while requests of data files are held
        self._scripts: Dict[str, collections.deque] = {}
        self.first_attempt: Tuple[str, ...] = ()
        self._actions: Dict[Tuple[str, int], Callable[[], None]] = {}
        self.reset_counters()
        self._httpd: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ---- configuration -------------------------------------------------------
    def script(self, path: str, kinds: Sequence[Optional[str]], range_from: Optional[int] = None) -> None:
        """Force the next requests of ``path`` to these faults, before the profile.

        ``None`` means no fault; ``"reset@0.9"`` (a kind and a fraction) cuts
        the body at that fraction, for the kinds that cut bodies.  With
        ``range_from``, only the requests whose ``Range`` starts at that byte
        take them (the others go on as before).
        """
        if not path.startswith("/"):
            path = "/" + path
        for k in kinds:
            if k is not None and k.split("@")[0] not in self.all_faults:
                raise ValueError(f"unknown fault kind {k!r}")
        key = path if range_from is None else f"{path}@{int(range_from)}"
        with self._lock:
            self._scripts.setdefault(key, collections.deque()).extend(kinds)

    def use_profile(self, name: str) -> Profile:
        """Inject the named profile's faults (see :data:`PROFILES`); returns it.

        Its stall length and Retry-After replace the server's.
        """
        prof = profile(name)
        for kind in prof.first_attempt:
            if kind not in self.all_faults:
                raise ValueError(f"profile {name!r}: {type(self).__name__} cannot inject {kind!r}")
        self.set_faults(prof.faults)
        with self._lock:
            self.first_attempt = prof.first_attempt
            self.stall_seconds = prof.stall_seconds
            self.retry_after = prof.retry_after
        return prof

    def set_faults(self, faults: Any) -> None:  # each server parses its own kinds
        raise NotImplementedError

    def at_request(self, path: str, n: int, action: Callable[[], None]) -> None:
        """Run ``action()`` just before request number ``n`` (from 0) of ``path`` is
        answered: e.g. the object replaced on the server between two requests."""
        if not path.startswith("/"):
            path = "/" + path
        with self._lock:
            self._actions[(path, n)] = action

    def hold(self) -> None:
        """Hold every request of a data file (any path not ending in ``.json``)
        until :meth:`release` (or ``stop``): lets a test force two clients to
        overlap instead of hoping the first is still running."""
        with self._lock:
            self._held = threading.Event()

    def release(self) -> None:
        """Let held requests go on (and stop holding new ones)."""
        with self._lock:
            gate, self._held = self._held, None
        if gate is not None:
            gate.set()

    def wait_if_held(self, path: str, limit: float = 120.0) -> None:
        """Block a handler while :meth:`hold` is in force (at most ``limit`` s)."""
        gate = self._held
        if gate is not None and not path.endswith(".json"):
            deadline = time.monotonic() + limit
            while not gate.is_set() and not self._stopping.is_set() and time.monotonic() < deadline:
                gate.wait(0.05)

    def reset_counters(self) -> None:
        """Zero ``bytes_sent``, ``bytes_by_path``, ``requests``, ``ranged`` (requests
        with a ``Range`` header, per path), ``request_log``, ``range_log``,
        ``most_inflight`` (requests answered at once), ``connections`` and
        ``faults`` (and the per-path fault budget)."""
        with self._lock:
            self.bytes_sent = 0
            self.bytes_by_path: Dict[str, int] = collections.Counter()
            self.requests: Dict[str, int] = collections.Counter()
            self.ranged: Dict[str, int] = collections.Counter()
            self.range_log: List[Any] = []  # (path, its Range header or None), in the order requests arrived
            self.inflight = 0  # requests being answered now
            self.most_inflight = 0  # ... at most, at once
            self.request_log: List[Any] = []  # in the order requests arrived
            self.connections = 0  # TCP connections accepted
            self.faults: Dict[str, int] = collections.Counter()
            self._faults_by_path: Dict[str, int] = collections.Counter()
            self._seen: Dict[str, int] = collections.Counter()
            self._attempted: set = set()  # (path, Range) already asked once

    # ---- lifecycle -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.url_suffix}"

    def start(self) -> Any:
        handler = type("Handler", (self.handler_class,), {self.handler_attr: self})
        httpd = QuietServer((self.host, self.port), handler)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._stopping.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{self.thread_name}:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- decisions -------------------------------------------------------------
    def _log_request(self, path: str) -> None:
        """Called under the lock for every decided request (a subclass may log it)."""

    def _decide(self, path: str, attempt: Optional[str] = None) -> Tuple[Optional[str], random.Random]:
        """The fault of this request of ``path`` (None: none) and its RNG.

        ``attempt`` is what makes two requests of ``path`` the same request
        (its ``Range``, "" for a whole GET): the first one of each gets a
        :attr:`first_attempt` fault when the server has those.
        """
        with self._lock:
            n = self._seen[path]
            self._seen[path] += 1
            action = self._actions.pop((path, n), None)
        if action is not None:
            action()  # before the request is decided and answered (outside the lock)
        with self._lock:
            return self._decide_locked(path, n, attempt)

    def _decide_locked(self, path: str, n: int, attempt: Optional[str]) -> Tuple[Optional[str], random.Random]:
        self.requests[path] += 1
        self._log_request(path)
        rng = random.Random(f"{self.seed}:{path}:{n}")
        if time.monotonic() < self._down_until:  # a "down" window (the fault server's)
            self.faults["down"] += 1
            return "down", rng
        script = self._scripts.get(path)
        if attempt and attempt.startswith("bytes="):
            script = self._scripts.get(f"{path}@{attempt[6:].split('-')[0]}") or script
        if script:
            kind = script.popleft()
            if kind is not None:
                self.faults[kind.split("@")[0]] += 1
                self._faults_by_path[path] += 1
            return kind, rng
        if self.first_attempt and attempt is not None and (path, attempt) not in self._attempted:
            self._attempted.add((path, attempt))
            kind = random.Random(f"{self.seed}:{path}:{attempt}").choice(self.first_attempt)
            self.faults[kind] += 1
            self._faults_by_path[path] += 1
            return kind, rng
        if self.max_faults_per_path is not None and self._faults_by_path[path] >= self.max_faults_per_path:
            return None, rng
        kind = None
        u = rng.random()
        acc = 0.0
        for k in sorted(self.rates):
            acc += self.rates[k]
            if u < acc:
                kind = k
                break
        if kind is None and self.mixed and rng.random() < self.mixed:
            kind = rng.choice(self.transport_faults)
        if kind is not None:
            self.faults[kind] += 1
            self._faults_by_path[path] += 1
            if kind == "down":
                self._down_until = time.monotonic() + self.down_seconds
        return kind, rng

    def _count(self, path: str, n: int) -> None:
        with self._lock:
            self.bytes_sent += n
            self.bytes_by_path[path] += n
