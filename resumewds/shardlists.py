"""webdataset's ``shardlists``: the module :mod:`resumewds.wds.shardlists` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.shardlists")
