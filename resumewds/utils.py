"""webdataset's ``utils``: the module :mod:`resumewds.wds.utils` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.utils")
