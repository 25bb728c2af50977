"""webdataset's ``filters``: the module :mod:`resumewds.wds.filters` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.filters")
