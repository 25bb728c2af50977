"""webdataset's ``handlers``: the module :mod:`resumewds.wds.handlers` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.handlers")
