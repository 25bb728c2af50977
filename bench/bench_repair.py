"""Bytes fetched to repair one flipped byte in a cached shard.

A shard of 32 MB (``--quick``: one; full: also 256 MB) of 100 KB samples is
written with a version-3 manifest (sample digests), served by the counting
fault server on 127.0.0.1 and fetched into a cache; one byte of the cached
copy is flipped at a random sample, and the next verified read repairs it.
The peer is the same repair without sample digests (a whole-shard
refetch), in the same run.  Target: the bytes the server sends for the
ranged repair are at most 1% of the shard.

    python bench/bench_repair.py [--quick]
"""

from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _common as C


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def main(argv=None) -> int:
    args = C.parse_args(__doc__.split("\n")[0], argv)
    from chaos.faultserver import FaultServer
    from resumewds.cache import ShardStore
    from resumewds.fetch import FetchConfig
    from resumewds.manifest._manifest import load_manifest
    from resumewds.writer import ShardWriter

    print(C.machine_note())
    table = C.Table("bench_repair" + (" --quick" if args.quick else ""))
    rng = random.Random(15)
    for mb in ([32] if args.quick else [32, 256]):
        with C.workdir(args, "repair") as d:
            data = os.path.join(d, "data")
            os.makedirs(data)
            n = mb * 10 + 10
            with ShardWriter(os.path.join(data, "s-%02d.tar"), maxcount=n, verbose=0, mtime=0,
                             encoder=False) as w:
                for i in range(n):
                    w.write({"__key__": f"k{i:05d}", "bin": rng.randbytes(100 * 1024)})
            sent = {}
            with FaultServer(data) as srv:
                for name, digests in (("ranged", True), ("whole", False)):
                    shard = load_manifest(os.path.join(data, "manifest.json")).shards[0]
                    shard.url = srv.url.rstrip("/") + "/" + os.path.basename(shard.url)
                    if not digests:
                        shard.sample_digests = None
                    st = ShardStore(cache_dir=os.path.join(d, "cache-" + name), verify="always",
                                    fetch=FetchConfig.from_env())
                    path = st.ensure(shard)
                    i = rng.randrange(shard.samples)
                    a, b = shard.sample_range(i)
                    _flip(path, rng.randrange(a + 512, b))
                    srv.reset_counters()
                    st.ensure(shard)
                    sent[name] = srv.bytes_sent
                    print(f"# {mb} MB shard, {name}: flipped a byte of sample {i} ({b - a} bytes): "
                          f"{sent[name]} bytes sent", flush=True)
            table.add(f"bytes to repair 1 flipped byte, {mb} MB shard (vs whole refetch)", sent["ranged"],
                      sent["whole"], target=0.01, higher_is_better=False)
    table.print()
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
