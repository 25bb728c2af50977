"""webdataset's ``pytorch``: the module :mod:`resumewds.wds.pytorch` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.pytorch")
