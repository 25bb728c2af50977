"""webdataset's ``tariterators``: the module :mod:`resumewds.wds.tariterators` under webdataset's name."""

import sys

from resumewds.wds import tariterators  # (absolute: the same module under another package name too)

sys.modules[__name__] = tariterators
