"""``file://`` urls and plain paths: copied into the partial file, from zero every attempt.

A missing or unreadable file is permanent; one shorter than ``expected_size``
is transient (it may still be being written).

Example:
    >>> TRANSPORT.name, TRANSPORT.resumable
    ('local', False)
"""

from __future__ import annotations

from ._attempt import _Attempt, _Pace
from ._partial import _ETAG_SUFFIX, _remove_quietly, _Sink, _size_of
from ._schemes import local_path
from ._transport import Transport


class LocalTransport(Transport):
    """A local file, read with ``readinto`` into the shared buffer."""

    name = "local"

    def attempt(self, state: _Attempt) -> None:
        src = local_path(state.url)
        pace = _Pace(state.url, state.config, state.budget, what="file")
        with open(src, "rb", buffering=0) as fin, _Sink(state, append=False) as sink:
            state._copy(fin.readinto, sink, pace)
        _remove_quietly(state.path + _ETAG_SUFFIX)
        state._check_expected(_size_of(state.path))


TRANSPORT = LocalTransport()
