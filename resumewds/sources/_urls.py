"""Shard URLs as users write them: brace patterns, rewrite rules and the security policy.

* :func:`rewrite_url` applies the ``GOPEN_REWRITE`` rules
  (``"prefix1=replacement1;prefix2=replacement2"``, or
  ``RESUMEWDS_GOPEN_REWRITE``; regular-expression prefixes, the first rule
  that changes the URL wins, as in webdataset).
* :data:`enforce_security` (``WDS_SECURE`` / ``RESUMEWDS_SECURE``): when on
  (:func:`secure`, read at each use), local, ``file:`` and ``pipe:`` sources,
  ``GOPEN_REWRITE`` and pickle-based members are refused.

Example:
    >>> expand_braces("{a,b}{1..2}")
    ['a1', 'a2', 'b1', 'b2']
"""

from __future__ import annotations

import re
import sys
from typing import List, Optional, Tuple

from .. import config
from ..errors import SourceError, UnsafeSourceError
from ..fetch import is_local_url

__all__ = ["EnforcedSecurityError", "check_source_allowed", "enforce_security", "expand_braces", "rewrite_url",
           "secure", "watch_security_switch"]

#: refuse local, ``file:`` and ``pipe:`` sources, URL rewriting and unpickling
enforce_security: bool = bool(config.value("secure"))
_switches: List[object] = []  # objects whose own ``enforce_security`` turns the policy on too


def watch_security_switch(holder: object) -> None:
    """Let ``holder.enforce_security`` turn the policy on too (read at each use): the
    wing's ``utils`` module, where webdataset's code sets it.

    Example:
        >>> class Switch: enforce_security = False
        >>> watch_security_switch(Switch); secure()
        False
        >>> Switch.enforce_security = True; secure()
        True
        >>> Switch.enforce_security = False; _switches.remove(Switch)
    """
    if not any(h is holder for h in _switches):
        _switches.append(holder)


def secure() -> bool:
    """Whether the security policy is on: :data:`enforce_security`, or a watched switch.

    Example:
        >>> secure()   # WDS_SECURE / RESUMEWDS_SECURE unset
        False
    """
    return bool(enforce_security) or any(bool(getattr(h, "enforce_security", False)) for h in _switches)

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


class EnforcedSecurityError(UnsafeSourceError, ValueError):
    """Refused because :data:`enforce_security` is set (:func:`secure`).  A
    ``ValueError`` too, with webdataset's message, as webdataset raises."""


def check_source_allowed(url: str) -> None:
    """Raise :class:`EnforcedSecurityError` if :data:`enforce_security` forbids opening
    ``url`` (a local path, ``file:`` URL or ``pipe:`` command).

    Example:
        >>> check_source_allowed("/data/shard-000000.tar")  # enforce_security is off
    """
    if not secure():
        return
    if url.startswith("pipe:"):
        raise EnforcedSecurityError(f"gopen_pipe: unsafe_gopen is False, cannot open pipe URLs: {url} "
                                    "(resumewds.utils.enforce_security / WDS_SECURE is set)")
    if url != "-" and is_local_url(url):  # "-" is stdin / stdout: allowed, as in webdataset
        raise EnforcedSecurityError(f"gopen: unsafe_gopen is False, cannot open local files: {url} "
                                    "(resumewds.utils.enforce_security / WDS_SECURE is set)")


def rewrite_url(url: str) -> str:
    """``url`` after the ``GOPEN_REWRITE`` rules (unchanged when none is set).

    Raises:
        EnforcedSecurityError: rules are set and :data:`enforce_security` is on.

    Example:
        >>> rewrite_url("http://example.com/a.tar")  # no GOPEN_REWRITE set
        'http://example.com/a.tar'
    """
    rules = config.value("gopen_rewrite")
    if not rules:
        return url
    if secure():
        raise EnforcedSecurityError(
            "rewrite_url: unsafe_gopen is False, cannot rewrite URLs using environment variables "
            f"(GOPEN_REWRITE is set; resumewds.utils.enforce_security is on): {url}")
    for rule in rules.split(";"):
        if not rule.strip():
            continue
        if "=" not in rule:
            raise ValueError(f"GOPEN_REWRITE: rule {rule!r} is not 'prefix=replacement'")
        k, v = rule.split("=", 1)
        new = re.sub("^" + k, v, url)
        if new != url:
            if config.value("log_opens"):
                print(f"[gopen] rewrite {url} -> {new}", file=sys.stderr, flush=True)
            return new
    return url


def _find_group(s: str) -> Optional[Tuple[int, int]]:
    depth = 0
    start = -1
    for i, c in enumerate(s):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                return start, i
    return None


def _split_top(body: str) -> List[str]:
    parts: List[str] = []
    cur: List[str] = []
    depth = 0
    for c in body:
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        cur.append(c)
    parts.append("".join(cur))
    return parts


def expand_braces(pattern: str) -> List[str]:
    """Expand shell-style brace patterns (numeric ranges keep zero padding).

    Raises:
        SourceError: an unbalanced or empty brace group.

    Example:
        >>> expand_braces("a-{1..3}.tar")
        ['a-1.tar', 'a-2.tar', 'a-3.tar']
    """
    if pattern.count("{") != pattern.count("}"):
        raise SourceError(f"{pattern}: unbalanced braces in shard pattern")
    g = _find_group(pattern)
    if g is None:
        return [pattern]
    a, b = g
    head, body, tail = pattern[:a], pattern[a + 1:b], pattern[b + 1:]
    m = _RANGE.match(body)
    if m:
        lo_s, hi_s = m.group(1), m.group(2)
        lo, hi = int(lo_s), int(hi_s)
        width = max(len(lo_s), len(hi_s)) if (lo_s.startswith("0") or hi_s.startswith("0")) else 0
        step = 1 if hi >= lo else -1
        alts = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    else:
        alts = _split_top(body)
        if len(alts) < 2:
            # "{x}" is not a group in the shell either; keep it literally
            return [head + "{" + x + "}" + t for x in expand_braces(body) for t in expand_braces(tail)]
    out: List[str] = []
    for alt in alts:
        out.extend(expand_braces(head + alt + tail))
    return out
