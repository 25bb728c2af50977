"""What the shards are: the manifest format (versions 1 to 4), shard records, per-sample digests
and per-shard index files.

Where things are (private modules; import from this package)::

    _manifest.py       Manifest, ShardInfo, load_manifest: the versioned format
    _arrayfile.py      the binary side files: flat little-endian 8-byte arrays
    _sampledigests.py  per-sample checksums: arithmetic and format (version 3)
    _shardindex.py     version 4: one index file per shard, loaded lazily, checked
    _foreignindex.py   counts-only sources: a wids shard index, img2dataset stats
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:
    from ._arrayfile import ArrayFile
    from ._manifest import (
        COMPRESSED_SUFFIXES,
        LazyOffsets,
        Manifest,
        ShardInfo,
        concat,
        load_manifest,
        parse_manifest_bytes,
        shard_basename,
    )
    from ._sampledigests import (
        DigestsFile,
        LazyDigests,
        decode_inline,
        encode_inline,
        file_sample_digests,
        sample_digests,
    )
    from ._shardindex import (
        Counted,
        IndexDigests,
        IndexOffsets,
        IndexRef,
        IndexSet,
        RecordBook,
        index_bytes,
        scan_to_index,
        write_index,
    )

# each name loads its module on first use (PEP 562)
_LAZY: _typing.Dict[str, str] = {
    "ArrayFile": "_arrayfile",
    "COMPRESSED_SUFFIXES": "_manifest",
    "concat": "_manifest",
    "Counted": "_shardindex",
    "decode_inline": "_sampledigests",
    "DigestsFile": "_sampledigests",
    "encode_inline": "_sampledigests",
    "file_sample_digests": "_sampledigests",
    "index_bytes": "_shardindex",
    "IndexDigests": "_shardindex",
    "IndexOffsets": "_shardindex",
    "IndexRef": "_shardindex",
    "IndexSet": "_shardindex",
    "LazyDigests": "_sampledigests",
    "LazyOffsets": "_manifest",
    "load_manifest": "_manifest",
    "Manifest": "_manifest",
    "parse_manifest_bytes": "_manifest",
    "RecordBook": "_shardindex",
    "sample_digests": "_sampledigests",
    "scan_to_index": "_shardindex",
    "shard_basename": "_manifest",
    "ShardInfo": "_manifest",
    "write_index": "_shardindex",
}

__all__ = ["ArrayFile", "COMPRESSED_SUFFIXES", "concat", "Counted", "decode_inline", "DigestsFile",
           "encode_inline", "file_sample_digests", "index_bytes", "IndexDigests", "IndexOffsets",
           "IndexRef", "IndexSet", "LazyDigests", "LazyOffsets", "load_manifest", "Manifest",
           "parse_manifest_bytes", "RecordBook", "sample_digests", "scan_to_index", "shard_basename",
           "ShardInfo", "write_index"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
