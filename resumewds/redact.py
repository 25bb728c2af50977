"""Credentials out of everything resumewds records or prints.

A URL is fetched as given, but what is recorded or printed (the journal,
``.meta`` files, error messages, log lines, status, the report) goes through
:func:`redact_url` or :func:`redact_text`: user info becomes ``***`` and a
secret parameter's value ``REDACTED``, as botocore and requests log them.
The cache is keyed by :func:`cache_key_url` (no user info, no signing
parameters), so a rotated signature finds the shard already cached.

Example:
    >>> redact_url("https://u:p@h/a.tar?X-Amz-Date=1&X-Amz-Signature=abc")
    'https://***@h/a.tar?X-Amz-Date=1&X-Amz-Signature=REDACTED'
    >>> cache_key_url("https://h/a.tar?versionId=3&X-Amz-Date=1&X-Amz-Signature=abc")
    'https://h/a.tar?versionId=3'
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import urllib.parse
from typing import List, Tuple

#: query parameters whose value is a secret (compared lower-case)
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature", "sig", "token",
    "access_token", "refresh_token", "id_token", "x-goog-signature", "x-goog-credential",
    "x-goog-security-token", "googleaccessid", "awsaccesskeyid", "password", "passwd", "secret",
    "client_secret", "api_key", "apikey", "x-api-key", "auth", "authorization", "x-ms-signature",
    "security-token",
})
#: parameters that change with every signature (dropped from the cache key, not redacted)
_SIGNING_PREFIXES = ("x-amz-", "x-goog-")
_SIGNING_PARAMS = frozenset({"expires"})
#: an Azure shared access signature's other fields (dropped from the key when ``sig`` is there)
_SAS_PARAMS = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd", "skoid", "sktid",
                         "skt", "ske", "sks", "skv", "ses"})
REDACTED = "REDACTED"

_NAMES = "|".join(sorted((re.escape(n) for n in SECRET_PARAMS), key=len, reverse=True))
# user info of any scheme://user[:pass]@host
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#'\"<>\\]+@")
# name=value after ?, & or ; (an HTML-escaped &amp; ends with ;), value up to a separator
_PARAM = re.compile(rf"(?i)([?&;]|%3F|%26)({_NAMES})(=|%3D)[^&#\s'\"<>\\]*")
_PARAM_ENCODED_VALUE = re.compile(r"(?i)^(.*?)(%26)")


def _param_sub(m: re.Match[str]) -> str:
    value_start = m.group(1) + m.group(2) + m.group(3)
    if m.group(3).upper() == "%3D":
        # inside a percent-encoded URL: the value ends at an encoded "&"
        rest = m.group(0)[len(value_start):]
        tail = _PARAM_ENCODED_VALUE.match(rest)
        return value_start + REDACTED + (rest[len(tail.group(1)):] if tail else "")
    return value_start + REDACTED


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced (see the module docstring).

    Example:
        >>> redact_text("GET /a.tar?sig=s3cret failed; see http://bob:pw@h/x")
        'GET /a.tar?sig=REDACTED failed; see http://***@h/x'
    """
    if not isinstance(text, str) or ("@" not in text and "=" not in text and "%3" not in text):
        return text
    text = _USERINFO.sub(r"\1***@", text)
    return _PARAM.sub(_param_sub, text)


@functools.lru_cache(maxsize=4096)
def redact_url(url: str) -> str:
    """``url`` as it may be recorded or printed: user info ``***``, secret
    query parameters ``REDACTED`` (idempotent; other URLs unchanged).

    Example:
        >>> redact_url("http://h/a.tar"), redact_url("http://h/a.tar?token=t")
        ('http://h/a.tar', 'http://h/a.tar?token=REDACTED')
    """
    return redact_text(url)


def _key_params(query: str) -> Tuple[List[str], bool]:
    parts = [p for p in re.split(r"[&;]", query) if p]
    names = [urllib.parse.unquote_plus(p.split("=", 1)[0]).lower() for p in parts]
    sas = "sig" in names
    kept = [p for p, n in zip(parts, names)
            if not (n in SECRET_PARAMS or n in _SIGNING_PARAMS or n.startswith(_SIGNING_PREFIXES)
                    or (sas and n in _SAS_PARAMS))]
    return kept, len(kept) != len(parts)


@functools.lru_cache(maxsize=4096)
def cache_key_url(url: str) -> str:
    """The URL that names a shard in the cache: ``url`` without user info
    and without the query parameters that sign it (unchanged when it has
    neither, so existing cache entries keep their names).

    Example:
        >>> cache_key_url("s3://b/k.tar"), cache_key_url("http://a:b@h/k.tar?sig=1&se=2&sv=3&x=4")
        ('s3://b/k.tar', 'http://h/k.tar?x=4')
    """
    if "@" not in url and "?" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return redact_url(url)
    if not parts.scheme or url.startswith("pipe:"):
        return redact_url(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    kept, dropped = _key_params(parts.query)
    if netloc == parts.netloc and not dropped:
        return url
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "&".join(kept), parts.fragment))


def scrub(exc: BaseException) -> BaseException:
    """``exc`` and every exception of its chain (causes, contexts, and exceptions
    held in their ``args``) with their messages redacted, in place; returns ``exc``.

    The package raises its own, redacted errors ``from`` the foreign exception it
    met (an urllib3 or botocore error whose message may quote a presigned URL);
    scrubbing that one too means no printed traceback shows a secret.

    Example:
        >>> str(scrub(OSError("GET http://h/a.tar?sig=s3cret failed")))
        'GET http://h/a.tar?sig=REDACTED failed'
    """
    seen = set()
    todo: List[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        with contextlib.suppress(Exception):  # an exception type that refuses new args: leave it
            args = tuple(redact_text(a) if isinstance(a, str) else a for a in e.args)
            if args != e.args:
                e.args = args
            for name in ("url", "filename", "msg", "reason"):
                v = getattr(e, name, None)
                if isinstance(v, str) and redact_text(v) != v:
                    setattr(e, name, redact_text(v))
        todo.extend(a for a in e.args if isinstance(a, BaseException))
        for nxt in (e.__cause__, e.__context__, getattr(e, "reason", None)):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return exc


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the message of every record it sees
    (installed on the ``resumewds`` loggers by this module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler to report
            return True
        red = redact_text(msg)
        if red is not msg and red != msg:
            record.msg, record.args = red, None
        return True


_FILTER = RedactingFilter()


def install_log_filter(*names: str) -> None:
    """Redact the records of the loggers ``names`` (default: ``resumewds``
    and ``resumewds.cache``); idempotent."""
    for name in names or ("resumewds", "resumewds.cache"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


install_log_filter()


__all__ = ["REDACTED", "RedactingFilter", "SECRET_PARAMS", "cache_key_url", "install_log_filter", "redact_text",
           "redact_url", "scrub"]
