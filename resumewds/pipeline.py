"""webdataset's ``pipeline``: the module :mod:`resumewds.wds.pipeline` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.pipeline")
