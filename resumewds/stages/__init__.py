"""The stages a sample goes through: per-sample stages, the stream stages' runners, the handler
protocol, the position keys each sample carries.

Where things are (private modules; import from this package)::

    _stages.py     one callable per per-sample stage, Stage, the collations
    _runners.py    one runner per stream stage (batched, shuffle, unbatched, ...)
    _handling.py   the handler= protocol: reraise, until_stop, skipped samples
    _positions.py  the position keys, hidden from webdataset code
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._handling import Handler, OnEvent, empty_epoch_error, reraise_exception, until_stop
    from ._positions import hide_positions
    from ._runners import (
        BatchRunner,
        LogKeysRunner,
        MapRunner,
        RSampleRunner,
        ShuffleRunner,
        SliceRunner,
        UnbatchRunner,
    )
    from ._stages import (
        ExtractKeys,
        FieldError,
        Handled,
        Map,
        MapDict,
        MapTuple,
        Rename,
        RenameKeys,
        SampleTypeError,
        Select,
        SelectFiles,
        Stage,
        ToTuple,
        apply_stages,
        default_collate,
        default_collation_fn,
        getfirst,
        list_collate,
    )

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "LogKeysRunner": "_runners",
    "MapRunner": "_runners",
    "RSampleRunner": "_runners",
    "ShuffleRunner": "_runners",
    "SliceRunner": "_runners",
    "apply_stages": "_stages",
    "BatchRunner": "_runners",
    "default_collate": "_stages",
    "default_collation_fn": "_stages",
    "empty_epoch_error": "_handling",
    "ExtractKeys": "_stages",
    "FieldError": "_stages",
    "getfirst": "_stages",
    "Handled": "_stages",
    "Handler": "_handling",
    "hide_positions": "_positions",
    "list_collate": "_stages",
    "Map": "_stages",
    "MapDict": "_stages",
    "MapTuple": "_stages",
    "OnEvent": "_handling",
    "Rename": "_stages",
    "RenameKeys": "_stages",
    "reraise_exception": "_handling",
    "SampleTypeError": "_stages",
    "Select": "_stages",
    "SelectFiles": "_stages",
    "Stage": "_stages",
    "ToTuple": "_stages",
    "UnbatchRunner": "_runners",
    "until_stop": "_handling",
}

__all__ = ["apply_stages", "BatchRunner", "default_collate", "default_collation_fn", "empty_epoch_error",
           "ExtractKeys", "FieldError", "getfirst", "Handled", "Handler", "hide_positions", "list_collate",
           "LogKeysRunner", "Map", "MapDict", "MapRunner", "MapTuple", "OnEvent", "Rename", "RenameKeys",
           "reraise_exception", "RSampleRunner", "SampleTypeError", "Select", "SelectFiles", "ShuffleRunner",
           "SliceRunner", "Stage", "ToTuple", "UnbatchRunner", "until_stop"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
