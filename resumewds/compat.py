"""webdataset's ``compat``: the module :mod:`resumewds.wds.compat` under webdataset's name."""

import sys

from resumewds.wds import compat  # (absolute: the same module under another package name too)

sys.modules[__name__] = compat
