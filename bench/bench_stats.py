"""What stats collection costs.

1. A/B: ``rw.WebLoader(batch_size=64, num_workers=0)`` and
   ``rw.WebLoader(batch_size=None, num_workers=0)`` loops with stats on, vs
   the same loops with ``Stats.update`` (and ``Stats.observe_queue``, where
   the loader has it) monkeypatched to a no-op (within this process only).
   Target: cost <= 1% (ratio >= 0.99), best of interleaved repeats; medians
   and CPU time per sample are reported too.  A 1% effect is close to this machine's noise floor, so:
2. direct: ``Stats.update`` timed on the real ``meta`` dicts the loop
   produced, times the number of batches, as a fraction of the loop's time.
   Target <= 1%.  Also, for information, the per-sample instrumentation in
   ``WebDataset.iter_steps`` that feeds the stats (3 ``perf_counter`` calls and
   the bytes sum per sample) timed the same way.

    python bench/bench_stats.py [--quick] [--repeats N]
"""

from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def main(argv=None) -> int:
    args = C.parse_args(__doc__.split("\n")[0], argv)
    warnings.filterwarnings("ignore")
    import resumewds as rw
    from resumewds.run import _stats as stats_mod

    print(C.machine_note())
    shards, samples = (8, 500) if args.quick else (16, 1000)
    repeats = args.repeats or (8 if args.quick else 11)
    table = C.Table("bench_stats" + (" --quick" if args.quick else ""))
    real_update = stats_mod.Stats.update
    # newer loaders also sample the DataLoader queue depth once per batch: part of stats too
    real_observe = getattr(stats_mod.Stats, "observe_queue", None)

    def noop_update(self, meta, wait=0.0):
        return None

    def noop_observe(self, *a, **k):
        return None

    def set_stats(on: bool) -> None:
        stats_mod.Stats.update = real_update if on else noop_update
        if real_observe is not None:
            stats_mod.Stats.observe_queue = real_observe if on else noop_observe

    with C.workdir(args, "stats") as d:
        _, _, manifest = C.make_shards(os.path.join(d, "data"), shards, samples, size_range=(5000, 50000))
        cache = os.path.join(d, "cache")
        metas: list = []

        def loop(stats_on: bool, batch_size, capture: bool = False):
            set_stats(stats_on)
            try:
                loader = rw.WebLoader(rw.WebDataset(manifest, cache_dir=cache), batch_size=batch_size,
                                      num_workers=0)
                if capture:
                    orig = loader.stats_.update

                    def spy(meta, wait=0.0):
                        metas.append((meta, wait))
                        return orig(meta, wait)
                    loader.stats_.update = spy
                n = 0
                with C.Clock() as clock:
                    for _ in loader:
                        n += 1
                if batch_size:
                    n *= batch_size  # (every batch is full: samples divide by 64)
                if stats_on:
                    assert loader.stats()["samples"] == shards * samples
                return clock.result(n)
            finally:
                set_stats(True)

        for bs in (64, None):
            label = "batch 64" if bs else "batch_size=None"
            print(f"# 1. loop {label}, {shards * samples} samples, stats on vs Stats.update no-op, "
                  f"{repeats} interleaved repeats", flush=True)
            runs = C.interleave({"stats_on": lambda bs=bs: loop(True, bs), "stats_noop": lambda bs=bs: loop(False, bs)},
                                repeats)
            on, off = runs["stats_on"], runs["stats_noop"]
            table.add(f"loop samples/s ({label}): stats on vs update no-op (best)", C.best_rate(on),
                      C.best_rate(off), target=0.99)
            table.add(f"loop samples/s ({label}): same, median", C.median_rate(on), C.median_rate(off))
            table.add(f"loop ({label}): median of per-round paired ratios", C.median_rate(on), C.median_rate(off),
                      ratio=C.paired_ratio(on, off))
            c_on, c_off = C.cpu_per_item_us(on), C.cpu_per_item_us(off)
            table.add(f"loop CPU us/sample ({label}) (ratio = peer/ours)", c_on, c_off, ratio=c_off / c_on,
                      fmt="{:,.2f}")

        # ---- 2. direct measurement -----------------------------------------------------
        n_total, loop_s, _ = loop(True, 64, capture=True)
        loop_s = min(loop_s, min(C.best_time(on), loop_s))  # fastest observed loop time: a pessimistic ratio
        s = stats_mod.Stats()
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            for meta, wait in metas:
                real_update(s, meta, wait)
        upd = (time.perf_counter() - t0) / reps
        frac = upd / loop_s
        table.add_raw("Stats.update time per epoch / loop time (batch 64)", f"{upd * 1e3:.2f} ms",
                      f"{loop_s * 1e3:.0f} ms", f"{frac * 100:.3f}%", "<= 1%", frac <= 0.01)
        per_batch_us = upd / max(1, len(metas)) * 1e6
        table.add_raw("Stats.update per batch", f"{per_batch_us:.1f} us", f"{len(metas)} batches", "-", "-", None)
        snap_t = time.perf_counter()
        for _ in range(200):
            s.snapshot()
        snap_us = (time.perf_counter() - snap_t) / 200 * 1e6
        table.add_raw("Stats.snapshot() (loader.stats())", f"{snap_us:.1f} us", "-", "-", "-", None)

        # per-sample instrumentation in WebDataset.iter_steps, replayed on real samples
        ds = rw.WebDataset(manifest, cache_dir=cache)
        samples_ = []
        for i, smp in enumerate(ds):
            samples_.append(smp)
            if i >= 2000:
                break
        ds.close()
        pc = time.perf_counter
        t0 = pc()
        acc = 0
        for smp in samples_:
            a = pc()
            b = pc()
            acc += sum(len(v) for k2, v in smp.items() if not k2.startswith("__"))
            _ = pc() - b + (b - a)
        per_sample = (pc() - t0) / len(samples_)
        sample_time = loop_s / n_total
        table.add_raw("iter_steps per-sample instrumentation (info)", f"{per_sample * 1e6:.2f} us/sample",
                      f"{sample_time * 1e6:.2f} us/sample", f"{per_sample / sample_time * 100:.1f}%", "-", None)
    table.print()
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
