"""Cold start: what a local read imports, and what the
DataLoader workers must not import each on their own after the fork.

Each check runs in a fresh interpreter (a module imported by another test
would hide the import under test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from chaos.diskfaults import flip_byte as _flip

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_local_reads_do_not_import_requests(tmp_path):
    """Importing the store and fetching/reading local shards never loads requests/urllib3."""
    got = _run(f"""
        import json, os, sys
        import resumewds.cache, resumewds.fetch
        from resumewds import WebDataset, build_manifest, synth
        from resumewds.fetch import fetch_to_file
        d = {str(tmp_path)!r}
        synth.write_shards(os.path.join(d, "s"), shards=2, samples=20)
        build_manifest(os.path.join(d, "s", "shard-{{000000..000001}}.tar"), os.path.join(d, "m.json"))
        fetch_to_file(os.path.join(d, "s", "shard-000000.tar"), os.path.join(d, "copy.tar"))
        fetch_to_file("file://" + os.path.join(d, "s", "shard-000001.tar"), os.path.join(d, "copy1.tar"))
        n = sum(1 for _ in WebDataset(os.path.join(d, "m.json"), cache_dir=os.path.join(d, "c")))
        print(json.dumps([n, sorted(m for m in sys.modules if m.split(".")[0] in ("requests", "urllib3"))]))
    """)
    assert json.loads(got) == [40, []]


def test_a_local_loader_without_workers_or_journal_imports_none_of_their_modules(tmp_path):
    """A WebLoader over local shards with 0 workers and no journal imports neither the
    journal (sqlite3), nor the retry policy (tenacity), nor what workers need first
    (numpy.random): its first call allocates less, and a process that has just imported
    torch (one collection away from a full garbage collection) does not pay for one."""
    got = _run(f"""
        import json, os, sys
        import torch
        from resumewds import WebDataset, WebLoader, build_manifest, synth
        d = {str(tmp_path)!r}
        synth.write_shards(os.path.join(d, "s"), shards=2, samples=20)
        build_manifest(os.path.join(d, "s", "shard-{{000000..000001}}.tar"), os.path.join(d, "m.json"),
                       digests=True)
        ds = WebDataset(os.path.join(d, "m.json"), shuffle=True, cache_dir=os.path.join(d, "c"))
        n = sum(len(b["__key__"]) for b in WebLoader(ds, batch_size=8, num_workers=0))
        heavy = ("tenacity", "sqlite3", "resumewds.journal", "numpy.random", "requests")
        print(json.dumps([n, sorted(m for m in heavy if m in sys.modules)]))
    """)
    assert json.loads(got) == [40, []]


def test_a_local_read_loads_none_of_the_remote_read_path(tmp_path):
    """A data set and a WebLoader over local shards (sample digests, prefetch on) load
    neither the download path (the http client, retries, background downloads), nor
    ranged reads and sparse partials, nor repairs, nor the CLI's bulk passes, nor
    DataPipeline's module, nor the error map, compressed shards, counts-only sources or
    manifests beside shards, and a bare data set none of the stages' decoders: the first
    local sample does not pay for their import."""
    from resumewds import build_manifest, synth

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=20)
    build_manifest(str(tmp_path / "s" / "shard-{000000..000001}.tar"), str(tmp_path / "m.json"), digests=True)
    got = _run(f"""
        import json, os, sys
        import torch
        import resumewds as rw
        d = {str(tmp_path)!r}
        ds = rw.WebDataset(os.path.join(d, "m.json"), shuffle=True, cache_dir=os.path.join(d, "c"))
        n = sum(1 for _ in ds)
        bare = sorted(m for m in ("wds.filters", "autodecode") if "resumewds." + m in sys.modules)
        n += sum(len(b["__key__"]) for b in rw.WebLoader(ds, batch_size=8, num_workers=0))
        remote = ("fetch._http", "fetch._download", "fetch._retry", "cache._prefetch", "read._ranged",
                  "cache._sparse", "cache._repair", "cache._bulk", "wds.datapipeline", "fetch._errormap",
                  "tar._compressed", "manifest._foreignindex", "sources._beside")
        print(json.dumps([n, bare, sorted(m for m in remote if "resumewds." + m in sys.modules)]))
    """)
    assert json.loads(got) == [80, [], []]


def test_a_pipeline_that_does_not_decode_loads_no_decoders(tmp_path):
    """A DataPipeline over local shards without a decode stage leaves the decoders unloaded;
    webdataset's ``filters.autodecode`` still names the module, loaded on first use."""
    from resumewds import synth

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=20)
    got = _run(f"""
        import json, os, sys
        import resumewds as rw
        d = {str(tmp_path)!r}
        os.environ["RESUMEWDS_CACHE_DIR"] = os.path.join(d, "c")
        urls = [os.path.join(d, "s", f"shard-{{i:06d}}.tar") for i in range(2)]
        p = rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(10), rw.split_by_worker,
                            rw.tarfile_to_samples(), rw.shuffle(20))
        n = sum(1 for _ in p)
        before = "resumewds.autodecode" in sys.modules
        import resumewds.autodecode
        print(json.dumps([n, before, rw.wds.filters.autodecode is resumewds.autodecode]))
    """)
    assert json.loads(got) == [40, False, True]


def test_local_errors_translate_without_requests(tmp_path):
    """A missing local file still gives our one-line PermanentFetchError, requests still unloaded."""
    got = _run(f"""
        import json, sys
        from resumewds.errors import PermanentFetchError
        from resumewds.fetch import FetchConfig, fetch_to_file, no_sleep
        try:
            fetch_to_file({str(tmp_path / "nope.tar")!r}, {str(tmp_path / "x.tar")!r},
                          config=FetchConfig(attempts=2, sleep=no_sleep))
        except PermanentFetchError as e:
            msg = str(e)
        print(json.dumps(["no such file" in msg, "requests" in sys.modules]))
    """)
    assert json.loads(got) == [True, False]


def test_http_fetch_never_imports_requests(tmp_path):
    """The http(s) path is urllib3's pool (one fetch core): a whole download from a real
    server does not import requests, and its session asks for identity."""
    (tmp_path / "a.bin").write_bytes(b"x" * 5000)
    got = _run(f"""
        import functools, http.server, json, sys, threading
        from resumewds.fetch import fetch_to_file, new_session
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory={str(tmp_path)!r})
        handler.log_message = lambda *a: None
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        res = fetch_to_file("http://127.0.0.1:%d/a.bin" % srv.server_port, {str(tmp_path / "b.bin")!r})
        srv.shutdown()
        print(json.dumps([res.size, new_session().headers.get("Accept-Encoding"),
                          "requests" in sys.modules]))
    """)
    assert json.loads(got) == [5000, "identity", False]


def test_workers_inherit_the_store_modules(tmp_path):
    """resumewds.cache loads with the first data set (not with the package), numpy.random
    with the WebLoader, both before the workers fork: each worker finds them already
    imported when it starts."""
    from resumewds import build_manifest, synth  # the data is written here: build_manifest imports the store

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=20)
    build_manifest(str(tmp_path / "s" / "shard-{000000..000001}.tar"), str(tmp_path / "m.json"))
    got = _run(f"""
        import json, os, sys
        import torch
        import resumewds as rw
        d = {str(tmp_path)!r}
        light = "resumewds.cache" not in sys.modules

        def init(worker_id):
            with open(os.path.join(d, "w%d.json" % worker_id), "w") as f:
                json.dump(["resumewds.cache" in sys.modules, "numpy.random" in sys.modules], f)

        ds = rw.WebDataset(os.path.join(d, "m.json"), cache_dir=os.path.join(d, "c")).to_tuple("__key__", "cls")
        parent = light and "resumewds.cache" in sys.modules
        loader = rw.WebLoader(ds, batch_size=8, num_workers=2, worker_init_fn=init,
                              multiprocessing_context="fork")
        keys = [k for batch in loader for k in batch[0]]
        seen = [json.load(open(os.path.join(d, "w%d.json" % i))) for i in range(2)]
        print(json.dumps([parent, len(keys), len(set(keys)), seen]))
    """)
    parent, n, distinct, seen = json.loads(got)
    assert parent  # not with the package; with the data set
    assert (n, distinct) == (40, 40)
    assert seen == [[True, True], [True, True]]


# ---- first start of a local shard: its whole-file check comes before its first sample ----------
def _v3(tmp_path, shards=2, samples=30):
    from resumewds import build_manifest, synth

    synth.write_shards(str(tmp_path / "s"), shards=shards, samples=samples)
    pattern = str(tmp_path / "s" / f"shard-{{000000..{shards - 1:06d}}}.tar")
    build_manifest(pattern, str(tmp_path / "m3.json"), digests=True)
    build_manifest(pattern, str(tmp_path / "m1.json"))
    return str(tmp_path / "m3.json"), str(tmp_path / "m1.json")


def _marks(cache_dir):
    d = os.path.join(cache_dir, "verified")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _hashed_whole_on(monkeypatch):
    """The names of the threads that hash a local shard whole from now on."""
    import threading

    from resumewds.cache import _local as local

    names = []
    real = local.check_local

    def counted(*args, **kw):
        names.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(local, "check_local", counted)
    return names


def test_first_sample_comes_before_its_shard_is_hashed(tmp_path, monkeypatch):
    """v3 manifest, fresh cache: no shard is hashed whole on the reading thread (each sample
    is checked against its own digest); the background check marks both shards; the next
    start finds the marks; same samples as a v1 run every time."""
    from resumewds import WebDataset
    from resumewds.cache import _local as local

    m3, m1 = _v3(tmp_path)
    want = [(s["__key__"], s["cls"]) for s in WebDataset(m1, cache_dir=str(tmp_path / "c1"))]
    hashed = _hashed_whole_on(monkeypatch)
    it = iter(WebDataset(m3, cache_dir=str(tmp_path / "c3")))
    first = next(it)
    got = [(first["__key__"], first["cls"])] + [(s["__key__"], s["cls"]) for s in it]
    assert got == want
    assert set(hashed) <= {"resumewds-verify"}  # never on the reading thread
    assert local.wait_checks(120)
    assert len(_marks(str(tmp_path / "c3"))) == 2
    ds2 = WebDataset(m3, cache_dir=str(tmp_path / "c3"))
    assert [(s["__key__"], s["cls"]) for s in ds2] == want


def test_a_corrupt_sample_follows_on_error_alone(tmp_path):
    """A byte flipped in sample 12 of a local shard (size kept): raise (steps of one sample)
    delivers samples 0-11 and names sample 12; skip delivers the 19 others; the shard gets no mark."""
    import pytest

    from resumewds import WebDataset
    from resumewds.cache import _local as local
    from resumewds.errors import ChecksumMismatch
    m3, _ = _v3(tmp_path, shards=1, samples=20)
    shard = WebDataset(m3).manifest.shards[0]
    path = str(tmp_path / "s" / "shard-000000.tar")
    good = [s["__key__"] for s in WebDataset(m3, cache_dir=str(tmp_path / "c0"))]
    _flip(path, int(shard.offsets[12]) + 700)  # inside sample 12's member data; the size is unchanged
    delivered = []
    with pytest.raises(ChecksumMismatch) as ei:
        for s in WebDataset(m3, cache_dir=str(tmp_path / "c")):
            delivered.append(s["__key__"])
    assert delivered == good[:12]
    msg = str(ei.value)
    assert path in msg and "sample 12 " in msg and good[12] in msg and "\n" not in msg
    skipped = [s["__key__"] for s in WebDataset(m3, cache_dir=str(tmp_path / "c2"), on_error="skip")]
    assert skipped == good[:12] + good[13:]
    assert local.wait_checks(120)
    assert _marks(str(tmp_path / "c")) == [] and _marks(str(tmp_path / "c2")) == []


def test_whole_file_mismatch_outside_every_sample_delivers_every_sample(tmp_path):
    """Bytes outside every sample's range (the tar's end blocks) differ: each sample matches
    its digest and is delivered; the background whole-file check fails, so no mark is set
    (the next start checks the samples one by one again); the store's whole-file check
    (``resumewds verify``) still reports the file."""
    import pytest

    from resumewds import WebDataset
    from resumewds.cache import ShardStore
    from resumewds.cache import _local as local
    from resumewds.errors import ChecksumMismatch

    m3, _ = _v3(tmp_path, shards=1, samples=400)
    path = str(tmp_path / "s" / "shard-000000.tar")
    want = [s["__key__"] for s in WebDataset(m3, cache_dir=str(tmp_path / "c0"))]
    _flip(path, os.path.getsize(path) - 10)  # the trailing zero blocks
    assert [s["__key__"] for s in WebDataset(m3, cache_dir=str(tmp_path / "c"))] == want
    assert local.wait_checks(120)
    assert _marks(str(tmp_path / "c")) == []
    ds = WebDataset(m3)
    with pytest.raises(ChecksumMismatch) as ei:
        ShardStore(str(tmp_path / "c3")).check_local(ds.manifest.shards[0], "always")
    assert "xxh3_64 mismatch" in str(ei.value) and "sample" not in str(ei.value)


def test_sample_verified_start_with_workers_is_exact(tmp_path):
    """2 forked DataLoader workers, fresh cache, v3 manifest: the batches of a v1 run, and an
    exact resume from a state taken after 2 batches."""
    got = _run(f"""
        import json, torch
        import resumewds as rw
        m3, m1 = {str(tmp_path / "m3.json")!r}, {str(tmp_path / "m1.json")!r}

        def run(m, c, state=None, stop=None):
            ds = rw.WebDataset(m, shuffle=True, seed=3, cache_dir=c).to_tuple("__key__", "cls")
            loader = rw.WebLoader(ds, batch_size=7, num_workers=2, multiprocessing_context="fork")
            if state is not None:
                loader.load_state_dict(state)
            out = []
            for i, b in enumerate(loader):
                out.append(list(b[0]))
                if stop is not None and i + 1 == stop:
                    return out, loader.state_dict()
            return out, None

        d = {str(tmp_path)!r}
        full, _ = run(m1, d + "/c1")
        fresh, _ = run(m3, d + "/c3")
        head, st = run(m3, d + "/c4", stop=2)
        tail, _ = run(m3, d + "/c5", state=st)
        print(json.dumps([full == fresh, head + tail == full, len(full)]))
    """) if _v3(tmp_path, shards=3, samples=25) else None
    assert json.loads(got) == [True, True, 11]


def test_import_resumewds_loads_only_what_it_uses():
    """``import resumewds`` loads the exceptions and webdataset's ``gopen``, nothing of the
    engine (shardset, cache, fetch) and no torch: every other public name loads its module
    on first use, and every one resolves to its module's object."""
    got = _run("""
        import json, sys
        import resumewds as rw
        lazy = ("dataset", "writer", "mixing._plan", "mixdataset", "compat", "filters", "shardlists", "loader",
                "journal._core", "wds.datapipeline", "wds.webdataset")
        engine = ("read._dataset", "cache._store", "fetch._download", "read._ranged")
        before = (sorted(m for m in lazy if "resumewds." + m in sys.modules),
                  any("resumewds." + m in sys.modules for m in engine))
        import resumewds.filters, resumewds.dataset, resumewds.writer, resumewds.sources
        same = (rw.map is resumewds.filters.map and rw.WebDataset is resumewds.dataset.WebDataset
                and rw.TarWriter is resumewds.writer.TarWriter and callable(rw.gopen)
                and rw.filters is resumewds.filters and "WebDataset" in dir(rw))
        rw.WebLoader
        print(json.dumps([before, same, "resumewds.cache._store" in sys.modules, "torch" in sys.modules]))
    """)
    assert json.loads(got) == [[[], False], True, True, True]


def _resident_pages(path):
    import shutil as _sh

    if _sh.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "PAGES", path], capture_output=True,
                         text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None


def test_first_step_asks_the_kernel_for_its_sample_pages(tmp_path):
    """The first step's sample ranges of a local shard are read ahead together (posix_fadvise
    WILLNEED); advice never raises, for a missing file or a remote url either."""
    import pytest

    from resumewds import WebDataset, build_manifest, synth

    synth.write_shards(str(tmp_path / "s"), shards=1, samples=200, size_range=(20000, 40000))
    path = str(tmp_path / "s" / "shard-000000.tar")
    build_manifest(path, str(tmp_path / "m.json"))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # dirty pages stay; clean ones go
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # this file's pages only (nothing global)
    os.close(fd)
    if _resident_pages(path) != 0:
        pytest.skip("no fincore, or this filesystem keeps the pages (tmpfs)")
    from resumewds.cache import _local as local

    ds = WebDataset(str(tmp_path / "m.json"), cache_dir=str(tmp_path / "c"))
    assert local.wait_checks(60)  # no background check of the shard is queued or running
    assert _resident_pages(path) == 0  # nothing reads it by itself
    ds.reader.hint_pages([(0, 150), (0, 190)])
    deadline = time.monotonic() + 60  # the kernel's read-ahead (asserts no duration)
    while not _resident_pages(path):
        assert time.monotonic() < deadline, "the advice read nothing ahead"
        time.sleep(0.02)
    os.unlink(path)  # a missing file: no error from the advice
    ds.reader.hint_pages([(0, 1)])


def test_first_step_reads_its_first_sample_before_asking_for_the_others(tmp_path):
    """A cold disk serves the first sample alone: the first step's read-ahead (one
    ``hint_pages`` of all its samples) is asked for once that sample is out, iterated
    directly or read as a batch, and later steps ask for none."""
    from resumewds import WebDataset, WebLoader, build_manifest, synth

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=40)
    build_manifest(str(tmp_path / "s" / "shard-{000000..000001}.tar"), str(tmp_path / "m.json"), digests=True)

    def traced(ds):
        calls = []
        reader = ds.reader
        for name in ("hit", "read", "read_run", "hint_pages"):
            method = getattr(reader, name)

            def wrap(*a, _m=method, _n=name, **kw):
                calls.append((_n, a[0] if _n == "hint_pages" else a[:2]))
                return _m(*a, **kw)

            setattr(reader, name, wrap)
        return calls

    ds = WebDataset(str(tmp_path / "m.json"), shuffle=True, seed=3, cache_dir=str(tmp_path / "c1"))
    calls = traced(ds)
    keys = [s["__key__"] for s in ds]
    assert len(keys) == 80
    hints = [i for i, (n, _) in enumerate(calls) if n == "hint_pages"]
    assert len(hints) == 1 and hints[0] > 0  # one advice, for the first step, after its first read
    assert {where for _, where in calls[:hints[0]]} == {calls[0][1]}  # (read calls hit: one sample)
    assert len(calls[hints[0]][1]) == 64  # the whole first step (64 samples, iterated directly)
    assert calls[hints[0]][1][0] == calls[0][1]  # whose first sample was the one read

    ds = WebDataset(str(tmp_path / "m.json"), shuffle=True, seed=3, cache_dir=str(tmp_path / "c2"))
    calls = traced(ds)
    batches = [b["__key__"] for b in WebLoader(ds, batch_size=16, num_workers=0)]
    assert sum(batches, []) == keys
    hints = [i for i, (n, _) in enumerate(calls) if n == "hint_pages"]
    assert len(hints) == 1 and hints[0] > 0 and calls[hints[0]][1][0] == calls[0][1]
    assert {where for _, where in calls[:hints[0]]} == {calls[0][1]} and len(calls[hints[0]][1]) == 16


def test_header_checksums_are_checked_unless_the_copy_was_verified(tmp_path):
    """A header with a bad checksum: refused with verify="never" (the copy was never
    checked against a digest, so the framer recomputes the sum), refused as a whole-file
    mismatch with verify="once"; the verified path never sees such a header."""
    import pytest

    from resumewds import WebDataset
    from resumewds.errors import ChecksumMismatch, ShardFormatError
    m3, _ = _v3(tmp_path, shards=1, samples=20)
    shard = WebDataset(m3).manifest.shards[0]
    path = str(tmp_path / "s" / "shard-000000.tar")
    good = [s["__key__"] for s in WebDataset(m3, cache_dir=str(tmp_path / "c0"))]
    at = int(shard.offsets[5]) + 148  # sample 5's first header: its checksum field
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"0000000\0")
    delivered = []
    with pytest.raises(ShardFormatError, match="checksum"):
        for s in WebDataset(m3, cache_dir=str(tmp_path / "c1"), verify="never"):
            delivered.append(s["__key__"])
    assert delivered == good[:len(delivered)] and len(delivered) <= 5  # (a run of samples raises whole)
    delivered = []
    with pytest.raises(ChecksumMismatch):
        for s in WebDataset(m3, cache_dir=str(tmp_path / "c2")):
            delivered.append(s["__key__"])
    assert delivered == good[:len(delivered)] and len(delivered) <= 5


def test_workers_never_scan_what_they_inherited(tmp_path):
    """WebLoader with 2 forked workers: in each worker, while it reads, the objects it
    inherited are in the collector's permanent generation (a full collection there scans
    only the worker's own objects); the main process is left with nothing frozen; same
    batches as with 0 workers.  (Only the WebLoader's own workers: a torch DataLoader's
    workers are left as torch makes them, since resumewds hooks no fork.)"""
    got = _run(f"""
        import gc, json, os
        import torch
        from torch.utils.data import DataLoader
        from resumewds import WebDataset, WebLoader, build_manifest, synth
        d = {str(tmp_path)!r}
        synth.write_shards(os.path.join(d, "s"), shards=2, samples=20)
        m = os.path.join(d, "m.json")
        build_manifest(os.path.join(d, "s", "shard-{{000000..000001}}.tar"), m, digests=True)

        def frozen(s):
            s["frozen"] = gc.get_freeze_count()
            return s

        def keys(loader):
            out, fr = [], []
            for b in loader:
                out += list(b["__key__"])
                fr += [int(x) for x in b["frozen"]]
            return out, fr

        base = len(gc.get_objects())
        ds = WebDataset(m, shuffle=True, cache_dir=os.path.join(d, "c")).map(frozen)
        k0, f0 = keys(WebLoader(ds, batch_size=8, num_workers=0))
        k2, f2 = keys(WebLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork"))
        ds2 = WebDataset(m, cache_dir=os.path.join(d, "c2")).map(frozen)
        f3 = [s["frozen"] for b in DataLoader(ds2, batch_size=8, num_workers=2, collate_fn=list,
                                              multiprocessing_context="fork") for s in b]
        print(json.dumps([k0 == k2, sorted(set(f0)), min(f2) > base // 2, sorted(set(f3)), len(f3),
                          gc.get_freeze_count()]))
    """)
    assert json.loads(got) == [True, [0], True, [0], 40, 0]
