"""Fetching, cache verification and reading over HTTP.

``python -m chaos.faultserver`` (a separate process, so its threads do not
share the measured process's GIL) on 127.0.0.1 serves generated shards
(5-50 KB samples) and their ``manifest.json``.  Measured, each against a
peer in the same run (interleaved, best of ``--repeats``):

1. fetch: ``ShardStore.prefetch_all`` downloading every shard into an empty
   cache (fetch, xxh3 verify from the bytes as written, atomic publish, meta;
   default ``sync``: no fsync, re-verified after a reboot) vs ``requests``
   streaming the same files to disk raw.  Target >= 0.8x.  Also shown (info):
   the same with ``sync="fsync"``.
2. verify: ``ShardStore.verify_all`` over the full cache (policy "always")
   vs reading every cached file + xxh3_64 raw.  Target >= 0.8x.
3. samples/s over HTTP: ``rw.WebLoader(rw.WebDataset(<url>/manifest.json),
   batch_size=None)`` with a cold cache (downloads included) and a warm cache,
   vs ``wds.WebDataset("<url>/shard-{...}.tar")`` over the same server.
   Target >= 3x for both.
4. faults: a cold shuffled pass over a second data set of many small shards
   (so that 10% of requests is several faults per pass), once fault-free and
   once with ``mixed:0.1`` (resets, 5xx/429, truncations, stalls; tiny
   backoffs via FetchConfig), for 3 server seeds: median faulted wall time
   <= 2x the median fault-free one, and every pass delivers exactly the
   samples (key + digest, in order) of the same shuffled pass over the local
   files.

    python bench/bench_fetch.py [--quick] [--repeats N]
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def main(argv=None) -> int:
    args = C.parse_args(__doc__.split("\n")[0], argv)
    warnings.filterwarnings("ignore")
    import requests
    import webdataset as wds
    import xxhash

    import resumewds as rw
    from resumewds import load_manifest
    from resumewds.cache import ShardStore
    from resumewds.fetch import FetchConfig
    from resumewds.manifest._manifest import Manifest, ShardInfo
    from resumewds.tar import sample_digest

    print(C.machine_note())
    # throughput data: realistic shard sizes (per-shard fsyncs and bookkeeping
    # are amortised as in real use); fault data: many small shards, so that 10%
    # of the requests is a meaningful number of faults per pass
    shards, samples = (6, 250) if args.quick else (24, 700)
    fshards, fsamples = (24, 40) if args.quick else (48, 100)
    repeats = args.repeats or (3 if args.quick else 5)  # quick runs last ~0.1 s: best of 2 was noise
    fault_seeds = 3
    table = C.Table("bench_fetch" + (" --quick" if args.quick else ""))
    with C.workdir(args, "fetch") as d:
        srv_dir = os.path.join(d, "srv")
        paths, _, manifest_path = C.make_shards(srv_dir, shards, samples, size_range=(5000, 50000))
        total_bytes = sum(os.path.getsize(p) for p in paths)
        local = load_manifest(manifest_path)
        fault_dir = os.path.join(d, "fsrv")
        C.make_shards(fault_dir, fshards, fsamples, size_range=(5000, 50000), seed=1)
        server = C.ServerProc(srv_dir).start()
        try:
            base = server.url.rstrip("/")
            names = [os.path.basename(p) for p in paths]
            remote = Manifest([ShardInfo(url=f"{base}/{n}", size=s.size, xxh3_64=s.xxh3_64, samples=s.samples,
                                         offsets=s.offsets) for n, s in zip(names, local.shards)])
            manifest_url = f"{base}/manifest.json"
            wds_url = f"{base}/shard-{{000000..{shards - 1:06d}}}.tar"
            scratch = os.path.join(d, "scratch")
            counter = [0]

            def fresh_dir(tag: str) -> str:
                counter[0] += 1
                p = os.path.join(scratch, f"{tag}-{counter[0]}")
                os.makedirs(p)
                return p

            def clean() -> None:
                shutil.rmtree(scratch, ignore_errors=True)
                os.makedirs(scratch, exist_ok=True)

            # ---- 1. fetch throughput ------------------------------------------
            # (deleting the previous pass's files is not timed: freeing ~GB of
            # page cache is slow and noisy, and not part of either side's work)
            def rw_fetch(sync: str = "auto"):
                clean()
                cache_dir = fresh_dir("cache")
                with C.Clock() as clock:
                    with ShardStore(cache_dir=cache_dir, fetch=FetchConfig(), sync=sync) as st:
                        res = st.prefetch_all(remote.shards)
                assert all(ok for _, ok, _ in res), res
                return clock.result(total_bytes)

            def requests_fetch():
                clean()
                out = fresh_dir("raw")
                n = 0
                with C.Clock() as clock, requests.Session() as s:
                    for sh, name in zip(remote.shards, names):
                        with s.get(sh.url, stream=True, timeout=30) as r:
                            r.raise_for_status()
                            with open(os.path.join(out, name), "wb") as f:
                                for chunk in r.iter_content(1 << 20):
                                    f.write(chunk)
                                    n += len(chunk)
                return clock.result(n)

            print(f"# 1. fetch {shards} shards ({total_bytes / 1e6:.0f} MB), {repeats} repeats", flush=True)
            runs = C.interleave({"rw_fetch": rw_fetch, "requests": requests_fetch,
                                 "rw_fetch_fsync": lambda: rw_fetch("fsync")}, repeats)
            table.add("fetch MB/s: ShardStore.prefetch_all vs requests stream", C.best_rate(runs["rw_fetch"]) / 1e6,
                      C.best_rate(runs["requests"]) / 1e6, target=0.8, fmt="{:,.0f}")
            table.add("fetch MB/s: same with sync='fsync' (fsync per shard)", C.best_rate(runs["rw_fetch_fsync"]) / 1e6,
                      C.best_rate(runs["requests"]) / 1e6, fmt="{:,.0f}")

            # ---- 2. verify throughput ------------------------------------------
            clean()
            vcache = os.path.join(d, "vcache")
            shutil.rmtree(vcache, ignore_errors=True)
            store = ShardStore(cache_dir=vcache)
            assert all(ok for _, ok, _ in store.prefetch_all(remote.shards))
            cached = [store.entry_path(s.url) for s in remote.shards]

            def rw_verify() -> int:
                res = store.verify_all(remote.shards)
                assert all(ok for _, ok, _ in res), res
                return total_bytes

            def raw_verify() -> int:
                n = 0
                for p, s in zip(cached, remote.shards):
                    h = xxhash.xxh3_64()
                    with open(p, "rb") as f:
                        while True:
                            b = f.read(1 << 20)
                            if not b:
                                break
                            h.update(b)
                            n += len(b)
                    assert h.hexdigest() == s.xxh3_64
                return n

            print(f"# 2. verify cached shards, {repeats + 2} repeats", flush=True)
            runs = C.interleave({"rw_verify": rw_verify, "raw": raw_verify}, repeats + 2)
            table.add("verify MB/s: ShardStore.verify_all vs read+xxh3", C.best_rate(runs["rw_verify"]) / 1e6,
                      C.best_rate(runs["raw"]) / 1e6, target=0.8, fmt="{:,.0f}")
            store.close()

            # ---- 3. samples/s over http --------------------------------------------
            warm_cache = os.path.join(d, "warm")

            def rw_pass(cache_dir: str, shuffle=False, seed=0, fetch=None, keys=None, url=None) -> int:
                ds = rw.WebDataset(url or manifest_url, cache_dir=cache_dir, shuffle=shuffle, seed=seed, fetch=fetch)
                n = 0
                for s in rw.WebLoader(ds, batch_size=None, num_workers=0):
                    if keys is not None:
                        keys.append((s["__key__"], sample_digest(s)))
                    n += 1
                ds.close()
                return n

            def rw_cold():
                clean()
                cache_dir = fresh_dir("cold")
                with C.Clock() as clock:
                    n = rw_pass(cache_dir)
                return clock.result(n)

            def rw_warm() -> int:
                return rw_pass(warm_cache)

            def wds_http() -> int:
                n = 0
                for _ in wds.WebDataset(wds_url, shardshuffle=False):
                    n += 1
                return n

            rw_warm()  # populate the warm cache
            print(f"# 3. samples/s over http, {shards * samples} samples, {repeats} repeats", flush=True)
            runs = C.interleave({"rw_cold": rw_cold, "rw_warm": rw_warm, "wds_http": wds_http}, repeats)
            for k, rs in runs.items():
                assert all(r[1] == shards * samples for r in rs), (k, rs)
            peer = C.best_rate(runs["wds_http"])
            table.add("http samples/s: rw cold cache vs wds over http", C.best_rate(runs["rw_cold"]), peer, target=3)
            table.add("http samples/s: rw warm cache vs wds over http", C.best_rate(runs["rw_warm"]), peer, target=3)

            # ---- 4. 10% faults ---------------------------------------------------------
            cfg = FetchConfig(attempts=30, backoff_initial=0.005, backoff_max=0.02, read_timeout=0.25,
                              connect_timeout=2.0)
            ref_keys: list = []
            print(f"# 4. cold shuffled pass over {fshards} shards x {fsamples}, fault-free vs mixed:0.1 "
                  f"({fault_seeds} fault seeds)", flush=True)
            server.stop()
            # the reference order: the same shuffled pass over the local files
            ds = rw.WebDataset(os.path.join(fault_dir, "manifest.json"), cache_dir=os.path.join(d, "lc"),
                               shuffle=True, seed=7)
            ref_keys.extend((s["__key__"], sample_digest(s)) for s in ds)
            ds.close()
            clean_times, fault_times, identical, faults_seen = [], [], True, 0
            for i in range(fault_seeds):
                for faulty in (False, True):
                    clean()
                    keys: list = []
                    # a fresh server per pass, on its own port: the seed fixes which requests fail
                    with C.ServerProc(fault_dir, faults="mixed:0.1" if faulty else "", seed=100 + i,
                                      stall_seconds=1.0, retry_after=0.01) as fs:
                        url_i = fs.url.rstrip("/") + "/manifest.json"
                        t, n, _ = C.timed(lambda keys=keys, url_i=url_i: rw_pass(fresh_dir("f"), shuffle=True, seed=7,
                                                                                  fetch=cfg, keys=keys, url=url_i))
                    identical &= keys == ref_keys
                    faults = fs.stats.get("faults", {})
                    nreq = sum(fs.stats.get("requests", {}).values())
                    if faulty:
                        fault_times.append(t)
                        faults_seen += sum(faults.values())
                        print(f"#  seed {100 + i}: faulted    {t:.2f}s, {sum(faults.values())} faults in "
                              f"{nreq} requests {faults}", flush=True)
                    else:
                        clean_times.append(t)
                        print(f"#  seed {100 + i}: fault-free {t:.2f}s, {nreq} requests", flush=True)
            med_clean = sorted(clean_times)[len(clean_times) // 2]
            med_fault = sorted(fault_times)[len(fault_times) // 2]
            table.add("faulted pass wall s (median) vs fault-free (mixed:0.1)", med_fault, med_clean,
                      target=2, higher_is_better=False, fmt="{:.2f}", unit="s")
            table.add("faulted pass wall s (worst) vs fault-free (median)", max(fault_times), med_clean,
                      fmt="{:.2f}", unit="s")
            table.add_raw("all http passes: samples identical to the local pass",
                          f"{len(ref_keys)} x {fault_seeds * 2}", f"{faults_seen} faults", "-", "identical",
                          identical)
        finally:
            server.stop()
    table.print()
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
