"""``resumewds report``: a run as plain data, read from its journal, and its self-contained HTML
page.

Where things are (private modules; import from this package)::

    _rundata.py  a run as plain data (every rank file)
    _figs.py     the report's charts (plotly)
    _page.py     the HTML page
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._page import write_report
    from ._rundata import full_status

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "full_status": "_rundata",
    "write_report": "_page",
}

__all__ = ["full_status", "write_report"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
