"""webdataset's WebLoader fluent methods, with exact semantics.

webdataset's training examples re-mix samples across DataLoader workers::

    loader = wds.WebLoader(ds, batch_size=None, num_workers=N)
    loader = loader.unbatched().shuffle(1000).batched(64).with_epoch(k)

Each worker of a webdataset loader reads its own shards, so without the
re-mixing a batch holds samples of one worker's shards.  A resumewds loader
already hands out one global sequence (every batch is the next
``batch_size`` positions of the plan, whichever worker built it), so the
chain compiles into the loader's own settings and stays exactly resumable:

* ``.unbatched()``: the loader yields single samples (``batch_size=None``);
  a dataset ``.batched(b)`` without stages after it is undone (its batches
  were the consecutive positions anyway).
* ``.shuffle(n)``: the dataset's ``.shuffle(n)``: samples are shuffled within
  windows of whole shards holding about ``3n`` samples, in the plan, so a
  resume recomputes the order (no buffer to lose).
* ``.batched(m, collation_fn=, partial=)``: batches of ``m`` consecutive
  positions of that order (webdataset's default collation; ``partial=False``
  is the loader's ``remainder="drop"``).
* ``.with_epoch(k)``: each ``iter()`` yields ``k`` batches, continuing the
  stream over the loader's epochs; ``.repeat(n)``: ``n`` loader epochs per
  ``iter()``.

``state_dict()`` is the compiled loader's state plus the count of batches
served in the current ``with_epoch`` chunk; ``commit(step)`` and the journal
work as on the loader.

Example:
    >>> chain = (WebLoader(ds, batch_size=None, num_workers=2)   # doctest: +SKIP
    ...          .unbatched().shuffle(1000).batched(64).with_epoch(100))
    >>> for batch in chain: ...                                    # doctest: +SKIP
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterator, List, Optional

from .pipeline import default_collation_fn

_MISSING: Any = object()


class LoaderPipeline:
    """A WebLoader with webdataset's fluent re-mixing chain compiled in (see module docs)."""

    def __init__(self, base: Any):
        self._base = base
        self._unbatched = False
        self._shuffle = 0
        self._batch: Optional[Dict[str, Any]] = None
        self._limit = -1
        self._nepochs = 1
        self._served = 0
        self._length: Optional[int] = None
        self._built: Any = None

    def _with(self, **kw: Any) -> LoaderPipeline:
        if self._built is not None:
            raise ValueError("add the WebLoader's fluent stages before iterating it")
        out = copy.copy(self)
        for k, v in kw.items():
            setattr(out, k, v)
        return out

    # ---- the fluent methods ---------------------------------------------------
    def unbatched(self) -> LoaderPipeline:
        """Yield single samples (see module docs)."""
        return self._with(_unbatched=True, _batch=None)

    def shuffle(self, size: int, **kw: Any) -> LoaderPipeline:
        """Shuffle within windows of about ``3 * size`` samples, in the plan (see module docs)."""
        return self._with(_shuffle=max(self._shuffle, int(size))) if size >= 1 else self

    def batched(self, batchsize: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                partial: bool = True) -> LoaderPipeline:
        """Batches of ``batchsize`` consecutive positions (see module docs)."""
        if batchsize < 1:
            raise ValueError(f"batch_size must be >= 1, got {batchsize}")
        return self._with(_batch={"n": int(batchsize), "collation_fn": collation_fn,
                                  "partial": bool(partial)})

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, continuing over epochs."""
        return self._with(_limit=int(max(nsamples, nbatches)), _nepochs=-1)

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """``nepochs`` loader epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items."""
        return self._with(_nepochs=int(nepochs) if nepochs > 0 else -1, _limit=int(nbatches))

    def with_length(self, n: int, silent: bool = False) -> LoaderPipeline:
        """Give the chain a ``__len__`` (it does not change an epoch)."""
        return self._with(_length=int(n))

    # ---- the compiled loader ----------------------------------------------------
    @property
    def loader(self) -> Any:
        """The WebLoader the chain compiles into (built on first use)."""
        if self._built is None:
            self._built = self._build()
        return self._built

    def _build(self) -> Any:
        from .loader import WebLoader

        base = self._base
        if not (self._unbatched or self._shuffle or self._batch):
            return base
        ds = base.dataset
        if ds.batch_size is not None:
            if ds._spec[ds._stream_from + 1:]:
                raise ValueError("WebLoader(...).unbatched(): the dataset has stages after .batched(); "
                                 "re-mixing needs its batches to be plain consecutive samples")
            ds = type(ds)._with_stages(ds)
            ds._spec = ds._spec[:ds._stream_from]
            ds.collate_fn = None
            ds._compile()
        if self._shuffle:
            ds = ds.shuffle(self._shuffle)
        if self._batch is not None:
            bs: Optional[int] = self._batch["n"]
            collate = self._batch["collation_fn"] or list
            remainder = base.remainder if self._batch["partial"] else "drop"
        elif self._unbatched:
            bs, collate, remainder = None, None, base.remainder
        else:
            bs, collate, remainder = base.batch_size, base._collate_fn, base.remainder
        new = WebLoader(ds, batch_size=bs, num_workers=base.num_workers, collate_fn=collate,
                        rank=base.rank, world_size=base.world_size, remainder=remainder,
                        chunk_size=base.layout.batch_size, transport=base.transport,
                        stall_timeout=base.stall_timeout, **base.dataloader_kwargs)
        # the base loader's resume point and journal carry over (positions are samples)
        new.epoch, new.position = base.epoch, base.position
        new.steps_done, new.samples_total = base.steps_done, base.samples_total
        new.journal, new.journal_path = base.journal, base.journal_path
        base.journal = None
        return new

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader
        served, self._served = self._served, 0
        epochs = 0
        while self._limit < 1 or served < self._limit:
            if self._nepochs > 0 and epochs >= self._nepochs:
                break
            got = 0
            start_epoch = loader.epoch
            for item in loader:
                got += 1
                served += 1
                self._served = served
                yield item
                if 0 < self._limit <= served:
                    self._served = 0
                    return
            if loader.epoch != start_epoch:
                epochs += 1
            if got == 0 and self._nepochs < 0:
                break  # an empty data set: never loop forever
        self._served = 0

    def __len__(self) -> int:
        if self._length is not None:
            return self._length
        if self._limit > 0:
            return self._limit
        return len(self.loader)

    # ---- state, journal, stats: the compiled loader's --------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The compiled loader's state, plus ``chain_served`` (items of the current ``with_epoch``)."""
        sd = self.loader.state_dict()
        sd["chain_served"] = self._served
        return sd

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue exactly after ``state`` (see :meth:`WebLoader.load_state_dict`)."""
        self.loader.load_state_dict(state)
        self._served = int(state.get("chain_served", 0))

    get_state = state_dict
    set_state = load_state_dict

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def close(self) -> None:
        """Close the compiled loader (and its journal)."""
        self.loader.close()
        if self._built is not None and self._built is not self._base:
            self._base.close()

    def __enter__(self) -> LoaderPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
