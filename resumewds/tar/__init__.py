"""Tar shards: strict framing, one sample read by its byte range, whole archives walked once,
compressed shards.

Where things are (private modules; import from this package)::

    _frame.py       strict tar framing: checked headers, members (ustar, GNU, pax), WebDataset's grouping into samples
    _scan.py        whole archives walked once: a shard's index, or all its samples in order
    _io.py          one sample read by its byte range (pread, fast parse, member patterns), sample_digest
    _decompress.py  gzip / zstd codecs by magic bytes, whole-file decompression
    _compressed.py  .tar.gz / .tar.zst shards: decompressed once into the cache, salvage
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._compressed import open_view, salvage_compressed
    from ._decompress import kind_of
    from ._frame import split_key
    from ._io import iter_samples_file, parse_sample, read_sample, sample_digest
    from ._scan import scan_file

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "iter_samples_file": "_io",
    "kind_of": "_decompress",
    "open_view": "_compressed",
    "parse_sample": "_io",
    "read_sample": "_io",
    "salvage_compressed": "_compressed",
    "sample_digest": "_io",
    "scan_file": "_scan",
    "split_key": "_frame",
}

__all__ = ["iter_samples_file", "kind_of", "open_view", "parse_sample", "read_sample", "salvage_compressed",
           "sample_digest", "scan_file", "split_key"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
