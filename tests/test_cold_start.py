"""Cold start (issue 17 item 5): what a local read imports, and what the
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


def test_http_fetch_imports_requests_when_needed():
    """The http(s) path loads requests at its first use and keeps the session subclass."""
    got = _run("""
        import json, sys
        from resumewds.fetch import new_session
        before = "requests" in sys.modules
        s = new_session()
        import requests
        print(json.dumps([before, isinstance(s, requests.Session), s.headers["Accept-Encoding"],
                          type(s) is type(new_session())]))
    """)
    assert json.loads(got) == [False, True, "identity", True]


def test_workers_inherit_the_store_modules(tmp_path):
    """WebLoader imports resumewds.cache (and numpy.random) before the workers fork:
    each worker finds them already imported when it starts."""
    from resumewds import build_manifest, synth  # the data is written here: build_manifest imports the store

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=20)
    build_manifest(str(tmp_path / "s" / "shard-{000000..000001}.tar"), str(tmp_path / "m.json"))
    got = _run(f"""
        import json, os, sys
        import torch
        import resumewds as rw
        d = {str(tmp_path)!r}
        parent = "resumewds.cache" in sys.modules

        def init(worker_id):
            with open(os.path.join(d, "w%d.json" % worker_id), "w") as f:
                json.dump(["resumewds.cache" in sys.modules, "numpy.random" in sys.modules], f)

        ds = rw.WebDataset(os.path.join(d, "m.json"), cache_dir=os.path.join(d, "c")).to_tuple("__key__", "cls")
        loader = rw.WebLoader(ds, batch_size=8, num_workers=2, worker_init_fn=init,
                              multiprocessing_context="fork")
        keys = [k for batch in loader for k in batch[0]]
        seen = [json.load(open(os.path.join(d, "w%d.json" % i))) for i in range(2)]
        print(json.dumps([parent, len(keys), len(set(keys)), seen]))
    """)
    parent, n, distinct, seen = json.loads(got)
    assert not parent  # nothing imported the store before the WebLoader
    assert (n, distinct) == (40, 40)
    assert seen == [[True, True], [True, True]]
