"""``pipe:CMD``: a shell command's stdout, from zero every attempt, never allowed to hang.

The command runs in its own process group and dies with this process.  When
it writes nothing for ``read_timeout`` seconds, slower than ``min_rate``,
past the deadline (``min_rate=0``), or does not exit ``read_timeout`` seconds
after closing its stdout, its group is killed and the attempt fails
(transient); a non-zero exit is transient too, with its stderr's tail.

Example:
    >>> TRANSPORT.name, TRANSPORT.resumable
    ('pipe', False)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
from typing import Any, Callable, Optional

from ..errors import TransientFetchError
from ._attempt import _Attempt, _Pace
from ._partial import _ETAG_SUFFIX, _remove_quietly, _Sink, _size_of
from ._transport import Transport


def _exit_message(rc: int, err: Any) -> str:
    """``command exited with status N: <stderr tail>`` (or says stderr was empty)."""
    err.seek(0, os.SEEK_END)
    n = err.tell()
    err.seek(max(0, n - 2000))
    tail = err.read().decode("utf-8", "replace").strip()
    what = f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
    return f"command {what}: {tail}" if tail else f"command {what} (stderr was empty)"


_PR_SET_PDEATHSIG = 1
_LIBC: Any = None


def _die_with_parent_fn() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` making the child get SIGKILL when we die (Linux), else None."""
    global _LIBC
    if not os.path.exists("/proc/self"):
        return None
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.prctl  # noqa: B018  (raises if missing)
        except (OSError, AttributeError):
            _LIBC = False
    if not _LIBC:
        return None
    prctl, parent = _LIBC.prctl, os.getpid()

    def fn() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # died before prctl took effect
            os._exit(137)
    return fn


def _popen(cmd: str, **kw: Any) -> subprocess.Popen:
    """Start a ``pipe:`` command: a shell in its own process group, that dies with us."""
    return subprocess.Popen(cmd, shell=True, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent_fn(), **kw)


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> None:
    """SIGKILL a command's process group (and reap it); called only while a member is known
    alive, so the group id cannot have been reused."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if reap:
        proc.wait()


class PipeTransport(Transport):
    """``pipe:CMD``: the command's stdout, read with ``poll`` and ``readv``."""

    name = "pipe"

    def attempt(self, state: _Attempt) -> None:
        """Run the command and keep its stdout (the module docstring says when it is killed)."""
        cmd = state.url[len("pipe:"):]
        pace = _Pace(state.url, state.config, state.budget, what="command's output")
        timeout = state.config.read_timeout
        _remove_quietly(state.path + _ETAG_SUFFIX)
        with tempfile.TemporaryFile() as err, _Sink(state, append=False) as sink:
            proc = _popen(cmd, stdout=subprocess.PIPE, stderr=err)
            try:
                assert proc.stdout is not None
                fd = proc.stdout.fileno()
                poller = select.poll()
                poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                buf = state.buffer()
                while True:
                    wait = pace.body_timeout(timeout)
                    if not poller.poll(max(1, int(wait * 1000))):
                        # someone in the group still holds the pipe open: kill the group
                        _kill_group(proc, reap=False)
                        if wait < timeout:
                            raise TransientFetchError(f"{state.url}: fetch deadline of {state.config.deadline:g}s "
                                                      f"reached while the command ran; killed it", state.url)
                        raise TransientFetchError(f"{state.url}: command wrote nothing for {timeout:g}s "
                                                  f"(stalled); killed it", state.url)
                    n = os.readv(fd, [buf])
                    if not n:
                        break
                    try:
                        state._put(sink, buf[:n], pace)
                    except TransientFetchError as exc:
                        _kill_group(proc, reap=False)
                        raise TransientFetchError(f"{exc}; killed it", state.url) from None
                try:
                    rc = proc.wait(timeout=pace.body_timeout(timeout))
                except subprocess.TimeoutExpired:
                    raise TransientFetchError(f"{state.url}: command closed its output but did not exit within "
                                              f"{timeout:g}s; killed it", state.url) from None
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
                proc.stdout.close()  # type: ignore[union-attr]
            if rc != 0:
                raise TransientFetchError(f"{state.url}: {_exit_message(rc, err)}", state.url)
        state._check_expected(_size_of(state.path))


TRANSPORT = PipeTransport()
