"""The WebDataset wing: webdataset 1.0.2's module names and semantics.

Each module here has the name of one of webdataset's and forwards to the one engine below it.
The core never imports this package (a test checks it); ``import resumewds.<name>`` works too.

Example:
    >>> import resumewds.filters, resumewds.wds.filters
    >>> resumewds.filters is resumewds.wds.filters
    True
"""

#: webdataset's module names that live in this wing (``resumewds.<name>`` is ``resumewds.wds.<name>``)
MODULES = ("compat", "extradatasets", "filters", "gopen", "handlers", "mix", "multi", "pipeline", "pytorch",
           "shardlists", "tariterators", "typecheck", "utils")

__all__ = ["MODULES"]
