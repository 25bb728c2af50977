"""webdataset's ``multi``: the module :mod:`resumewds.wds.multi` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.multi")
