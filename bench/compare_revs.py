"""Compare a bench's figures between two git revisions ("no behaviour change").

::

    python bench/compare_revs.py --base REV [--head REV|worktree] [--repeats N]
        [--tolerance 0.05] [--figures REGEX] [--json OUT] -- python bench/bench_read.py --quick

Each revision other than ``worktree`` gets a temporary ``git worktree``
(detached, under ``--tmp``; removed afterwards, also on Ctrl-C or SIGTERM);
``worktree`` (the default ``--head``) is this checkout as it is on disk,
uncommitted edits included.  The command after ``--`` runs in each tree
in turn, base then head, ``--repeats`` times (A B A B ...: interleaved, so
the machine's load drifts hit both sides alike), with the tree as its
working directory and first on ``PYTHONPATH`` (a leading ``python`` is this
interpreter).  Each tree runs its own copy of the bench.

Figures: when the tree's bench has a ``--json`` option (``bench/_common.py``:
its table as a flat ``{"<metric> [<column>]": value}`` dict), the tool adds
``--json <tmp file>`` and reads that; otherwise (an older revision) it
parses the tables the bench printed (``| metric | resumewds | peer | ratio |
target | result |`` and any other ``|``-table: row name + column header),
giving the same keys.  A ``--json`` file of nested lists/dicts (as
``bench_mixing.py --json`` writes) is flattened to ``a/0/b`` keys.

For each figure it prints the base median, the head median, head/base, and
PASS when head/base lies within ``1 +- tolerance`` (a word figure such as a
PASS/FAIL cell passes when its most frequent value is the same on both
sides); a figure found on one side only is shown as info.  Exit status: 0
if every figure passed, 1 if any failed, 2 if a run produced no figures or
git failed.

The machine is shared and noisy: ratios of *peer* figures (webdataset's
own speed) move as much as ours between runs, so read the ``resumewds``
and ``ratio`` columns and use ``--repeats`` >= 3 for a verdict.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _common import FIGURE_COLUMNS, cell_value  # noqa: E402

Value = Union[float, str]
Figures = Dict[str, Value]
WORKTREE = "worktree"


# ---- figures: from a printed table or a --json file ----------------------------------

def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(cells: Sequence[str]) -> bool:
    return all(re.fullmatch(r":?-+:?", c) for c in cells if c) and any(cells)


def parse_tables(text: str) -> Figures:
    """Figures from every ``|``-table in a bench's output: ``"<row> [<column>]"`` -> value.

    The first ``|`` line of a block is the header; rule lines (``|---|``) and
    ``+---+`` borders are skipped.  In the benches' standard table (header
    ``metric | resumewds | peer | ratio | target | result``) only the
    columns resumewds, peer, ratio and result are figures (target is a
    constant); in any other table every column after the first is.  A cell
    gives its first number (:func:`_common.cell_value`) or, without one, its
    text; ``-`` gives nothing.  A row name seen again gets `` #2``, `` #3``.

    Example:
        >>> out = '''
        ... | metric | resumewds | peer | ratio | target | result |
        ... |---|---|---|---|---|---|
        ... | plain samples/s | 58,596 | 11,452 | 5.117x | >= 4x | PASS |
        ... '''
        >>> parse_tables(out)
        {'plain samples/s [resumewds]': 58596.0, 'plain samples/s [peer]': 11452.0, \
'plain samples/s [ratio]': 5.117, 'plain samples/s [result]': 'PASS'}
    """
    out: Figures = {}
    seen: Dict[str, int] = collections.Counter()
    header: Optional[List[str]] = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("+-") or (line.startswith("|") and _is_rule(_cells(line))):
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        standard = header[:1] == ["metric"] and "resumewds" in header
        name = cells[0]
        seen[name] += 1
        if seen[name] > 1:
            name = f"{name} #{seen[name]}"
        for col, cell in zip(header[1:], cells[1:]):
            if standard and col not in FIGURE_COLUMNS:
                continue
            value = cell_value(cell)
            if value is not None:
                out[f"{name} [{col}]"] = value
    return out


def flatten(obj: Any, prefix: str = "") -> Figures:
    """A JSON value as a flat dict of numbers and words: nested keys and list
    indexes joined with ``/``; booleans become ``"True"`` / ``"False"``.

    Example:
        >>> flatten([{"nodes": 1, "checks": {"corr": True}}, {"nodes": 2}])
        {'0/nodes': 1.0, '0/checks/corr': 'True', '1/nodes': 2.0}
    """
    out: Figures = {}
    if isinstance(obj, Mapping):
        items: Iterator[Tuple[str, Any]] = ((str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(obj))
    else:
        if isinstance(obj, bool):
            out[prefix] = str(obj)
        elif isinstance(obj, (int, float)):
            out[prefix] = float(obj)
        elif obj is not None:
            out[prefix] = str(obj)
        return out
    for k, v in items:
        out.update(flatten(v, f"{prefix}/{k}" if prefix else k))
    return out


# ---- medians, ratios, verdicts --------------------------------------------------------

def summarize(values: Sequence[Value]) -> Optional[Value]:
    """Median of numbers; the most frequent value of words (first seen on a tie); None if empty."""
    if not values:
        return None
    nums = [v for v in values if isinstance(v, float)]
    if len(nums) == len(values):
        return float(statistics.median(nums))
    return collections.Counter(str(v) for v in values).most_common(1)[0][0]


def compare(base: Sequence[Figures], head: Sequence[Figures], tolerance: float = 0.05,
            only: Optional[str] = None) -> List[Dict[str, Any]]:
    """One row per figure: ``{"figure", "base", "head", "ratio", "result"}``.

    ``base`` / ``head`` hold one figure dict per run.  ``result`` is ``PASS``
    when head/base of the medians lies within ``[1 - tolerance, 1 + tolerance]``
    (both zero: ratio 1), ``FAIL`` otherwise; for words, ``PASS`` when the
    most frequent values are equal; ``info`` for a figure on one side only.
    ``only``: a regular expression the figure's name must contain.

    Example:
        >>> rows = compare([{"x [ratio]": 5.0}], [{"x [ratio]": 5.1}], tolerance=0.05)
        >>> rows[0]["ratio"], rows[0]["result"]
        (1.02, 'PASS')
    """
    names: List[str] = []
    for runs in (base, head):
        for figs in runs:
            names.extend(k for k in figs if k not in names)
    if only:
        pattern = re.compile(only)
        names = [n for n in names if pattern.search(n)]
    rows = []
    for n in names:
        b = summarize([f[n] for f in base if n in f])
        h = summarize([f[n] for f in head if n in f])
        ratio: Optional[float] = None
        if b is None or h is None:
            result = "info"
        elif isinstance(b, float) and isinstance(h, float):
            if b == 0:
                ratio = 1.0 if h == 0 else float("inf")
            else:
                ratio = round(h / b, 6)
            result = "PASS" if abs(ratio - 1) <= tolerance + 1e-12 else "FAIL"
        else:
            result = "PASS" if str(b) == str(h) else "FAIL"
        rows.append({"figure": n, "base": b, "head": h, "ratio": ratio, "result": result})
    return rows


def _fmt(v: Optional[Value]) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return v


def format_rows(rows: Sequence[Dict[str, Any]], base_label: str, head_label: str) -> str:
    """The comparison as a Markdown table."""
    head = ("figure", f"base ({base_label}) median", f"head ({head_label}) median", "head/base", "result")
    body = [(r["figure"], _fmt(r["base"]), _fmt(r["head"]),
             "-" if r["ratio"] is None else f"{r['ratio']:.3f}x", r["result"]) for r in rows]
    w = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(head)) + " |",
             "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    lines += ["| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) + " |"
              for r in body]
    return "\n".join(lines)


# ---- git worktrees and runs -----------------------------------------------------------

def _git(args: Sequence[str], cwd: str) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {(p.stderr or p.stdout).strip()}")
    return p.stdout.strip()


class Trees:
    """The two trees to run in: temporary detached worktrees of revisions (or
    this checkout for ``worktree``), removed by :meth:`close`."""

    def __init__(self, repo: str, tmp: Optional[str] = None):
        self.repo = repo
        self.parent = tempfile.mkdtemp(prefix="rw-compare-", dir=tmp)
        self.added: List[str] = []

    def tree(self, rev: str, label: str) -> Tuple[str, str]:
        """``(path, description)`` of a tree at ``rev``."""
        if rev == WORKTREE:
            dirty = _git(["status", "--porcelain", "--untracked-files=no"], self.repo)
            return self.repo, f"worktree at {_git(['rev-parse', '--short', 'HEAD'], self.repo)}" + \
                (" + uncommitted edits" if dirty else "")
        try:
            sha = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], self.repo)
        except RuntimeError:
            raise RuntimeError(f"unknown git revision {rev!r} in {self.repo}") from None
        path = os.path.join(self.parent, label)
        _git(["worktree", "add", "--detach", "--quiet", path, sha], self.repo)
        self.added.append(path)
        return path, f"{rev} = {sha[:10]}"

    def close(self) -> None:
        for path in self.added:
            try:
                _git(["worktree", "remove", "--force", path], self.repo)
            except RuntimeError as exc:
                print(f"# warning: {exc}", file=sys.stderr)
        self.added = []
        try:
            _git(["worktree", "prune"], self.repo)
        except RuntimeError:
            pass
        shutil.rmtree(self.parent, ignore_errors=True)


def _command(cmd: Sequence[str]) -> List[str]:
    cmd = list(cmd)
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


def _env(tree: str, repo: str) -> Dict[str, str]:
    env = dict(os.environ)
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.realpath(p) not in (os.path.realpath(repo), os.path.realpath(tree))]
    env["PYTHONPATH"] = os.pathsep.join([tree, *keep])
    return env


def _run(cmd: Sequence[str], cwd: str, env: Mapping[str, str], timeout: float) -> Tuple[int, str, str]:
    """Run ``cmd`` in its own session; on timeout or interrupt kill its process group."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return proc.returncode, out, err


def supports_json(cmd: Sequence[str], cwd: str, env: Mapping[str, str]) -> bool:
    """Whether the tree's bench lists a ``--json`` option in its ``--help``."""
    try:
        rc, out, _ = _run([*cmd, "--help"], cwd, env, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return rc == 0 and re.search(r"(^|\s)--json\b", out) is not None


def run_once(cmd: Sequence[str], cwd: str, env: Mapping[str, str], use_json: bool,
             timeout: float) -> Tuple[Figures, int, str]:
    """One run: ``(figures, exit status, output)``."""
    path = None
    args = list(cmd)
    if use_json:
        fd, path = tempfile.mkstemp(prefix="rw-compare-", suffix=".json")
        os.close(fd)
        os.unlink(path)
        args += ["--json", path]
    try:
        rc, out, err = _run(args, cwd, env, timeout)
        figs: Figures = {}
        if path and os.path.exists(path) and os.path.getsize(path):
            with open(path) as fh:
                figs = flatten(json.load(fh))
        if not figs:
            figs = parse_tables(out)
        return figs, rc, out + err
    finally:
        if path and os.path.exists(path):
            os.unlink(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: compare_revs.py --base REV [--head REV|worktree] [--repeats N] -- <bench command>",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    own, cmd = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="git revision of the base")
    p.add_argument("--head", default=WORKTREE, help="git revision, or 'worktree' (default: this checkout)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side, interleaved A B A B ...")
    p.add_argument("--tolerance", type=float, default=0.05, help="PASS when |head/base - 1| <= this")
    p.add_argument("--figures", default=None, metavar="REGEX", help="compare only figures matching REGEX")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per bench run")
    p.add_argument("--tmp", default=None, help="parent directory of the temporary worktrees")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the comparison to OUT")
    p.add_argument("--repo", default=None, help="the git checkout (default: the one holding this file)")
    args = p.parse_args(own)
    if not cmd:
        p.error("no bench command after --")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    cmd = _command(cmd)
    try:
        repo = _git(["rev-parse", "--show-toplevel"], args.repo or HERE)
    except RuntimeError as exc:
        print(f"compare_revs: {exc}", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    trees = Trees(repo, args.tmp)
    try:
        try:
            sides = [("base", *trees.tree(args.base, "base")), ("head", *trees.tree(args.head, "head"))]
        except RuntimeError as exc:
            print(f"compare_revs: {exc}", file=sys.stderr)
            return 2
        json_ok = {}
        for side, path, desc in sides:
            json_ok[side] = supports_json(cmd, path, _env(path, repo))
            print(f"# {side}: {desc} ({path}); figures from "
                  f"{'--json' if json_ok[side] else 'the printed tables'}", flush=True)
        print(f"# command: {shlex.join(cmd)}; {args.repeats} run(s) per side, interleaved", flush=True)
        runs: Dict[str, List[Figures]] = {"base": [], "head": []}
        for r in range(args.repeats):
            for side, path, _ in sides:
                t0 = time.perf_counter()
                figs, rc, output = run_once(cmd, path, _env(path, repo), json_ok[side], args.timeout)
                print(f"#  run {r + 1} {side}: {len(figs)} figures, exit {rc}, "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
                if not figs:
                    print(f"compare_revs: the {side} run gave no figures (exit {rc}); its output ends:\n"
                          + "\n".join(output.strip().splitlines()[-20:]), file=sys.stderr)
                    return 2
                runs[side].append(figs)
    except KeyboardInterrupt:
        print("compare_revs: interrupted; temporary worktrees removed", file=sys.stderr)
        return 130
    finally:
        trees.close()
        signal.signal(signal.SIGTERM, old_term)
    rows = compare(runs["base"], runs["head"], args.tolerance, args.figures)
    print()
    print(format_rows(rows, args.base, args.head))
    failed = sum(r["result"] == "FAIL" for r in rows)
    passed = sum(r["result"] == "PASS" for r in rows)
    print(f"\n{passed} within {args.tolerance:.0%}, {failed} outside, "
          f"{len(rows) - passed - failed} on one side only")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"base": args.base, "head": args.head, "command": cmd, "tolerance": args.tolerance,
                       "rows": rows, "runs": runs}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
