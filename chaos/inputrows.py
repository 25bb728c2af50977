"""Rows of ``python -m chaos run`` for hostile input: fuzzed and crafted shards, bad manifests, bad CLI input.

* fuzzed tar shards straight into the tar reader, and a few among good
  shards through ``resumewds cat``;
* manifests with a wrong checksum, a wrong size, a missing shard;
* input hardening: hostile tar sizes, malformed manifests, bad CLI input,
  stdout on a full disk, keys that need escaping.  A clear error here is
  strict (:func:`chaos.harness.strict_error`): exit > 0, no traceback, and
  the LAST stderr line is ``Error: ...`` naming the thing (the shard, file,
  option or variable).

Example:
    >>> bad_manifest("size").label
    'manifest with a wrong size'
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import Callable, Dict, List, Tuple

from chaos.crash import Proc, cat_cmd, child_env, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, cli, labelled, last_line, shard_paths, strict_error
from resumewds.cli._main import unescape_field

__all__ = ["bad_cli_input", "bad_manifest", "crafted_tar_sizes", "escaped_keys", "fuzz_rows",
           "input_hardening_rows", "malformed_manifest_input", "malformed_through_cat", "stdout_full_with_journal"]


def fuzz_rows(cases: int) -> Scenario:
    """``cases`` fuzzed tar shards into the tar reader (:func:`chaos.fuzz.fuzz_tar_reader`)."""
    def scenario(s: Suite) -> Row:
        from chaos.fuzz import fuzz_tar_reader  # lazy: chaos.fuzz needs hypothesis (a test extra)

        r = fuzz_tar_reader(cases=cases, seed=s.seed, bound=2.0)
        row = Row(f"fuzzed tar shards -> tar reader ({cases} cases)", "either")
        row.runs = r.cases
        row.faults = r.cases
        row.clear_errors = r.format_errors
        row.bad_exits = [m for m, _ in r.failures]
        row.note = f"{r.data} parsed, {r.format_errors} ShardFormatError, slowest {r.slowest * 1000:.0f} ms"
        return row
    sc = labelled("fuzz_rows", scenario)
    sc.alone = True  # type: ignore[attr-defined]  # hypothesis builds ast objects: see chaos.run.run_matrix
    return sc


def malformed_through_cat(s: Suite) -> Row:
    """A few fuzzed shards placed among good ones, read by ``resumewds cat``."""
    from hypothesis import HealthCheck, given, settings  # lazy: a test extra
    from hypothesis import seed as hseed  # lazy: a test extra

    from chaos.fuzz import mutated_shards  # lazy: chaos.fuzz needs hypothesis (a test extra)

    row = Row("malformed shard among good ones -> resumewds cat", "either")
    cases: List[bytes] = []

    @hseed(s.seed)
    @settings(max_examples=4 if s.quick else 12, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated_shards())
    def collect(b: bytes) -> None:
        cases.append(b)

    collect()
    for b in cases[-(4 if s.quick else 12):]:
        d = s.tmp("malformed")
        good = shard_paths(s.data)[:2]
        for g in good:
            shutil.copy(g, d)
        bad = os.path.join(d, "zz-bad.tar")
        with open(bad, "wb") as f:
            f.write(b)
        shards = sorted([*(os.path.join(d, os.path.basename(g)) for g in good), bad])
        p = run([sys.executable, "-m", "resumewds", "cat", *shards,
                 "--workers", "2", "--cache-dir", os.path.join(d, "cache")], bound=BOUND)
        row.runs += 1
        row.faults += 1
        if p.hung:
            row.hung += 1
        elif p.rc != 0 and not p.clear_error:
            row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
        elif p.rc != 0:
            row.clear_errors += 1
        # lines for the good shards must be the true samples
        good_lines = [ln for ln in p.lines if not ln.startswith("zz-bad.tar")]
        row.tally.add(compare(good_lines, good_lines, s.data.digests))
        row.tally.delivered += len(p.lines) - len(good_lines)
    return row


malformed_through_cat.alone = True  # type: ignore[attr-defined]  # hypothesis here too


def _edited_manifest(s: Suite, d: str, edit: Callable[[dict], None]) -> str:
    with open(s.data.manifest) as f:
        m = json.load(f)
    edit(m)
    for sh in m["shards"]:
        sh["url"] = "http://placeholder/" + os.path.basename(sh["url"])
    path = os.path.join(d, "manifest.json")
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def bad_manifest(kind: str) -> Scenario:
    """A manifest with a wrong checksum, a wrong size, or a missing shard (``kind``)."""
    row_names = {"checksum": "manifest with a wrong checksum", "size": "manifest with a wrong size",
                 "missing": "missing shard (404)"}

    def scenario(s: Suite) -> Row:
        row = Row(row_names[kind], "error")
        srv = s.server()
        try:
            d = s.tmp("badmanifest")

            def edit(m: dict) -> None:
                sh = m["shards"][len(m["shards"]) // 2]
                if kind == "checksum":
                    sh["xxh3_64"] = "0123456789abcdef"
                elif kind == "size":
                    sh["size"] = int(sh["size"]) + 512
                else:
                    sh["url"] = "no-such-shard.tar"
            path = _edited_manifest(s, d, edit)
            with open(path) as f:
                text = f.read().replace("http://placeholder/", srv.url)
            with open(path, "w") as f:
                f.write(text)
            p = run(cat_cmd(path, cache_dir=os.path.join(d, "cache"), epochs=1, workers=2,
                            extra=["--shuffle-mode", "none"]), bound=BOUND)
            ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                           bound=BOUND).lines
            row.runs += 1
            row.faults = 1
            if p.hung:
                row.hung += 1
            elif p.rc == 0:
                row.bad_exits.append("exit 0 with a bad manifest")
            elif p.clear_error:
                row.clear_errors += 1
                row.note = last_line(p.err)[:100]
            else:
                row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
            row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
        finally:
            srv.stop()
        return row
    return labelled(row_names[kind], scenario)


# ---------------------------------------------------------------------------
# input hardening (strict clear errors)
# ---------------------------------------------------------------------------


def crafted_tar_sizes(s: Suite) -> Row:
    """The issue's shard (pax size=0, then a negative base-256 size after the
    last sample) and hypothesis-drawn size attacks, among good shards, through
    ``index`` and ``cat --workers 2``: each ends (data or a clear error)."""
    from hypothesis import HealthCheck, given, settings  # lazy: a test extra
    from hypothesis import seed as hseed  # lazy: a test extra

    from chaos.fuzz import crafted_size_tar, size_attack_shards  # lazy: chaos.fuzz needs hypothesis

    row = Row("crafted tar sizes (pax size=0, negative base-256) -> index, cat", "either")
    cases: List[bytes] = [crafted_size_tar()]

    @hseed(s.seed)
    @settings(max_examples=4 if s.quick else 16, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(size_attack_shards())
    def collect(b: bytes) -> None:
        cases.append(b)

    collect()
    for i, b in enumerate(cases[:1 + (4 if s.quick else 16)]):
        d = s.tmp("crafted")
        good = [shutil.copy(g, d) for g in shard_paths(s.data)[:2]]
        bad = os.path.join(d, "zz-crafted.tar")
        with open(bad, "wb") as f:
            f.write(b)
        for cmd in (cli("index", *good, bad, "-o", os.path.join(d, "m.json")),
                    cli("cat", *good, bad, "--workers", "2", "--cache-dir", os.path.join(d, "cache"))):
            p = run(cmd, bound=BOUND)
            row.runs += 1
            row.faults += 1
            if p.hung:
                row.hung += 1
                row.bad_exits.append(f"case {i}: {cmd[3]} hung")
            elif p.rc != 0 and not strict_error(p, "zz-crafted.tar"):
                row.bad_exits.append(f"case {i}: {cmd[3]} unclear exit {p.rc}: {last_line(p.err)}")
            elif p.rc != 0:
                row.clear_errors += 1
            if cmd[3] == "cat":
                good_lines = [ln for ln in p.lines if not ln.startswith("zz-crafted.tar")]
                row.tally.add(compare(good_lines, good_lines, s.data.digests))
                row.tally.delivered += len(p.lines) - len(good_lines)
                if i == 0 and (p.rc != 0 or len(p.lines) - len(good_lines) != 3):
                    row.bad_exits.append(f"the issue's shard: exit {p.rc}, "
                                         f"{len(p.lines) - len(good_lines)} of its 3 samples")
    row.note = f"{len(cases)} shards; the pax size=0 shard reads as its 3 samples (as tarfile does)"
    return row


_MANIFEST_EDITS: Dict[str, Tuple[Callable[[dict], object], str]] = {
    "negative offset": (lambda sh: sh["offsets"].__setitem__(1, -5), "negative"),
    "backwards offsets": (lambda sh: sh["offsets"].__setitem__(1, sh["offsets"][2] + 512), "backwards"),
    "float offset": (lambda sh: sh["offsets"].__setitem__(1, float(sh["offsets"][1])), "not an integer"),
    "offset 10^12": (lambda sh: sh["offsets"].__setitem__(-1, 10 ** 12), "past the shard's size"),
    "offset 2^64": (lambda sh: sh["offsets"].__setitem__(-1, 2 ** 64), "past the shard's size"),
    "samples \"10\"": (lambda sh: sh.__setitem__("samples", str(sh["samples"])), "'samples'"),
    "index ends at 10^11, no size": (lambda sh: (sh.pop("size"), sh.pop("xxh3_64"),
                                                 sh["offsets"].__setitem__(-1, 10 ** 11)), "file ends at byte"),
}


def malformed_manifest_input(s: Suite) -> Row:
    """Each malformed manifest through ``cat --workers 2``: a one-line error
    naming the manifest and shard; nothing wrong printed before it."""
    row = Row("malformed manifest (offsets negative/backwards/float/huge, samples str)", "error")
    ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                   bound=BOUND).lines
    for name, (edit, words) in _MANIFEST_EDITS.items():
        d = s.tmp("manifest-input")
        with open(s.data.manifest) as f:
            m = json.load(f)
        for sh in m["shards"]:
            sh["url"] = os.path.join(s.data.root, os.path.basename(sh["url"]))
        edit(m["shards"][2])
        path = os.path.join(d, "manifest.json")
        with open(path, "w") as f:
            json.dump(m, f)
        p = run(cat_cmd(path, workers=2, epochs=1, cache_dir=os.path.join(d, "cache"),
                        extra=["--shuffle-mode", "none"]), bound=BOUND)
        row.runs += 1
        row.faults += 1
        shard = os.path.basename(m["shards"][2]["url"])
        if p.hung:
            row.hung += 1
        elif strict_error(p, shard, words):
            row.clear_errors += 1
        else:
            row.bad_exits.append(f"{name}: exit {p.rc}: {last_line(p.err)}")
        row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
    row.note = f"{len(_MANIFEST_EDITS)} kinds"
    return row


def bad_cli_input(s: Suite) -> Row:
    """Bad arguments and environment: each one line naming what is wrong."""
    row = Row("bad CLI input (dir, glob, duplicates, sizes, workers, window, -o, env)", "error")
    d = s.tmp("cli-input")
    m, root = s.data.manifest, s.data.root
    cases: List[Tuple[List[str], Dict[str, str], Tuple[str, ...]]] = [
        (["cat", root], {}, (root, "is a directory")),
        (["index", root, "-o", os.path.join(d, "x.json")], {}, (root, "is a directory")),
        (["cat", os.path.join(root, "shard-*.tar")], {}, ("not expanded",)),
        (["cat", m, m], {}, ("twice",)),
        (["cat", m, "--cache-size", "abc"], {}, ("--cache-size",)),
        (["cat", m, "--cache-size", "-5GB"], {}, ("--cache-size",)),
        (["cat", m], {"RESUMEWDS_CACHE_SIZE": "abc"}, ("RESUMEWDS_CACHE_SIZE",)),
        (["cat", m, "--workers", "-1"], {}, ("--workers",)),
        (["cat", m, "--shuffle-window", "0"], {}, ("--shuffle-window",)),
        (["index", m, "-o", "/nonexistent/dir/x"], {}, ("/nonexistent/dir",)),
        (["report", os.path.join(d, "none.db"), "-o", "/nonexistent/dir/x"], {}, ("/nonexistent/dir",)),
    ]
    junk = os.path.join(d, "junk")
    os.makedirs(os.path.join(junk, "dir.tar"))
    open(os.path.join(junk, "empty.tar"), "wb").close()
    with open(os.path.join(junk, "text.tar"), "w") as f:
        f.write("not a tar\n" * 100)
    # gzip data that is not a gzipped tar (a gzipped tar is a compressed shard, and verifies)
    with open(os.path.join(junk, "gz.tar"), "wb") as g:
        g.write(gzip.compress(b"gzipped text, not a tar\n" * 100))
    for name in ("empty.tar", "text.tar", "gz.tar"):
        cases.append((["verify", os.path.join(junk, name)], {}, ()))
    for args, env, words in cases:
        p = run(cli(*args), env=child_env(**env), bound=BOUND)
        row.runs += 1
        row.faults += 1
        verify_failed = args[0] == "verify" and p.rc == 1 and "0 ok, 1 failed" in p.err and "Traceback" not in p.err
        if p.hung:
            row.hung += 1
        elif strict_error(p, *words) or verify_failed:
            row.clear_errors += 1
        else:
            row.bad_exits.append(f"{' '.join(args[:2])}: exit {p.rc}: {last_line(p.err)}")
    row.note = f"{len(cases)} inputs"
    return row


def stdout_full_with_journal(s: Suite) -> Row:
    """``cat --journal > /dev/full``: one-line error, nothing unprinted is
    committed, and the rerun delivers everything exactly once."""
    row = Row("stdout on a full disk (/dev/full) with --journal", "resume")
    if not os.path.exists("/dev/full"):
        row.skip = "no /dev/full"
        return row
    d = s.tmp("devfull")
    j = os.path.join(d, "run.db")
    with open("/dev/full", "w") as full:
        t0 = time.monotonic()
        try:
            q = subprocess.run(cat_cmd(s.data.manifest, journal=j, workers=2, epochs=1), stdout=full,
                               stderr=subprocess.PIPE, text=True, env=child_env(), timeout=BOUND)
            p = Proc(q.returncode, False, False, time.monotonic() - t0, "", q.stderr)
        except subprocess.TimeoutExpired:
            p = Proc(None, False, True, BOUND, "", "")
    row.runs += 1
    row.faults += 1
    if p.hung:
        row.hung += 1
    elif strict_error(p, "stdout", "No space left"):
        row.clear_errors += 1
        row.note = last_line(p.err)[:100]
    else:
        row.bad_exits.append(f"exit {p.rc}: {last_line(p.err)}")
    again = run(cat_cmd(s.data.manifest, journal=j, workers=2, epochs=1), bound=BOUND)
    row.runs += 1
    if again.rc != 0:
        row.bad_exits.append(f"rerun exit {again.rc}: {last_line(again.err)}")
    row.tally.add(compare(s.ref, again.lines, s.data.digests))
    return row


def escaped_keys(s: Suite) -> Row:
    """Keys with TAB, newline, CR, backslash and a non-UTF-8 byte through
    ``cat --workers 2``: every line has three fields and unescapes to the
    key tarfile reads; plain keys are printed byte-identical."""
    row = Row("keys with TAB/newline/CR/backslash/non-UTF-8 -> cat line format", "exact")
    d = s.tmp("keys")
    path = os.path.join(d, "keys.tar")
    names = ["tab\there", "new\nline", "cr\rx", "back\\slash", "plain-0001", "caf\xe9"]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for k in names:
            for ext, data in (("txt", k.encode("latin-1")), ("cls", b"1")):
                ti = tarfile.TarInfo(f"{k}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    want = [k.encode("latin-1").decode("utf-8", "surrogateescape") for k in names]
    p = run(cli("cat", path, "--workers", "2", "--cache-dir", os.path.join(d, "cache")), bound=BOUND)
    row.runs = row.faults = 1
    row.tally.expected = len(want)
    if p.hung:
        row.hung += 1
        return row
    fields = [ln.split("\t") for ln in p.lines]
    row.tally.delivered = len(fields)
    if p.rc != 0:
        row.bad_exits.append(f"exit {p.rc}: {last_line(p.err)}")
    elif len(fields) != len(want) or any(len(f) != 3 for f in fields):
        row.bad_exits.append(f"{len(fields)} lines for {len(want)} samples, or a line without 3 fields")
    elif [unescape_field(f[1]) for f in fields] != want or fields[4][1] != "plain-0001":
        row.tally.corrupt = sum(unescape_field(f[1]) != k for f, k in zip(fields, want))
    row.note = "escaped: " + ", ".join(f[1] for f in fields[:4]) if fields else ""
    return row


def input_hardening_rows() -> List[Scenario]:
    """The input hardening rows, in the order the matrix runs them."""
    return [crafted_tar_sizes, malformed_manifest_input, bad_cli_input, stdout_full_with_journal, escaped_keys]

