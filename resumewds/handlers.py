"""webdataset's ``handlers``: the module :mod:`resumewds.wds.handlers` under webdataset's name."""

import sys

from resumewds.wds import handlers  # (absolute: the same module under another package name too)

sys.modules[__name__] = handlers
