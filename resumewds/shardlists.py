"""webdataset's ``shardlists``: the module :mod:`resumewds.wds.shardlists` under webdataset's name."""

import sys

from resumewds.wds import shardlists  # (absolute: the same module under another package name too)

sys.modules[__name__] = shardlists
