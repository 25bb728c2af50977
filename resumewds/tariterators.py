"""webdataset's ``tariterators``: the module :mod:`resumewds.wds.tariterators` under webdataset's name."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("resumewds.wds.tariterators")
