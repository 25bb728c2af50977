"""webdataset's ``pipeline``: the module :mod:`resumewds.wds.pipeline` under webdataset's name."""

import sys

from resumewds.wds import pipeline  # (absolute: the same module under another package name too)

sys.modules[__name__] = pipeline
