"""webdataset's ``extradatasets``: the module :mod:`resumewds.wds.extradatasets` under webdataset's name."""

import sys

from resumewds.wds import extradatasets  # (absolute: the same module under another package name too)

sys.modules[__name__] = extradatasets
