"""What ``resumewds cat`` writes besides its data lines, and how stdout fails."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Callable, Set

from ..errors import naming

__all__ = ["SkipLines", "quiet_numpy_warning"]


class StdoutError(Exception):
    """Writing to stdout failed (a full disk, a closed file): not a data error."""


def write(out: Any, text: str) -> None:
    try:
        out.write(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(exc.strerror or str(exc)) from exc


def flush(out: Any) -> None:
    try:
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(exc.strerror or str(exc)) from exc


def detach_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def quiet_numpy_warning() -> None:
    """Silence torch's "Failed to initialize NumPy" warning (the minimal install has no numpy)."""
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


class _DropSkipRecords(logging.Filter):
    """Drops the library's own skip warnings while :class:`SkipLines` says them."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("skipping shard ") or "shard(s) skipped after errors" in msg)


class SkipLines:
    """One line per shard skipped after an error (``--on-error skip``).

    While open, the library's own skip warnings are left out, so that each
    skipped shard is named once: ``resumewds: skipped shard URL: problem``.
    ``failed`` is the loader's ``{url: error}`` (``loader.stats_.failed``).
    """

    def __init__(self, failed: dict, echo: Callable[[str], Any]):
        self.failed = failed
        self.echo = echo
        self.said: Set[str] = set()
        self._n = 0
        self._filter = _DropSkipRecords()
        logging.getLogger("resumewds").addFilter(self._filter)  # forked workers inherit it

    def poll(self) -> None:
        """Name each shard that failed since the last call."""
        failed = self.failed
        if len(failed) == self._n:
            return
        self._n = len(failed)
        for url in sorted(failed):
            if url not in self.said:
                self.said.add(url)
                self.echo(f"resumewds: skipped shard {naming(url, failed[url])}")

    def close(self) -> None:
        """Name the shards not named yet and give the library its warnings back."""
        try:
            self._n = -1
            self.poll()
        finally:
            logging.getLogger("resumewds").removeFilter(self._filter)
