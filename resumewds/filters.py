"""webdataset's ``filters``: the module :mod:`resumewds.wds.filters` under webdataset's name."""

import sys

from resumewds.wds import filters  # (absolute: the same module under another package name too)

sys.modules[__name__] = filters
