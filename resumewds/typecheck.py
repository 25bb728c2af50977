"""webdataset's ``typecheck``: the module :mod:`resumewds.wds.typecheck` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.typecheck")
