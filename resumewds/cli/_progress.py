"""The progress bar of the ``resumewds`` commands, on stderr (when it is a terminal, or asked)."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Optional

__all__ = ["Bar", "NoBar", "progress_bar"]


def progress_bar(length: int, label: str, enabled: Optional[bool] = None, unit: str = "samples",
                 initial: int = 0) -> Any:
    """A progress bar on stderr; silent when stderr is not a terminal (or ``enabled`` is False)."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return NoBar()
    return Bar(length, label, unit, initial=initial)


class NoBar:
    """A bar that draws nothing."""

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *a: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _fmt_amount(n: float, unit: str) -> str:
    if unit != "bytes":
        return f"{n:,.0f}"
    for u in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or u == "TB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1000.0
    return str(n)  # pragma: no cover


class Bar:
    """A one-line progress bar with units, rate and ETA, redrawn at most ``max_hz`` times a second.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with Bar(10, "x", "samples", file=out, max_hz=0) as b:
        ...     b.update(10)
        >>> out.getvalue().count(chr(13)), "10/10 samples" in out.getvalue()
        (3, True)
    """

    def __init__(self, length: int, label: str, unit: str = "samples", file: Any = None,
                 max_hz: float = 10.0, clock: Callable[[], float] = time.monotonic, initial: int = 0):
        self.length = max(0, int(length))
        self.label = label
        self.unit = unit
        self.file = file if file is not None else sys.stderr
        self.min_dt = 1.0 / max_hz if max_hz > 0 else 0.0
        self.clock = clock
        self.pos = int(initial)  # a resumed cat starts past 0
        self.redraws = 0
        self._t0 = clock()
        self._last = float("-inf")
        self._base = self.pos

    def __enter__(self) -> Bar:
        self._draw()
        return self

    def __exit__(self, *a: Any) -> None:
        self._draw()
        with contextlib.suppress(OSError, ValueError):
            self.file.write("\n")
            self.file.flush()

    def update(self, n: int) -> None:
        self.pos += n
        now = self.clock()
        if now - self._last >= self.min_dt:
            self._draw(now)

    def line(self, now: Optional[float] = None) -> str:
        now = self.clock() if now is None else now
        dt = max(now - self._t0, 1e-9)
        rate = (self.pos - self._base) / dt
        frac = min(1.0, self.pos / self.length) if self.length else 0.0
        width = 24
        fill = int(frac * width)
        tot = _fmt_amount(self.length, self.unit)
        u = "" if self.unit == "bytes" else f" {self.unit}"
        r = f"{_fmt_amount(rate, self.unit)}{'/s' if self.unit == 'bytes' else f' {self.unit}/s'}"
        eta = ""
        if rate > 0 and self.length > self.pos:
            eta = f", eta {_fmt_eta((self.length - self.pos) / rate)}"
        return (f"{self.label} [{'#' * fill}{'-' * (width - fill)}] {frac:4.0%} "
                f"{_fmt_amount(self.pos, self.unit)}/{tot}{u}, {r}{eta}")

    def _draw(self, now: Optional[float] = None) -> None:
        now = self.clock() if now is None else now
        self._last = now
        self.redraws += 1
        with contextlib.suppress(OSError, ValueError):
            self.file.write("\r" + self.line(now) + "\x1b[K")
            self.file.flush()


def _fmt_eta(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"

