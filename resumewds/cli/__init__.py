"""The ``resumewds`` command line.

Where things are (private modules; import from this package)::

    _main.py      the commands: cat, verify, prefetch, index, status, report, demo, ...
    _out.py       what cat writes besides its data lines; how stdout fails
    _progress.py  the progress bar, on stderr
    _demo.py      resumewds demo: generate, shuffle, interrupt, resume, compare
"""

from __future__ import annotations

from ._main import main, unescape_field

__all__ = ["main", "unescape_field"]
