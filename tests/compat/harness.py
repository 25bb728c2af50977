"""Run webdataset 1.0.2's own test suite against resumewds (``webdataset`` aliased to it).

Usage::

    python tests/compat/harness.py            # against resumewds: passed / eligible / excluded
    python tests/compat/harness.py --real     # against the real webdataset (the baseline)
    python tests/compat/harness.py --real --write-baseline   # refresh the list of eligible tests

What it does:

1. Finds webdataset 1.0.2's sdist (``$RESUMEWDS_WDS_SDIST``, a cached copy,
   or ``pip download --no-deps --no-binary :all: webdataset==1.0.2``) and
   copies its ``tests/`` into a temporary directory.
2. Writes stand-ins for what the sdist does not ship: ``tests/conftest.py``
   (its names: ``local_data``, ``compressed``, ``remote_loc`` ...) and the
   ``testdata/`` files (generated: same names, members and sample counts
   the tests expect).  The "remote" shards are served by an HTTP server on
   127.0.0.1 started here; the tests' ``storage.googleapis.com`` URLs are
   rewritten to it, so nothing leaves the machine.
3. Runs pytest on the copy in a subprocess, with ``-p wds_alias``
   (``import webdataset`` is resumewds; no fallback) unless ``--real``.
4. Compares the outcomes with ``webdataset-1.0.2-passing.txt`` (the tests
   that pass on the real webdataset here) minus ``excluded.txt`` (tests of
   webdataset's private internals, each with its reason) and prints
   ``passed / eligible / excluded``.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VERSION = "1.0.2"
BASELINE = os.path.join(HERE, f"webdataset-{VERSION}-passing.txt")
EXCLUDED = os.path.join(HERE, "excluded.txt")
CACHE = os.environ.get("RESUMEWDS_WDS_SDIST_CACHE",
                       os.path.join(tempfile.gettempdir(), "resumewds-compat-sdist"))


# ---- the sdist -----------------------------------------------------------------
def find_sdist() -> str:
    """The unpacked sdist directory (``webdataset-1.0.2/`` with ``tests/``)."""
    env = os.environ.get("RESUMEWDS_WDS_SDIST")
    candidates = [env] if env else []
    candidates += [os.path.join(CACHE, f"webdataset-{VERSION}"), f"/tmp/wdsrc/webdataset-{VERSION}"]
    for c in candidates:
        if c and os.path.isdir(os.path.join(c, "tests")):
            return c
    os.makedirs(CACHE, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"webdataset=={VERSION}", "-d", CACHE], check=True, capture_output=True)
    archive = os.path.join(CACHE, f"webdataset-{VERSION}.tar.gz")
    with tarfile.open(archive) as tf:
        tf.extractall(CACHE, filter="data") if hasattr(tarfile, "data_filter") else tf.extractall(CACHE)
    return os.path.join(CACHE, f"webdataset-{VERSION}")


# ---- stand-in test data ---------------------------------------------------------
def _png(i: int, side: int = 32) -> bytes:
    import numpy as np
    import PIL.Image

    rng = np.random.default_rng(i)
    out = io.BytesIO()
    PIL.Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def _jpg(i: int, side: int = 32) -> bytes:
    import numpy as np
    import PIL.Image

    rng = np.random.default_rng(10_000 + i)
    out = io.BytesIO()
    PIL.Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def _write_tar(path: str, samples: List[List[Tuple[str, bytes]]], gz: bool = False) -> None:
    with tarfile.open(path, "w:gz" if gz else "w", format=tarfile.USTAR_FORMAT) as tf:
        for members in samples:
            for name, data in members:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
                tf.addfile(ti, io.BytesIO(data))


def _tenbin(arrays: list) -> bytes:
    """webdataset's tenbin encoding (tenbin.encode_buffer), written here from its format."""
    import struct

    import numpy as np

    def s64(s: str) -> int:
        return struct.unpack("@q", (s + "\0" * (8 - len(s))).encode("ascii"))[0]

    short = {"float16": "f2", "float32": "f4", "float64": "f8", "int8": "i1", "int16": "i2",
             "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2", "uint64": "u8"}
    chunks = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        chunks.append(np.array([s64(short[a.dtype.name]), s64(""), a.ndim] + list(a.shape), dtype="i8").tobytes())
        chunks.append(a.tobytes())
    out = bytearray()
    for c in chunks:
        out += b"~TenBin~" + struct.pack("@q", len(c)) + c + b"\0" * ((-len(c)) % 64)
    return bytes(out)


def make_testdata(root: str, plain: bool = False) -> None:
    """The files the tests name, generated: same names, member extensions and counts.

    ``plain``: write the ``.tgz`` files uncompressed (a diagnostic: both tarfile and
    resumewds detect compression from the bytes, so this isolates gzip support).
    """
    import numpy as np

    td = os.path.join(root, "testdata")
    os.makedirs(td, exist_ok=True)
    imagenet = [[(f"n{i:08d}.cls", str(i % 10).encode()), (f"n{i:08d}.png", _png(i)),
                 (f"n{i:08d}.wnid", b"n01440764"),
                 (f"n{i:08d}.xml", b"<annotation><size><width>32</width></size></annotation>")]
                for i in range(47)]
    _write_tar(os.path.join(td, "imagenet-000000.tgz"), imagenet, gz=not plain)
    _write_tar(os.path.join(td, "compressed.tar"),
               [[(f"c{i:03d}.txt.gz", gzip.compress(b"hello\n", mtime=0)),
                 (f"c{i:03d}.cls", str(i).encode())] for i in range(3)])
    rng = np.random.default_rng(0)
    _write_tar(os.path.join(td, "tendata.tar"),
               [[(f"t{i:03d}.ten", _tenbin([rng.normal(size=(28, 28)), rng.normal(size=(28, 28))]))]
                for i in range(100)])
    # the "remote" side, served on 127.0.0.1
    web = os.path.join(root, "web")
    oi = os.path.join(web, "webdataset", "openimages")
    os.makedirs(oi, exist_ok=True)
    for n in list(range(100)) + [321]:
        _write_tar(os.path.join(oi, f"openimages-train-{n:06d}.tar"),
                   [[(f"oi{n:06d}_{j:03d}.jpg", _jpg(n * 100 + j)),
                     (f"oi{n:06d}_{j:03d}.json",
                      json.dumps([{"label": "cat", "box": [0, 0, 1, 1]}]).encode())] for j in range(10)])
    tdw = os.path.join(web, "webdataset", "testdata")
    os.makedirs(tdw, exist_ok=True)
    shutil.copy(os.path.join(td, "imagenet-000000.tgz"), tdw)
    _write_tar(os.path.join(tdw, "sample.tgz"), [[("10.cls", b"0"), ("10.png", _png(10))]], gz=not plain)


CONFTEST = '''"""Stand-in for webdataset's tests/conftest.py (not in the sdist); written by
resumewds tests/compat/harness.py.  "Remote" data is served on 127.0.0.1."""


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: mark test as quick to run")
    config.addinivalue_line("markers", "notorch: mark test as not requiring torch")


def count_samples_tuple(source, *args, n=10000):
    count = 0
    for i, sample in enumerate(iter(source)):
        if i >= n:
            break
        assert isinstance(sample, (tuple, dict, list)), (type(sample), sample)
        for f in args:
            assert f(sample)
        count += 1
    return count


local_data = "testdata/imagenet-000000.tgz"
compressed = "testdata/compressed.tar"
remote_loc = "{base}webdataset/openimages/"
remote_shards = "openimages-train-0000{00..99}.tar"
remote_shard = "openimages-train-000321.tar"
remote_pattern = "openimages-train-{}.tar"
remote_sample = "{base}webdataset/testdata/sample.tgz"
'''


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve(directory: str) -> Tuple[http.server.ThreadingHTTPServer, str]:
    """A static HTTP server for ``directory`` on 127.0.0.1 (a daemon thread)."""
    handler = functools.partial(_Quiet, directory=directory)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


def prepare(root: str, base: str) -> None:
    """Copy the sdist's tests into ``root``, with the stand-in conftest and local URLs."""
    src = os.path.join(find_sdist(), "tests")
    dst = os.path.join(root, "tests")
    shutil.copytree(src, dst)
    open(os.path.join(dst, "__init__.py"), "w").close()
    with open(os.path.join(dst, "conftest.py"), "w") as f:
        f.write(CONFTEST.replace("{base}", base))
    for name in os.listdir(dst):
        if name.endswith(".py"):
            p = os.path.join(dst, name)
            with open(p) as f:
                text = f.read()
            new = re.sub(r"https?://storage\.googleapis\.com/", base, text)
            if new != text:
                with open(p, "w") as f:
                    f.write(new)


# ---- running and counting -------------------------------------------------------
def _outcomes(junit: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls = case.get("classname", "")
        mod, _, klass = cls.partition("tests.")[2].partition(".")
        nodeid = f"tests/{mod}.py::" + (f"{klass}::" if klass else "") + case.get("name", "")
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                kind = "failed"
            elif child.tag == "skipped":
                kind = "skipped"
        out[nodeid] = kind
    return out


def _read_list(path: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            node, _, reason = line.partition("  # ")
            out[node.strip()] = reason.strip()
    return out


def run(real: bool = False, keep: Optional[str] = None, extra: Optional[List[str]] = None,
        timeout: int = 1500, plain: bool = False,
        files: Optional[List[str]] = None) -> Dict[str, str]:
    """Run the suite; return ``{nodeid: passed|failed|skipped}``."""
    root = keep or tempfile.mkdtemp(prefix="wds-compat-")
    if os.path.exists(os.path.join(root, "tests")):
        shutil.rmtree(root)
        os.makedirs(root)
    make_testdata(root, plain=plain)
    srv, base = serve(os.path.join(root, "web"))
    try:
        prepare(root, base)
        junit = os.path.join(root, "junit.xml")
        env = dict(os.environ)
        paths = [REPO, HERE] if not real else [HERE]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
        env.setdefault("RESUMEWDS_CACHE_DIR", os.path.join(root, "cache"))
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120",
               "-o", "addopts=", "--continue-on-collection-errors", "--junitxml", junit]
        cmd += [os.path.join("tests", f) for f in (files or [])] or ["tests"]
        if not real:
            cmd[3:3] = ["-p", "wds_alias"]
        cmd += extra or []
        subprocess.run(cmd, cwd=root, env=env, timeout=timeout, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return _outcomes(junit)
    finally:
        srv.shutdown()
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def summary(outcomes: Dict[str, str]) -> Tuple[int, int, int, List[str]]:
    """``(passed, eligible, excluded, failing eligible tests)``."""
    baseline = set(_read_list(BASELINE))
    excluded = set(_read_list(EXCLUDED)) & baseline
    eligible = baseline - excluded
    passed = sorted(n for n in eligible if outcomes.get(n) == "passed")
    failing = sorted(eligible - set(passed))
    return len(passed), len(eligible), len(excluded), failing


FLOOR_FILE = os.path.join(HERE, "floor.txt")


def recorded_floor() -> int:
    """The number of eligible tests recorded as passing (``floor.txt``)."""
    try:
        with open(FLOOR_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", action="store_true", help="run against the real webdataset")
    ap.add_argument("--write-baseline", action="store_true", help="with --real: write the passing list")
    ap.add_argument("--keep", help="run in this directory and keep it")
    ap.add_argument("--show-failing", action="store_true")
    ap.add_argument("--plain", action="store_true",
                    help="diagnostic: write the .tgz stand-ins uncompressed")
    ap.add_argument("files", nargs="*", help="only these test files (e.g. test_compat.py)")
    args = ap.parse_args(argv)
    outcomes = run(real=args.real, keep=args.keep, plain=args.plain, files=args.files)
    if args.real:
        passing = sorted(n for n, k in outcomes.items() if k == "passed")
        print(f"real webdataset {VERSION}: {len(passing)} passed of {len(outcomes)} tests")
        if args.write_baseline:
            with open(BASELINE, "w") as f:
                f.write(f"# tests of webdataset {VERSION}'s suite that pass on the real webdataset "
                        "with tests/compat/harness.py's stand-in data (harness.py --real --write-baseline)\n")
                f.write("".join(n + "\n" for n in passing))
        return 0
    if args.files:
        outcomes.update({n: "failed" for n in _read_list(BASELINE)
                         if n.split("::")[0][len("tests/"):] not in args.files and n not in outcomes})
    passed, eligible, excluded, failing = summary(outcomes)
    if args.show_failing:
        print("\n".join(failing))
    print(f"webdataset {VERSION} suite on resumewds: passed {passed} / eligible {eligible} / "
          f"excluded {excluded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
