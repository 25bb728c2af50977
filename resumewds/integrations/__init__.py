"""Exact resume of a :class:`resumewds.WebLoader` inside training frameworks.

One module per framework, none imported by ``import resumewds`` (or by this package):
``lightning`` (``ResumeWDSCallback``), ``accelerate`` (``prepare_loader``), ``transformers``
(``attach``) and ``stateful`` (torchdata's ``StatefulDataLoader``).  What is exact, and what to do
when the world size changes: docs/FRAMEWORKS.md.
"""

from __future__ import annotations

from ._common import resumewds_loaders

__all__ = ["resumewds_loaders"]
