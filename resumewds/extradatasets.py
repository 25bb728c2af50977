"""webdataset's ``extradatasets``: the module :mod:`resumewds.wds.extradatasets` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.extradatasets")
