"""What the journal costs a training loop.

1. A ``rw.WebLoader(..., batch_size=64, num_workers=0, journal=<new file>)``
   loop calling ``loader.commit(step)`` after every batch, vs the same loop
   without a journal (and without commits).  Only the iteration is timed
   (opening the journal is a one-time cost).  Target: cost <= 2%, i.e.
   throughput ratio >= 0.98.  Reported as best-of-repeats (the PASS
   criterion), median, and CPU time per sample.  A ``journal_sync="FULL"``
   (fsync per commit) variant is reported for information.  Also measured
   directly: the share of the loop's wall time spent inside
   ``loader.commit()`` (target <= 2%).
2. Raw ``Journal.commit`` commits/s (one position + one consumption row per
   commit, as the loader writes), vs a bare sqlite3 INSERT + COMMIT per
   transaction with the same WAL / synchronous=NORMAL settings.

    python bench/bench_journal.py [--quick] [--repeats N]
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def main(argv=None) -> int:
    args = C.parse_args(__doc__.split("\n")[0], argv)
    warnings.filterwarnings("ignore")
    import resumewds as rw
    from resumewds.journal import Journal

    print(C.machine_note())
    shards, samples = (4, 500) if args.quick else (16, 1000)
    repeats = args.repeats or (4 if args.quick else 7)
    table = C.Table("bench_journal" + (" --quick" if args.quick else ""))
    with C.workdir(args, "journal") as d:
        _, _, manifest = C.make_shards(os.path.join(d, "data"), shards, samples, size_range=(5000, 50000))
        cache = os.path.join(d, "cache")
        jdir = os.path.join(d, "journals")
        os.makedirs(jdir)
        counter = [0]
        in_commit: list = []  # share of the loop's wall time spent inside loader.commit()

        def loop(journal: bool, sync: str = "NORMAL") -> int:
            path = None
            if journal:
                counter[0] += 1
                path = os.path.join(jdir, f"run{counter[0]}.db")
            loader = rw.WebLoader(rw.WebDataset(manifest, cache_dir=cache), batch_size=64, num_workers=0,
                                  journal=path, journal_sync=sync)
            n = 0
            pc = time.perf_counter
            t_commit = 0.0
            with C.Clock() as clock:  # opening the journal is a one-time cost: not timed
                for step, batch in enumerate(loader):
                    n += len(batch["__key__"])
                    if journal:
                        t0 = pc()
                        loader.commit(step)
                        t_commit += pc() - t0
            loader.close()
            if journal and sync == "NORMAL":
                in_commit.append(t_commit / clock.dt)
            return clock.result(n)

        print(f"# 1. loop over {shards * samples} samples, batch 64, commit every batch; "
              f"{repeats} interleaved repeats", flush=True)
        runs = C.interleave({"journal": lambda: loop(True), "none": lambda: loop(False),
                             "journal_full": lambda: loop(True, "FULL")}, repeats)
        j, n = runs["journal"], runs["none"]
        table.add("loop samples/s: commit(step) every batch vs no journal (best)", C.best_rate(j),
                  C.best_rate(n), target=0.98)
        table.add("loop samples/s: same, median of repeats", C.median_rate(j), C.median_rate(n))
        table.add("loop: median of per-round paired ratios", C.median_rate(j), C.median_rate(n),
                  ratio=C.paired_ratio(j, n))
        cj, cn = C.cpu_per_item_us(j), C.cpu_per_item_us(n)
        table.add("loop CPU us/sample (ratio = peer/ours)", cj, cn, ratio=cn / cj, fmt="{:,.2f}")
        table.add("loop samples/s: journal_sync=FULL vs no journal (best)", C.best_rate(runs["journal_full"]),
                  C.best_rate(n))
        share = sorted(in_commit)[len(in_commit) // 2]
        table.add_raw("time inside loader.commit() / loop time (median, in-loop)", f"{share * 100:.2f}%",
                      "-", "-", "<= 2%", share <= 0.02)

        # ---- 2. raw commits/s ---------------------------------------------------
        ncommits = 1000 if args.quick else 5000
        url = "http://example.invalid/shard-000000.tar"

        def journal_commits():
            counter[0] += 1
            jr = Journal(os.path.join(jdir, f"raw{counter[0]}.db"))
            try:
                with C.Clock() as clock:
                    for i in range(ncommits):
                        jr.commit(i, epoch=0, position=(i + 1) * 64, consumed={(url, 0): (64, 1000)},
                                  world_size=1, batch_size=64, samples_total=(i + 1) * 64)
            finally:
                jr.close()
            return clock.result(ncommits)

        def sqlite_commits():
            counter[0] += 1
            conn = sqlite3.connect(os.path.join(jdir, f"bare{counter[0]}.db"), isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE commits (step INTEGER PRIMARY KEY, epoch INT, position INT, rank INT, "
                         "world_size INT, batch_size INT, ts REAL, samples_total INT, stats TEXT)")
            conn.execute("CREATE TABLE consumption (url TEXT, epoch INT, samples INT, total INT, "
                         "complete INT, ts REAL, PRIMARY KEY (url, epoch))")
            clock = C.Clock().__enter__()
            for i in range(ncommits):
                conn.execute("BEGIN")
                conn.execute("INSERT INTO commits VALUES (?,?,?,?,?,?,?,?,?)",
                             (i, 0, (i + 1) * 64, 0, 1, 64, time.time(), (i + 1) * 64, None))
                conn.execute("INSERT INTO consumption VALUES (?,?,?,?,?,?) ON CONFLICT(url, epoch) DO UPDATE "
                             "SET samples = samples + excluded.samples, ts = excluded.ts",
                             (url, 0, 64, 1000, 0, time.time()))
                conn.execute("COMMIT")
            clock.__exit__()
            conn.close()
            return clock.result(ncommits)

        print(f"# 2. {ncommits} raw commits, {max(3, repeats // 2)} repeats", flush=True)
        runs = C.interleave({"Journal.commit": journal_commits, "sqlite3": sqlite_commits}, max(3, repeats // 2))
        jc, sc = C.best_rate(runs["Journal.commit"]), C.best_rate(runs["sqlite3"])
        table.add("commits/s: Journal.commit vs bare sqlite3 INSERT+COMMIT", jc, sc)
        batch_rate = C.best_rate(n) / 64  # batches/s of the journal-free loop
        table.add_raw("implied commit cost per batch (1 commit / batch time)", f"{1e6 / jc:,.0f} us",
                      f"{1e6 / batch_rate:,.0f} us/batch", f"{batch_rate / jc * 100:.2f}%", "<= 2%",
                      batch_rate / jc <= 0.02)
    table.print()
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
