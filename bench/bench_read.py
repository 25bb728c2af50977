"""Read throughput of resumewds vs webdataset on the same local shards.

(a) no decode, one process: samples/s of
    * ``rw.WebLoader(rw.WebDataset(manifest), batch_size=None, num_workers=0)``
      (the path a user iterates), target >= 4x webdataset;
    * iterating ``rw.WebDataset(manifest)`` directly, target >= 4x;
    * the bare framer (``tario.read_sample`` over every sample's byte range),
      for reference;
  against ``webdataset.WebDataset(urls, shardshuffle=False)``.

(b) decode-heavy: real JPEGs decoded with PIL (``decode("rgb8")``,
    ``to_tuple("jpg", "cls")``, batches of 64) through ``rw.WebLoader`` with
    num_workers 1 and 2, against ``wds.WebLoader`` over
    ``wds.WebDataset(...).decode("rgb8").to_tuple("jpg", "cls").batched(64)``
    in the same configuration.  Targets: >= webdataset at each worker count,
    and our 2 workers >= 1.7x our 1 worker.

Every pass builds its dataset/loader fresh (setup included on both sides);
the sides are interleaved and the best of ``--repeats`` passes is compared.

    python bench/bench_read.py [--quick] [--repeats N] [--skip-decode]
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def plain(args, d: str, table: C.Table) -> None:
    import webdataset as wds

    import resumewds as rw
    from resumewds import load_manifest
    from resumewds.tar import _io as tario

    shards, samples = (8, 500) if args.quick else (32, 1000)
    repeats = args.repeats or (3 if args.quick else 5)
    _, pattern, manifest = C.make_shards(os.path.join(d, "plain"), shards, samples, size_range=(5000, 50000))
    cache = os.path.join(d, "cache")

    def rw_loader() -> int:
        n = 0
        for _ in rw.WebLoader(rw.WebDataset(manifest, cache_dir=cache), batch_size=None, num_workers=0):
            n += 1
        return n

    def rw_dataset() -> int:
        n = 0
        ds = rw.WebDataset(manifest, cache_dir=cache)
        for _ in ds:
            n += 1
        ds.close()
        return n

    m = load_manifest(manifest)

    def framer() -> int:
        n = 0
        for s in m.shards:
            fd = os.open(s.url, os.O_RDONLY)
            try:
                o = s.offsets
                for j in range(s.samples):
                    tario.read_sample(fd, o[j], o[j + 1], s.url)
                    n += 1
            finally:
                os.close(fd)
        return n

    def webdataset() -> int:
        n = 0
        for _ in wds.WebDataset(pattern, shardshuffle=False):
            n += 1
        return n

    print(f"# (a) plain read, {shards * samples} samples, {repeats} interleaved repeats", flush=True)
    runs = C.interleave({"rw_loader": rw_loader, "rw_dataset": rw_dataset, "framer": framer,
                         "webdataset": webdataset}, repeats)
    for name, rs in runs.items():
        assert all(r[1] == shards * samples for r in rs), (name, rs)
    peer = C.best_rate(runs["webdataset"])
    table.add("plain samples/s: WebLoader(nw=0, batch_size=None)", C.best_rate(runs["rw_loader"]), peer, target=4)
    table.add("plain samples/s: WebDataset iterated directly", C.best_rate(runs["rw_dataset"]), peer, target=4)
    table.add("plain samples/s: bare framer (tario.read_sample)", C.best_rate(runs["framer"]), peer)
    table.add("plain samples/s: WebLoader, median of repeats", C.median_rate(runs["rw_loader"]),
              C.median_rate(runs["webdataset"]))
    # CPU per sample: less sensitive to other tenants; ratio = peer / ours (higher = we use less)
    ours_cpu, peer_cpu = C.cpu_per_item_us(runs["rw_loader"]), C.cpu_per_item_us(runs["webdataset"])
    table.add("plain CPU us/sample: WebLoader (ratio = peer/ours)", ours_cpu, peer_cpu,
              ratio=peer_cpu / ours_cpu, fmt="{:,.1f}")


def decode(args, d: str, table: C.Table) -> None:
    import webdataset as wds

    import resumewds as rw

    shards, samples = (4, 150) if args.quick else (8, 400)
    repeats = args.repeats or (2 if args.quick else 4)
    _, pattern, manifest = C.make_shards(os.path.join(d, "jpg"), shards, samples, images=True, image_side=256)
    cache = os.path.join(d, "cache")
    total = shards * samples

    def rw_fn(nw: int):
        def run() -> int:
            ds = rw.WebDataset(manifest, cache_dir=cache).decode("rgb8").to_tuple("jpg", "cls")
            n = 0
            for _img, cls in rw.WebLoader(ds, batch_size=64, num_workers=nw):
                n += len(cls)
            return n
        return run

    def wds_fn(nw: int):
        def run() -> int:
            ds = wds.WebDataset(pattern, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls").batched(64)
            n = 0
            for _img, cls in wds.WebLoader(ds, batch_size=None, num_workers=nw):
                n += len(cls)
            return n
        return run

    print(f"# (b) decode rgb8, {total} JPEGs 256x256, batch 64, {repeats} interleaved repeats", flush=True)
    runs = C.interleave({"rw_nw1": rw_fn(1), "wds_nw1": wds_fn(1), "rw_nw2": rw_fn(2), "wds_nw2": wds_fn(2)},
                        repeats)
    for name, rs in runs.items():
        assert all(r[1] == total for r in rs), (name, rs)
    r1, r2 = C.best_rate(runs["rw_nw1"]), C.best_rate(runs["rw_nw2"])
    table.add("decode samples/s: WebLoader nw=1 vs wds.WebLoader nw=1", r1, C.best_rate(runs["wds_nw1"]), target=1)
    table.add("decode samples/s: WebLoader nw=2 vs wds.WebLoader nw=2", r2, C.best_rate(runs["wds_nw2"]), target=1)
    table.add("decode scaling: our nw=2 vs our nw=1", r2, r1, target=1.7)
    table.add("decode scaling (peer): wds nw=2 vs wds nw=1", C.best_rate(runs["wds_nw2"]),
              C.best_rate(runs["wds_nw1"]))
    for nw in (1, 2):
        ours_cpu, peer_cpu = C.cpu_per_item_us(runs[f"rw_nw{nw}"]), C.cpu_per_item_us(runs[f"wds_nw{nw}"])
        table.add(f"decode CPU us/sample (main+workers) nw={nw} (ratio = peer/ours)", ours_cpu, peer_cpu,
                  ratio=peer_cpu / ours_cpu, fmt="{:,.0f}")


def main(argv=None) -> int:
    args = C.parse_args(__doc__.split("\n")[0], argv, extra=lambda p: (
        p.add_argument("--skip-decode", action="store_true"),
        p.add_argument("--skip-plain", action="store_true")))
    warnings.filterwarnings("ignore")
    print(C.machine_note())
    table = C.Table("bench_read" + (" --quick" if args.quick else ""))
    with C.workdir(args, "read") as d:
        if not args.skip_plain:
            plain(args, d, table)
        if not args.skip_decode:
            decode(args, d, table)
    table.print()
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
