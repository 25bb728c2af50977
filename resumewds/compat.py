"""webdataset's ``compat``: the module :mod:`resumewds.wds.compat` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.compat")
