"""Every setting read from the environment, in one place, with one precedence.

Later wins: the default below; the environment (``RESUMEWDS_*``, else its
webdataset alias); an explicit argument (a keyword, a CLI flag).  An empty
variable counts as unset; every value is validated, with an error naming the
variable or argument.  Nothing else in resumewds reads ``RESUMEWDS_*``.

============================== ============================= ================= =========================================
Variable                       webdataset alias              Default           Meaning
============================== ============================= ================= =========================================
RESUMEWDS_CACHE_DIR            WDS_CACHE                     $XDG_CACHE_HOME/  shard cache directory
                                                             resumewds
RESUMEWDS_CACHE_SIZE           WDS_CACHE_SIZE                unlimited         cache budget: bytes or "20GB", "500MiB"
RESUMEWDS_CACHE_SYNC                                         auto              auto, fsync or boot (see resumewds.cache)
RESUMEWDS_VERBOSE_CACHE        WDS_VERBOSE_CACHE             0                 1: one stderr line per download/eviction
RESUMEWDS_VERBOSE                                            0                 1/info: log fetches, retries, repairs;
                                                                               2/debug: everything
RESUMEWDS_SEED                 WDS_SEED                      0                 default seed of the order
RESUMEWDS_GOPEN_VERBOSE        GOPEN_VERBOSE                 0                 1: one stderr line per source opened and
                                                                               closed, with url and byte count
RESUMEWDS_GOPEN_REWRITE        GOPEN_REWRITE                 unset             "prefix=replacement;..." URL rewrites of
                                                                               resumewds.gopen (refused if WDS_SECURE)
RESUMEWDS_FETCH_ATTEMPTS                                     8                 attempts per shard and read (>= 1)
RESUMEWDS_FETCH_DEADLINE                                     600               seconds per shard and read, all attempts
                                                                               and waits included
RESUMEWDS_FETCH_CONNECT_TIMEOUT                              10                seconds to connect
RESUMEWDS_FETCH_READ_TIMEOUT                                 30                seconds between two reads of a body (or a
                                                                               pipe: command's output)
RESUMEWDS_FETCH_MIN_RATE                                     1024              bytes/s a body must keep up over
                                                                               RATE_WINDOW (0: no minimum)
RESUMEWDS_FETCH_RATE_WINDOW                                  30                seconds over which MIN_RATE is measured
RESUMEWDS_FETCH_BACKOFF_INITIAL                              0.5               first wait between attempts (seconds)
RESUMEWDS_FETCH_BACKOFF_MAX                                  30                longest wait between attempts (seconds)
RESUMEWDS_FETCH_MAX_REDIRECTS                                10                redirects before a URL fails (permanent)
RESUMEWDS_MANIFEST_MAX_BYTES                                 256MiB            largest remote manifest accepted
RESUMEWDS_ALLOW_REMOTE_LOCAL                                 0                 1: a manifest fetched over the network
                                                                               may name local files (absolute paths,
                                                                               file://)
RESUMEWDS_DEBUG                                              0                 1: the CLI shows tracebacks instead of
                                                                               one-line errors
RESUMEWDS_ALLOW_OBSOLETE       ALLOW_OBSOLETE                0                 1: let utils.obsolete functions run
RESUMEWDS_SECURE               WDS_SECURE                    0                 1: refuse pickle-based members (pkl, pyd,
                                                                               pth) even with allow_pickle=True, and
                                                                               local or pipe: sources (as webdataset)
RESUMEWDS_PYTORCH_WEIGHTS_ONLY WDS_PYTORCH_WEIGHTS_ONLY      0                 1: torch.load of .pth members with
                                                                               weights_only=True (webdataset's
                                                                               torch_loads)
RESUMEWDS_SHOW_SEED            WDS_SHOW_SEED                 0                 1: ResampledShards prints each epoch's
                                                                               seed (as webdataset)
RESUMEWDS_S3_ENDPOINT_URL      AWS_ENDPOINT_URL_S3,          boto3's           s3:// endpoint (MinIO, R2, GCS interop)
                               AWS_ENDPOINT_URL
RESUMEWDS_S3_ADDRESSING_STYLE                                auto              s3:// addressing: auto, path or virtual
RESUMEWDS_S3_ANONYMOUS                                       0                 1: unsigned s3:// requests (public
                                                                               buckets)
RESUMEWDS_WORKER_STALL                                       60                seconds a DataLoader worker may stay
                                                                               stopped (SIGSTOP) while the loader waits
                                                                               for it (0: no limit; resumewds.run)
============================== ============================= ================= =========================================

For ``s3://``, :func:`s3_settings` also reads the standard AWS variables.

Example:
    >>> parse_size("1.5GiB"), parse_size("20GB"), parse_size(512)
    (1610612736, 20000000000, 512)
    >>> import os
    >>> os.environ["RESUMEWDS_FETCH_ATTEMPTS"] = "3"
    >>> fetch_settings()["attempts"], fetch_settings(attempts=5)["attempts"]
    (3, 5)
    >>> del os.environ["RESUMEWDS_FETCH_ATTEMPTS"]
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

_UNITS = {"": 1, "b": 1,
          "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4, "p": 1024 ** 5,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4, "pib": 1024 ** 5,
          "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4, "pb": 1000 ** 5}


def parse_size(s: Union[int, float, str]) -> int:
    """Parse a byte count: ``1234``, ``"500MiB"``, ``"20GB"``, ``"1.5G"``.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` and ``K/M/G/T`` powers of 1024.

    Example:
        >>> parse_size("500MiB"), parse_size("1.5G"), parse_size("2kb")
        (524288000, 1610612736, 2000)
    """
    if isinstance(s, bool):
        raise ValueError(f"not a size: {s!r}")
    if isinstance(s, (int, float)):
        if s < 0 or s != s:
            raise ValueError(f"size must be >= 0, got {s}")
        return int(s)
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$", str(s))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {s!r} (examples: 1048576, 500MiB, 20GB, 1.5G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on", "y"):
        return True
    if v in ("0", "false", "no", "off", "n"):
        return False
    raise ValueError("not a boolean (use 1 or 0)")


def _int(raw: str) -> int:
    return int(raw.strip())


def _float(raw: str) -> float:
    v = float(raw.strip())
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return v


def _positive(v: float) -> Optional[str]:
    return None if v > 0 else "must be > 0"


def _non_negative(v: float) -> Optional[str]:
    return None if v >= 0 else "must be >= 0"


def _at_least_one(v: int) -> Optional[str]:
    return None if v >= 1 else "must be >= 1"


@dataclass(frozen=True)
class Var:
    """One environment variable: its alias, parser, check and default."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    alias: Optional[str] = None
    check: Optional[Callable[[Any], Optional[str]]] = None


#: the addressing styles of an S3 client
S3_ADDRESSING = ("auto", "path", "virtual")

#: FetchConfig field -> variable
FETCH_VARS: Dict[str, Var] = {
    "attempts": Var("RESUMEWDS_FETCH_ATTEMPTS", _int, 8, check=_at_least_one),
    "deadline": Var("RESUMEWDS_FETCH_DEADLINE", _float, 600.0, check=_positive),
    "connect_timeout": Var("RESUMEWDS_FETCH_CONNECT_TIMEOUT", _float, 10.0, check=_positive),
    "read_timeout": Var("RESUMEWDS_FETCH_READ_TIMEOUT", _float, 30.0, check=_positive),
    "min_rate": Var("RESUMEWDS_FETCH_MIN_RATE", _float, 1024.0, check=_non_negative),
    "rate_window": Var("RESUMEWDS_FETCH_RATE_WINDOW", _float, 30.0, check=_positive),
    "backoff_initial": Var("RESUMEWDS_FETCH_BACKOFF_INITIAL", _float, 0.5, check=_non_negative),
    "backoff_max": Var("RESUMEWDS_FETCH_BACKOFF_MAX", _float, 30.0, check=_non_negative),
    "max_redirects": Var("RESUMEWDS_FETCH_MAX_REDIRECTS", _int, 10, check=_non_negative),
    "log_opens": Var("RESUMEWDS_GOPEN_VERBOSE", _bool, False, alias="GOPEN_VERBOSE"),
}

#: every other variable, by setting name
VARS: Dict[str, Var] = {
    "cache_dir": Var("RESUMEWDS_CACHE_DIR", str, None, alias="WDS_CACHE"),
    "cache_size": Var("RESUMEWDS_CACHE_SIZE", parse_size, None, alias="WDS_CACHE_SIZE"),
    "cache_sync": Var("RESUMEWDS_CACHE_SYNC", str, "auto",
                      check=lambda v: None if v in ("auto", "fsync", "boot") else "must be auto, fsync or boot"),
    "verbose_cache": Var("RESUMEWDS_VERBOSE_CACHE", _bool, False, alias="WDS_VERBOSE_CACHE"),
    "verbose": Var("RESUMEWDS_VERBOSE", str, "",
                   check=lambda v: None if v.strip().lower() in ("", "0", "1", "2", "true", "yes", "info",
                                                                  "debug", "false", "no")
                   else "must be 0, 1 (info) or 2 (debug)"),
    "seed": Var("RESUMEWDS_SEED", _int, 0, alias="WDS_SEED"),
    "manifest_max_bytes": Var("RESUMEWDS_MANIFEST_MAX_BYTES", parse_size, 256 << 20, check=_at_least_one),
    "allow_remote_local": Var("RESUMEWDS_ALLOW_REMOTE_LOCAL", _bool, False),
    "debug": Var("RESUMEWDS_DEBUG", _bool, False),
    "allow_obsolete": Var("RESUMEWDS_ALLOW_OBSOLETE", _bool, False, alias="ALLOW_OBSOLETE"),
    "gopen_rewrite": Var("RESUMEWDS_GOPEN_REWRITE", str, None, alias="GOPEN_REWRITE"),
    # webdataset's own switches for pickle-based members (resumewds.utils, resumewds.autodecode)
    "secure": Var("RESUMEWDS_SECURE", _bool, False, alias="WDS_SECURE"),
    "pytorch_weights_only": Var("RESUMEWDS_PYTORCH_WEIGHTS_ONLY", _bool, False, alias="WDS_PYTORCH_WEIGHTS_ONLY"),
    "show_seed": Var("RESUMEWDS_SHOW_SEED", _bool, False, alias="WDS_SHOW_SEED"),
    "s3_endpoint_url": Var("RESUMEWDS_S3_ENDPOINT_URL", lambda r: r.strip(), None),
    "s3_addressing_style": Var("RESUMEWDS_S3_ADDRESSING_STYLE", lambda r: r.strip().lower(), "auto",
                               check=lambda v: None if v in S3_ADDRESSING else "must be auto, path or virtual"),
    "s3_anonymous": Var("RESUMEWDS_S3_ANONYMOUS", _bool, False),
    # a stopped DataLoader worker (resumewds.run)
    "worker_stall": Var("RESUMEWDS_WORKER_STALL", _float, 60.0, check=_non_negative),
}


def _raw(var: Var) -> Tuple[Optional[str], Optional[str]]:
    """``(raw value, variable it came from)``; ours first, then the alias."""
    for name in (var.name, var.alias):
        if name:
            raw = os.environ.get(name)
            if raw is not None and raw.strip() != "":
                return raw, name
    return None, None


def _validate(var: Var, value: Any, where: str) -> Any:
    if var.check is not None and value is not None:
        problem = var.check(value)
        if problem:
            raise ValueError(f"{where}={value!r}: {problem}")
    return value


def value(setting: str, explicit: Any = None) -> Any:
    """One setting: ``explicit`` if not None, else the environment, else the default.

    Raises:
        ValueError: the value is not valid (naming the variable or argument).

    Example:
        >>> value("seed", 7)
        7
    """
    var = VARS.get(setting) or FETCH_VARS[setting]
    if explicit is not None:
        return _validate(var, explicit, setting)
    raw, name = _raw(var)
    if raw is None:
        return var.default
    try:
        parsed = var.parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not valid: {exc}") from None
    return _validate(var, parsed, str(name))


def fetch_settings(**explicit: Any) -> Dict[str, Any]:
    """FetchConfig fields: defaults, then ``RESUMEWDS_FETCH_*``, then ``explicit``.

    Other ``explicit`` keywords (``sleep``, ``chunk_size``) pass through.
    """
    out = {field: value(field, explicit.get(field)) for field in FETCH_VARS}
    out.update({k: v for k, v in explicit.items() if k not in FETCH_VARS})
    return out


def cache_dir(explicit: Optional[str] = None) -> str:
    """The cache directory: ``explicit``, ``$RESUMEWDS_CACHE_DIR``, ``$WDS_CACHE``,
    ``$XDG_CACHE_HOME/resumewds`` or ``~/.cache/resumewds``."""
    d = value("cache_dir", explicit or None)
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "resumewds")


def _explicit_size(explicit: Union[int, str, None], name: str) -> Optional[int]:
    if explicit is None:
        return None
    try:
        return parse_size(explicit)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def cache_size(explicit: Union[int, str, None] = None) -> Optional[int]:
    """The cache budget in bytes, or None for unlimited."""
    size = _explicit_size(explicit, "cache_size")
    return value("cache_size") if size is None else size


def cache_sync(explicit: Optional[str] = None) -> str:
    """``auto``, ``fsync`` or ``boot``."""
    return value("cache_sync", explicit or None)


def verbose_cache(explicit: Optional[bool] = None) -> bool:
    """Whether the cache prints one stderr line per download and eviction."""
    return bool(value("verbose_cache", explicit))


def verbose_level(explicit: bool = False) -> int:
    """0 (quiet), 1 (info) or 2 (debug): ``explicit`` True means at least 1."""
    v = str(value("verbose")).strip().lower()
    level = 2 if v in ("2", "debug") else 1 if v in ("1", "true", "yes", "info") else 0
    return max(level, 1 if explicit else 0)


def seed(explicit: Optional[int] = None) -> int:
    """The default seed of the order (``RESUMEWDS_SEED``, ``WDS_SEED``)."""
    return int(value("seed", explicit))


def manifest_max_bytes(explicit: Union[int, str, None] = None) -> int:
    """The largest remote manifest accepted, in bytes (``explicit``: bytes or ``"1GiB"``)."""
    return int(value("manifest_max_bytes", _explicit_size(explicit, "manifest_max_bytes")))


def allow_remote_local(explicit: Optional[bool] = None) -> bool:
    """Whether a remote manifest may name local files."""
    return bool(value("allow_remote_local", explicit))


def _env(name: str) -> Optional[str]:
    raw = os.environ.get(name)
    return raw.strip() if raw is not None and raw.strip() != "" else None


def s3_settings() -> Dict[str, Any]:
    """The :class:`resumewds.fetch._s3.S3Options` fields the environment gives.

    ``endpoint_url``: ``RESUMEWDS_S3_ENDPOINT_URL``, else (unless
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true) ``AWS_ENDPOINT_URL_S3``,
    else ``AWS_ENDPOINT_URL``; ``region``: ``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``; ``profile``: ``AWS_PROFILE``.  Credentials are
    boto3's standard chain.

    Example:
        >>> sorted(s3_settings())
        ['addressing_style', 'anonymous', 'endpoint_url', 'profile', 'region']
    """
    endpoint = value("s3_endpoint_url") or None
    if endpoint is None and (_env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").lower() not in ("1", "true"):
        endpoint = _env("AWS_ENDPOINT_URL_S3") or _env("AWS_ENDPOINT_URL")
    return {
        "endpoint_url": endpoint,
        "region": _env("AWS_REGION") or _env("AWS_DEFAULT_REGION"),
        "profile": _env("AWS_PROFILE"),
        "addressing_style": value("s3_addressing_style"),
        "anonymous": bool(value("s3_anonymous")),
    }


def all_variables() -> Dict[str, Var]:
    """Every variable this module reads, by variable name (for docs and tests)."""
    return {v.name: v for v in [*FETCH_VARS.values(), *VARS.values()]}


__all__ = ["FETCH_VARS", "S3_ADDRESSING", "VARS", "Var", "all_variables", "allow_remote_local", "cache_dir",
           "cache_size", "cache_sync", "fetch_settings", "manifest_max_bytes", "parse_size", "s3_settings", "seed",
           "value", "verbose_cache", "verbose_level"]
