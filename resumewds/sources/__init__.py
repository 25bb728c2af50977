"""From what the user passes (paths, URLs, brace patterns, manifests, foreign indexes) to a
manifest: URL rules and security, indexing, whole-manifest passes.

Where things are (private modules; import from this package)::

    _urls.py      brace patterns, GOPEN_REWRITE, the security policy
    _check.py     local sources that cannot be shards, refused before any work
    _resolve.py   resolve_sources: what the user passes, as a Manifest
    _beside.py    a manifest.json found beside shards given by name
    _indexing.py  index_manifest / build_manifest, indexing under a handler
    _indexrun.py  resumewds index: parallel, resumable, its journal
    _digests.py   per-sample checksums over a whole manifest: bad_samples
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._beside import fill_from_beside
    from ._check import check_sources, warn_duplicate_content
    from ._digests import BadSample, add_sample_digests, bad_samples, check_results, echo_range_repairs
    from ._indexing import build_manifest, framed_prefix, index_manifest, index_skipping, salvage_shard
    from ._indexrun import default_jobs, run_index
    from ._resolve import Source, resolve_sources
    from ._urls import (
        EnforcedSecurityError,
        check_source_allowed,
        enforce_security,
        expand_braces,
        rewrite_url,
        watch_security_switch,
    )

# each name loads its module on first use (PEP 562)
_LAZY: _typing.Dict[str, str] = {
    "watch_security_switch": "_urls",
    "add_sample_digests": "_digests",
    "bad_samples": "_digests",
    "BadSample": "_digests",
    "build_manifest": "_indexing",
    "check_results": "_digests",
    "check_source_allowed": "_urls",
    "check_sources": "_check",
    "default_jobs": "_indexrun",
    "echo_range_repairs": "_digests",
    "enforce_security": "_urls",
    "EnforcedSecurityError": "_urls",
    "expand_braces": "_urls",
    "fill_from_beside": "_beside",
    "framed_prefix": "_indexing",
    "index_manifest": "_indexing",
    "index_skipping": "_indexing",
    "resolve_sources": "_resolve",
    "rewrite_url": "_urls",
    "run_index": "_indexrun",
    "salvage_shard": "_indexing",
    "Source": "_resolve",
    "warn_duplicate_content": "_check",
}

__all__ = ["add_sample_digests", "bad_samples", "BadSample", "build_manifest", "check_results",
           "check_source_allowed", "check_sources", "default_jobs", "echo_range_repairs", "enforce_security",
           "EnforcedSecurityError", "expand_braces", "fill_from_beside", "framed_prefix", "index_manifest",
           "index_skipping", "resolve_sources", "rewrite_url", "run_index", "salvage_shard", "Source",
           "warn_duplicate_content", "watch_security_switch"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
