"""webdataset's ``utils``: the module :mod:`resumewds.wds.utils` under webdataset's name."""

import sys

from resumewds.wds import utils  # (absolute: the same module under another package name too)

sys.modules[__name__] = utils
