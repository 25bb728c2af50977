"""webdataset's ``pytorch``: the module :mod:`resumewds.wds.pytorch` under webdataset's name."""

import sys

from resumewds.wds import pytorch  # (absolute: the same module under another package name too)

sys.modules[__name__] = pytorch
