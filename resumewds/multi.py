"""webdataset's ``multi``: the module :mod:`resumewds.wds.multi` under webdataset's name."""

import sys

from resumewds.wds import multi  # (absolute: the same module under another package name too)

sys.modules[__name__] = multi
