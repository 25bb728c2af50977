"""``s3://bucket/key``: the import path of earlier versions for :mod:`resumewds.fetch.s3`.

The s3 transport is one entry of the fetch package's registry
(:data:`resumewds.fetch.transport.TRANSPORTS`); this module re-exports its
names.  Importing it does not import boto3 (that happens at the first s3
fetch).

Example:
    >>> parse_s3_url("s3://bucket/data/shard-000.tar")
    ('bucket', 'data/shard-000.tar')
    >>> S3Options(endpoint_url="http://127.0.0.1:9000").addressing_style
    'auto'
"""

from __future__ import annotations

from .fetch.s3 import _HINTS as _HINTS
from .fetch.s3 import (
    PERMANENT_CODES,
    TRANSIENT_CODES,
    S3Options,
    client_for,
    parse_s3_url,
    resolve_options,
    s3_fetch_bytes,
    s3_fetch_to_file,
    scheme_hint,
    translate_s3_error,
)
from .fetch.s3 import S3_ERRORS as S3_ERRORS
from .fetch.s3 import TRANSPORT as TRANSPORT
from .fetch.s3 import S3Transport as S3Transport
from .fetch.s3 import _client_error_parts as _client_error_parts
from .fetch.s3 import _import_boto as _import_boto
from .fetch.s3 import _near_deadline as _near_deadline

__all__ = [
    "PERMANENT_CODES",
    "S3Options",
    "TRANSIENT_CODES",
    "client_for",
    "parse_s3_url",
    "resolve_options",
    "s3_fetch_bytes",
    "s3_fetch_to_file",
    "scheme_hint",
    "translate_s3_error",
]
