"""webdataset's ``mix``: the module :mod:`resumewds.wds.mix` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.mix")
