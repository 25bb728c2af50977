"""webdataset's ``mix``: the module :mod:`resumewds.wds.mix` under webdataset's name."""

import sys

from resumewds.wds import mix  # (absolute: the same module under another package name too)

sys.modules[__name__] = mix
