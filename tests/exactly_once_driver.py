"""A torchrun driver for tests/test_exactly_once_dist.py: ranks stay in lock step
when ``select`` and ``on_error="skip"`` empty a rank's share of a step.

Each rank builds a WebLoader with ``.select()`` dropping whole 4-sample
blocks of global positions (so some steps leave one rank with nothing) over
a manifest whose shard 2 was deleted after indexing (``on_error="skip"``),
all-reduces after every batch as DDP's gradient all-reduce would (with
different batch counts the job would hang or fail) and writes
``OUT/w<workers>.rank<r>.json``: per batch ``[epoch, n, empty, keys, pads]``.

    python -m torch.distributed.run --nproc_per_node=2 tests/exactly_once_driver.py DATA OUT
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resumewds as rw


def keep(sample) -> bool:
    return (int(sample["__index__"]) // 4) % 3 != 1


def collate(samples):
    return [s["__key__"] for s in samples]


def main() -> None:
    data, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    for workers in (0, 2):
        ds = rw.WebDataset(data, seed=1, shuffle=True, shuffle_window=2, on_error="skip").select(keep)
        loader = rw.WebLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate)
        rows = []
        for epoch in range(2):
            for batch in loader:
                empty = type(batch).__name__ == "EmptyBatch"
                info = getattr(loader, "batch_info", None)
                rows.append([epoch, len(batch), empty, list(batch),
                             list(info.pads) if info else [False] * len(batch)])
                n = torch.tensor([len(batch)], dtype=torch.int64)
                dist.all_reduce(n)
        stats = loader.stats()
        loader.close()
        with open(os.path.join(out, f"w{workers}.rank{rank}.json"), "w") as f:
            json.dump({"rows": rows, "empty_batches": stats.get("empty_batches"),
                       "skipped_samples": stats["skipped_samples"]}, f)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
