"""webdataset's ``typecheck``: the module :mod:`resumewds.wds.typecheck` under webdataset's name."""

import sys

from resumewds.wds import typecheck  # (absolute: the same module under another package name too)

sys.modules[__name__] = typecheck
