"""The WebDataset wing: webdataset 1.0.2's module names and semantics.

Each module here has the name of one of webdataset's (``filters``,
``shardlists``, ``tariterators``, ``gopen``, ``utils``, ``handlers``,
``splitters``, ``mix``, ``compat``, ``pipeline``, ``extradatasets``,
``pytorch``, ``typecheck``...) and forwards to the one
engine below it: the stage callables (:mod:`resumewds.stages`), the stream
runners (:mod:`resumewds.stages`), the plan, the cache and the step engine.
The core never imports this package (a test checks it); ``import resumewds
as wds`` reaches every module here as ``wds.<name>``, and ``import
resumewds.<name>`` works too, as with webdataset.

Example:
    >>> import resumewds.filters, resumewds.wds.filters
    >>> resumewds.filters is resumewds.wds.filters
    True
"""

#: webdataset's module names that live in this wing (``resumewds.<name>`` is ``resumewds.wds.<name>``)
MODULES = ("compat", "extradatasets", "filters", "gopen", "handlers", "mix", "multi", "pipeline", "pytorch",
           "shardlists", "tariterators", "typecheck", "utils")

__all__ = ["MODULES"]
