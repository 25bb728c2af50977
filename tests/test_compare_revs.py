"""bench/compare_revs.py: figure parsing, medians, ratios, verdicts, and a real two-revision
run over a tiny git repository (no bench of this project is run)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import _common as C  # type: ignore[import-not-found, unused-ignore]  # noqa: E402, I001
import compare_revs as CR  # type: ignore[import-not-found, unused-ignore]  # noqa: E402


def _printed(table: C.Table) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        table.print()
    return buf.getvalue()


def _table() -> C.Table:
    t = C.Table("demo --quick")
    t.add("plain samples/s: WebLoader", 58596.4, 11452.2, target=4)
    t.add("CPU us/sample (ratio = peer/ours)", 17.54, 89.21, ratio=89.21 / 17.54, fmt="{:,.1f}")
    t.add("faulted pass wall s", 0.4213, 0.35, target=2, higher_is_better=False, fmt="{:.2f}", unit="s")
    t.add("decode nw=2", 900.0, 1000.0, target=1)
    t.add_raw("time inside commit / loop", "4.43%", "-", "-", "<= 2%", False)
    t.add_raw("all passes identical", "4800 x 6", "13 faults", "-", "identical", True)
    return t


def test_cell_value() -> None:
    assert C.cell_value("58,596") == 58596.0
    assert C.cell_value(" 5.117x ") == 5.117
    assert C.cell_value("0.42s") == 0.42
    assert C.cell_value("1.80%") == 1.8
    assert C.cell_value("32,553 (29,194..35,555)") == 32553.0
    assert C.cell_value("-0.5") == -0.5
    assert C.cell_value("1.5e-05") == 1.5e-05
    assert C.cell_value("PASS") == "PASS"
    assert C.cell_value("exact/exact") == "exact/exact"
    assert C.cell_value("-") is None and C.cell_value("") is None and C.cell_value("n/a") is None


def test_printed_table_and_json_give_the_same_figures(tmp_path) -> None:
    t = _table()
    parsed = CR.parse_tables(_printed(t))
    exact = t.figures()
    assert set(parsed) == set(exact)
    for k, v in exact.items():
        if isinstance(v, float):
            assert parsed[k] == pytest.approx(v, rel=1e-3, abs=0.051), k  # printed rounded
        else:
            assert parsed[k] == v, k
    assert "plain samples/s: WebLoader [target]" not in parsed  # a constant, not a figure
    assert exact["plain samples/s: WebLoader [ratio]"] == pytest.approx(58596.4 / 11452.2)
    assert exact["decode nw=2 [result]"] == "FAIL"
    assert parsed["time inside commit / loop [resumewds]"] == 4.43
    assert parsed["all passes identical [peer]"] == 13.0

    # --json: parse_args records the path; print() writes every table of the process
    path = tmp_path / "f.json"
    C._FIGURES.clear()
    args = C.parse_args("x", ["--quick", "--json", str(path)])
    try:
        assert args.json == str(path)
        _printed(t)
        t2 = C.Table("second")
        t2.add("other", 1.0, 2.0)
        _printed(t2)
        data = json.loads(path.read_text())
        assert data["other [ratio]"] == 0.5 and data["decode nw=2 [resumewds]"] == 900.0
        assert CR.flatten(data) == data  # flat already
    finally:
        C.JSON_PATH = None
        C._FIGURES.clear()


def test_parse_markdown_tables_rules_and_repeated_rows() -> None:
    out = textwrap.dedent("""\
        # a progress line | with a bar
        | figure | resumewds | webdataset | ours/webdataset |
        |:-------|---------:|-----------:|---|
        | no decode, samples/s | 32,553 (29,194..35,555) | 10,231 (6,641..10,649) | 3.18x |
        | resume exact | exact/exact | - | |
        text between tables
        | metric | resumewds | peer | ratio | target | result |
        +--------+
        | x | 1 | 2 | 0.500x | >= 1x | FAIL |
        | x | 3 | 2 | 1.500x | >= 1x | PASS |
        """)
    f = CR.parse_tables(out)
    assert f["no decode, samples/s [resumewds]"] == 32553.0
    assert f["no decode, samples/s [ours/webdataset]"] == 3.18
    assert f["resume exact [resumewds]"] == "exact/exact"
    assert "resume exact [webdataset]" not in f
    assert f["x [ratio]"] == 0.5 and f["x #2 [ratio]"] == 1.5 and f["x #2 [result]"] == "PASS"
    assert "x [target]" not in f
    assert not any(k.startswith("# a progress") for k in f)


def test_flatten_nested_json() -> None:
    data = [{"nodes": 1, "figures": {"resumewds": {"adjacent": 0.125}}, "checks": {"r": {"corr": False}}}]
    assert CR.flatten(data) == {"0/nodes": 1.0, "0/figures/resumewds/adjacent": 0.125,
                                "0/checks/r/corr": "False"}


def test_summarize_median_and_words() -> None:
    assert CR.summarize([3.0, 1.0, 2.0]) == 2.0
    assert CR.summarize([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert CR.summarize(["PASS", "FAIL", "PASS"]) == "PASS"
    assert CR.summarize([]) is None


def test_compare_ratios_and_verdicts() -> None:
    base: list[CR.Figures] = [{"a": 100.0, "b": 10.0, "z": 0.0, "w": "PASS", "gone": 1.0},
            {"a": 102.0, "b": 10.0, "z": 0.0, "w": "PASS", "gone": 1.0},
            {"a": 98.0, "b": 10.0, "z": 0.0, "w": "PASS", "gone": 1.0}]
    head: list[CR.Figures] = [{"a": 105.0, "b": 9.0, "z": 0.0, "w": "FAIL", "new": 2.0},
            {"a": 104.0, "b": 9.6, "z": 0.0, "w": "PASS", "new": 2.0},
            {"a": 200.0, "b": 9.4, "z": 0.0, "w": "FAIL", "new": 2.0}]
    rows = {r["figure"]: r for r in CR.compare(base, head, tolerance=0.05)}
    assert rows["a"]["base"] == 100.0 and rows["a"]["head"] == 105.0  # medians: one outlier ignored
    assert rows["a"]["ratio"] == pytest.approx(1.05) and rows["a"]["result"] == "PASS"  # boundary included
    assert rows["b"]["ratio"] == pytest.approx(0.94) and rows["b"]["result"] == "FAIL"
    assert rows["z"]["ratio"] == 1.0 and rows["z"]["result"] == "PASS"
    assert rows["w"]["base"] == "PASS" and rows["w"]["head"] == "FAIL" and rows["w"]["result"] == "FAIL"
    assert rows["gone"]["result"] == "info" and rows["gone"]["head"] is None
    assert rows["new"]["result"] == "info" and rows["new"]["base"] is None
    assert CR.compare([{"z": 0.0}], [{"z": 1.0}])[0]["result"] == "FAIL"
    assert [r["figure"] for r in CR.compare(base, head, only=r"^(a|b)$")] == ["a", "b"]
    assert CR.compare(base, head, tolerance=0.07, only="^b$")[0]["result"] == "PASS"
    text = CR.format_rows(CR.compare(base, head), "HEAD~1", "worktree")
    assert "base (HEAD~1) median" in text and "| a " in text and "1.050x" in text


SCRIPT = '''\
import argparse
import os
p = argparse.ArgumentParser()
p.add_argument("--quick", action="store_true")
{json_arg}
args = p.parse_args()
speed = float(open(os.path.join(os.path.dirname(__file__), "speed.txt")).read())
rows = [("loop samples/s", f"{{speed:,.0f}}", "1,000", f"{{speed / 1000:.3f}}x", ">= 1x",
         "PASS" if speed >= 1000 else "FAIL")]
print("| metric | resumewds | peer | ratio | target | result |")
for r in rows:
    print("| " + " | ".join(r) + " |")
{json_write}
'''


def _commit(repo, speed: str, with_json: bool) -> None:
    b = repo / "bench"
    b.mkdir(exist_ok=True)
    (b / "speed.txt").write_text(speed)
    (b / "b.py").write_text(SCRIPT.format(
        json_arg='p.add_argument("--json")' if with_json else "",
        json_write=('if args.json:\n    import json\n    json.dump({"loop samples/s [resumewds]": speed, '
                    '"loop samples/s [ratio]": speed / 1000, "loop samples/s [peer]": 1000.0, '
                    '"loop samples/s [result]": rows[0][5]}, open(args.json, "w"))') if with_json else ""))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", f"speed {speed}"], check=True)


def test_two_revisions_in_temporary_worktrees(tmp_path, capsys) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "1500", with_json=False)   # base: prints a table only (an older revision)
    _commit(repo, "1530", with_json=True)    # head: also --json
    (repo / "bench" / "speed.txt").write_text("900")  # an uncommitted edit: the "worktree" side
    wt_parent = tmp_path / "wts"
    wt_parent.mkdir()
    out_json = tmp_path / "cmp.json"
    rc = CR.main(["--repo", str(repo), "--base", "HEAD~1", "--head", "HEAD", "--repeats", "2",
                  "--tmp", str(wt_parent), "--json", str(out_json), "--", "python", "bench/b.py", "--quick"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "base: HEAD~1" in out and "figures from the printed tables" in out and "figures from --json" in out
    data = json.loads(out_json.read_text())
    rows = {r["figure"]: r for r in data["rows"]}
    assert rows["loop samples/s [resumewds]"]["base"] == 1500.0
    assert rows["loop samples/s [resumewds]"]["head"] == 1530.0
    assert rows["loop samples/s [resumewds]"]["ratio"] == pytest.approx(1.02)
    assert rows["loop samples/s [result]"]["result"] == "PASS"
    assert len(data["runs"]["base"]) == len(data["runs"]["head"]) == 2
    # the temporary worktrees are gone, from disk and from git's list
    assert os.listdir(wt_parent) == []
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1

    # head = this checkout with its uncommitted edit: 900 vs 1500 is outside 5%, exit 1
    rc = CR.main(["--repo", str(repo), "--base", "HEAD", "--repeats", "1", "--tmp", str(wt_parent),
                  "--", "python", "bench/b.py"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "worktree at" in out, out
    assert "uncommitted edits" in out, out
    assert "0.588x" in out and "FAIL" in out, out
    assert os.listdir(wt_parent) == []


def test_bad_revision_and_no_figures(tmp_path, capsys) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "1500", with_json=False)
    assert CR.main(["--repo", str(repo), "--base", "no-such-rev", "--tmp", str(tmp_path),
                    "--", "python", "bench/b.py"]) == 2
    assert "unknown git revision 'no-such-rev'" in capsys.readouterr().err
    rc = CR.main(["--repo", str(repo), "--base", "HEAD", "--repeats", "1", "--tmp", str(tmp_path),
                  "--", "python", "-c", "print('no table here')"])
    assert rc == 2
    assert "gave no figures" in capsys.readouterr().err
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1


def test_interrupt_kills_the_bench_and_removes_the_worktrees(tmp_path) -> None:
    import signal
    import time

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "slow.py").write_text(
        "import os, sys, time\n"
        "if '--help' in sys.argv:\n    sys.exit(0)\n"
        "open(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n")
    _commit(repo, "1500", with_json=False)
    pidfile = tmp_path / "pid"
    wts = tmp_path / "wts"
    wts.mkdir()
    # Ctrl-C as a terminal sends it: the tool starts with SIGINT's default
    # action, whatever this process inherited (a shell's background job, or a
    # CI runner's, starts with SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: the test hung for its 60 s)
    restore = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", restore, os.path.join(BENCH, "compare_revs.py"),
                             "--repo", str(repo), "--base", "HEAD", "--head", "HEAD", "--tmp", str(wts),
                             "--", "python", "slow.py"],
                            env=dict(os.environ, PIDFILE=str(pidfile)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        bench_pid = int(pidfile.read_text())
        assert len(os.listdir(wts)) == 1  # the tool's temp dir, holding the two worktrees
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert os.listdir(wts) == []
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1
    for _ in range(100):  # the bench was killed (and reaped by the tool)
        try:
            os.kill(bench_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"bench process {bench_pid} still alive")
