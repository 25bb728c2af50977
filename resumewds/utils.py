"""Settings shared with webdataset's ``wds.utils`` module.

``enforce_security`` has webdataset 1.0.2's meaning and default (the
``WDS_SECURE`` environment variable, ``"0"`` unless set): when True, decoders
refuse every pickle-based member (``pkl``, ``pickle``, ``pyd``, ``pth``)
even with ``allow_pickle=True``.  It is read at each decode, so setting
``resumewds.utils.enforce_security = True`` at run time works as it does in
webdataset.

Example:
    >>> import resumewds.utils
    >>> isinstance(resumewds.utils.enforce_security, bool)
    True
"""

from __future__ import annotations

from . import config

enforce_security: bool = bool(config.value("secure"))
