"""Earlier releases' name of :mod:`resumewds.mixing`: ``from resumewds.mixdataset import ...`` keeps working."""

from resumewds.mixing import *  # noqa: F403
from resumewds.mixing import __all__  # noqa: F401
