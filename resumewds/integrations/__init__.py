"""Exact resume of a :class:`resumewds.WebLoader` inside training frameworks.

One module per framework; importing ``resumewds`` (or this package) imports
none of them, so each framework is needed only by the module that serves it:

* :mod:`resumewds.integrations.lightning`: ``ResumeWDSCallback`` for PyTorch
  Lightning's ``Trainer.fit(ckpt_path=...)``.
* :mod:`resumewds.integrations.accelerate`: ``prepare_loader`` for Hugging
  Face Accelerate's ``save_state`` / ``load_state``.
* :mod:`resumewds.integrations.transformers`: ``attach`` for
  ``transformers.Trainer.train(resume_from_checkpoint=...)``.
* :mod:`resumewds.integrations.stateful`: ``load_state_dict`` for torchdata's
  ``StatefulDataLoader`` (a clear error for a state of another ``num_workers``).

What is exact, and what to do when the world size changes: docs/FRAMEWORKS.md.
"""

from __future__ import annotations

from ._common import resumewds_loaders

__all__ = ["resumewds_loaders"]
