"""The docs keep one source for each fact, and say what the code does.

* The README starts with the two set-up commands, and ``.ci/run`` runs the
  second one verbatim.
* A README paragraph never copies a paragraph of ``docs/``, ``bench/README.md``
  or ``CHANGELOG.md`` (a copy drifts: keep one source and link to it). A copy
  that must exist is a generated block, ``<!-- BEGIN GENERATED name -->`` ...
  ``<!-- END GENERATED name -->``, whose text must equal what its generator
  makes from the source (the errors tree in ``docs/USAGE.md``);
  ``python tests/test_docs.py --fix`` rewrites them.
* Every relative link and ``#anchor`` in the Markdown files resolves.
* Facts the README and docs state are checked against the code: the loader
  state's keys and the ``resumewds cat`` line-format contract (``docs/USAGE.md``),
  the ``loader.stats()`` fields (``docs/STATS.md``), the CLI commands (the
  README), the ``RESUMEWDS_*`` variables (every Markdown file).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from typing import Callable, Dict, Iterator, List, Set, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
USAGE = "docs/USAGE.md"  # the user's manual: the state keys, the cat contract, the errors tree


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def markdown_files() -> List[str]:
    """The repository's Markdown documents (relative paths)."""
    out = ["README.md", "CHANGELOG.md", "bench/README.md"]
    out += sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md"))
    return [p for p in out if os.path.exists(os.path.join(REPO, p))]


# -- generated blocks ---------------------------------------------------------

def _errors_tree() -> str:
    """The error tree drawn in resumewds/errors.py's module docstring."""
    import resumewds.errors

    doc = inspect.getdoc(resumewds.errors) or ""
    lines = doc.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().split("  ")[0] == "ResumeWDSError")
    tree: List[str] = []
    for ln in lines[start:]:
        if not ln.strip():
            break
        tree.append(ln)
    indent = min(len(ln) - len(ln.lstrip()) for ln in tree)
    return "```text\n" + "\n".join(ln[indent:].rstrip() for ln in tree) + "\n```\n"


GENERATORS: Dict[str, Callable[[], str]] = {
    "errors-tree": _errors_tree,
}

_BLOCK = re.compile(r"(<!-- BEGIN GENERATED ([\w-]+)(?::[^>]*)? -->\n)(.*?)(<!-- END GENERATED \2 -->)", re.S)


def generated_blocks(text: str) -> Iterator[Tuple[str, str]]:
    for m in _BLOCK.finditer(text):
        yield m.group(2), m.group(3)


def regenerate(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in GENERATORS:
            raise KeyError(f"no generator for the block {name!r}")
        return m.group(1) + GENERATORS[name]() + m.group(4)

    return _BLOCK.sub(sub, text)


def _strip_generated(text: str) -> str:
    return _BLOCK.sub("", text)


# -- paragraphs, copies -------------------------------------------------------

def paragraphs(text: str) -> List[str]:
    """Blank-line separated blocks of prose and tables; fenced code is left out."""
    out: List[str] = []
    cur: List[str] = []
    fence = False
    for ln in text.splitlines():
        if ln.lstrip().startswith("```"):
            fence = not fence
            if cur:
                out.append("\n".join(cur))
                cur = []
            continue
        if fence:
            continue
        if ln.strip():
            cur.append(ln)
        elif cur:
            out.append("\n".join(cur))
            cur = []
    if cur:
        out.append("\n".join(cur))
    return out


SHINGLE = 6        # words per shingle
MIN_WORDS = 25     # shorter paragraphs (headings, one-line pointers) may repeat
MAX_SHARED = 0.5   # share of a paragraph's shingles found in another document


def _words(text: str) -> List[str]:
    return re.findall(r"\w+", text.lower())


def shingles(words: List[str]) -> Set[Tuple[str, ...]]:
    return {tuple(words[i:i + SHINGLE]) for i in range(max(0, len(words) - SHINGLE + 1))}


def copied_paragraphs(text: str, sources: Dict[str, str]) -> List[Tuple[str, str, float]]:
    """``(source, paragraph start, share)`` for each paragraph of ``text`` that copies a source."""
    index = {name: shingles(_words(_strip_generated(body))) for name, body in sources.items()}
    found = []
    for para in paragraphs(_strip_generated(text)):
        words = _words(para)
        if len(words) < MIN_WORDS:
            continue
        mine = shingles(words)
        for name, theirs in index.items():
            share = len(mine & theirs) / len(mine)
            if share > MAX_SHARED:
                found.append((name, " ".join(para.split())[:80], round(share, 2)))
    return found


# -- links and anchors --------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text: str) -> Set[str]:
    seen: Dict[str, int] = {}
    out = set()
    fence = False
    for ln in text.splitlines():
        if ln.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"#{1,6} (.+)", ln)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(rel: str) -> List[str]:
    text = _read(rel)
    prose = "\n".join(p for p in paragraphs(text))  # no links inside code
    bad = []
    for target in _LINK.findall(prose):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, frag = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
        if not os.path.exists(os.path.join(REPO, dest)):
            bad.append(f"{rel}: link to a missing file {target!r}")
            continue
        if frag:
            if not dest.endswith(".md"):
                bad.append(f"{rel}: anchor on a non-Markdown file {target!r}")
            elif frag not in anchors(_read(dest)):
                bad.append(f"{rel}: no heading for the anchor {target!r} in {dest}")
    return bad


# -- the tests ----------------------------------------------------------------

def _setup_commands() -> List[str]:
    text = _read("README.md")
    m = re.match(r"# [^\n]+\n\n```bash\n(.*?)```\n", text, re.S)
    assert m, "README.md must start with its title and then one ```bash block of set-up commands"
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


def test_readme_starts_with_exactly_two_setup_commands():
    demo, tests = _setup_commands()[0], _setup_commands()[1]
    assert len(_setup_commands()) == 2
    assert demo.endswith("&& resumewds demo"), demo
    assert "[test]" not in demo, "the demo command installs only what the demo needs"
    assert tests.endswith("&& python -m pytest -q"), tests
    assert "'.[test]'" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    test_cmd = _setup_commands()[1]
    assert test_cmd in _read(".ci/run").splitlines()


def test_generated_blocks_match_their_sources():
    found = set()
    for rel in markdown_files():
        text = _read(rel)
        for name, body in generated_blocks(text):
            found.add((rel, name))
            assert name in GENERATORS, f"{rel}: no generator for the block {name!r}"
            assert body == GENERATORS[name](), (f"{rel}: the generated block {name!r} drifted from its "
                                                f"source; run python tests/test_docs.py --fix")
    assert (USAGE, "errors-tree") in found, f"{USAGE} has no generated block of the errors tree"


def test_readme_copies_no_paragraph_of_another_document():
    sources = {rel: _read(rel) for rel in markdown_files() if rel != "README.md"}
    copies = copied_paragraphs(_read("README.md"), sources)
    assert not copies, ("README paragraphs copied from another document (keep one source, link to it, "
                        f"or generate the copy): {copies}")


def test_a_drifted_copy_is_caught():
    """The copy check fails on a docs paragraph pasted into the README and then edited."""
    src = _read("docs/GUARANTEES.md")
    para = next(p for p in paragraphs(src) if p.startswith("**Exactly once"))
    drifted = para.replace("in the same order", "in a similar order").replace("SIGKILL", "SIGTERM")
    readme = _read("README.md") + "\n\n" + drifted + "\n"
    assert [c[0] for c in copied_paragraphs(readme, {"docs/GUARANTEES.md": src})] == ["docs/GUARANTEES.md"]


def test_a_drifted_generated_block_is_caught():
    text = ("<!-- BEGIN GENERATED errors-tree -->\n" + _errors_tree().replace("DecodeError", "DecodingError")
            + "<!-- END GENERATED errors-tree -->\n")
    (name, body), = generated_blocks(text)
    assert body != GENERATORS[name]()
    assert regenerate(text) == ("<!-- BEGIN GENERATED errors-tree -->\n" + _errors_tree()
                                + "<!-- END GENERATED errors-tree -->\n")


@pytest.mark.parametrize("rel", markdown_files())
def test_links_and_anchors_resolve(rel):
    assert broken_links(rel) == []


def test_anchor_slugs_follow_github():
    assert slug("`loader.stats()`") == "loaderstats"
    assert slug("Limits (what is not promised)") == "limits-what-is-not-promised"
    assert slug("The `resumewds cat` line format (a stable contract)") == \
        "the-resumewds-cat-line-format-a-stable-contract"


# The stable contract: these lines stay, in this order (the section may grow).
CAT_CONTRACT = """\
`resumewds cat` prints one line per delivered sample:
SHARD<TAB>KEY<TAB>DIGEST
* `SHARD` is the basename of the shard's URL.
* `KEY` is the sample's `__key__`.
* `DIGEST` is the xxh3_64 hex digest of the sample's member bytes,
  concatenated in ascending order of extension name
  (`resumewds.sample_digest`).
Two runs delivered the same samples, in the same order and with the same
bytes, exactly when their outputs are equal. With `--journal`, stdout is
flushed before each commit. A run killed at any moment and rerun with the
same arguments therefore starts its output with the sample right after the
last commit.
"""


def _section(text: str, heading: str) -> str:
    i = text.index(heading + "\n")
    level = heading.split(" ")[0]
    rest = text[i + len(heading) + 1:]
    m = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return rest[:m.start()] if m else rest


def test_cat_line_format_contract_is_kept_verbatim():
    section = _section(_read(USAGE), "### The `resumewds cat` line format (a stable contract)")
    lines = [ln for ln in section.splitlines() if ln.strip() and not ln.startswith("```")]
    want = CAT_CONTRACT.splitlines()
    it = iter(lines)
    missing = [w for w in want if not any(w == ln for ln in it)]
    assert not missing, f"the cat contract lost or reordered: {missing}"


def test_documented_state_keys_are_the_state_dicts_keys(shards):
    import resumewds as rw

    m = re.search(r"The state is a dict with the keys\s+((?:`\w+`(?:,\s+|\s+and\s+)?)+)", _read(USAGE))
    assert m, f"{USAGE} no longer lists the loader state's keys"
    documented = set(re.findall(r"`(\w+)`", m.group(1)))
    loader = rw.WebLoader(rw.WebDataset(shards), batch_size=4)
    try:
        assert documented == set(loader.state_dict())
    finally:
        loader.close()


def test_documented_stats_fields_are_the_stats_fields(shards):
    import resumewds as rw

    table = _section(_read("docs/STATS.md"), "## `loader.stats()`")
    documented: Set[str] = set()
    for ln in table.splitlines():
        if ln.startswith("| `"):
            documented |= set(re.findall(r"`(\w+)`", ln.split("|")[1]))
    loader = rw.WebLoader(rw.WebDataset(shards), batch_size=4)
    try:
        for _ in loader:
            pass
        produced = set(loader.stats())
    finally:
        loader.close()
    assert produced - documented == set(), "fields of loader.stats() missing from docs/STATS.md"
    assert documented - produced == set(), "docs/STATS.md documents fields loader.stats() does not have"


def test_readme_names_every_cli_command_and_no_other():
    from resumewds.cli._main import cli

    text = _read("README.md")
    block = re.search(r"## Command line\n\n```\n(.*?)```", text, re.S)
    assert block
    named = set(re.findall(r"^resumewds (\w+)|/ resumewds (\w+)", block.group(1), re.M))
    named_flat = {a or b for a, b in named}
    assert named_flat == set(cli.commands)


#: dated history: it names variables as they were then (a removed one, where it says so)
HISTORY = ("CHANGELOG.md", "bench/README.md")


def test_documented_environment_variables_exist():
    """Every RESUMEWDS_* variable the manual (README, docs/) names is read by the
    code; the history files may name removed ones, the CHANGELOG where it says so."""
    source = ""
    for root, _, files in os.walk(os.path.join(REPO, "resumewds")):
        for n in files:
            if n.endswith(".py"):
                with open(os.path.join(root, n), encoding="utf-8") as f:
                    source += f.read()
    unknown = set()
    for rel in markdown_files():
        if rel in HISTORY:
            continue
        for var in re.findall(r"RESUMEWDS_[A-Z0-9_]*[A-Z0-9]", _read(rel)):
            if var not in source:
                unknown.add(f"{rel}: {var}")
    assert not unknown
    removed = [v for v in set(re.findall(r"RESUMEWDS_[A-Z0-9_]*[A-Z0-9]", _read("CHANGELOG.md"))) if v not in source]
    said = _read("CHANGELOG.md").split("**Removed**")
    assert all(any(v in part.split("\n- ")[0] for part in said[1:]) for v in removed), \
        f"variables gone from the code that no **Removed** entry of the CHANGELOG names: {removed}"


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description="Check (or with --fix, rewrite) the docs' generated blocks.")
    p.add_argument("--fix", action="store_true", help="rewrite every generated block from its source")
    a = p.parse_args(argv)
    sys.path.insert(0, REPO)
    stale = []
    for rel in markdown_files():
        text = _read(rel)
        new = regenerate(text)
        if new != text:
            stale.append(rel)
            if a.fix:
                with open(os.path.join(REPO, rel), "w", encoding="utf-8") as f:
                    f.write(new)
    verb = "rewrote" if a.fix else "stale (run with --fix)"
    for rel in stale:
        print(f"{verb}: {rel}")
    return 1 if stale and not a.fix else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ---- the project speaks of itself only ----------------------------------------------
_HISTORY = re.compile(r"\b[Ii]ssues? #?\d+|\b[Ss]tops? \d+\b|\bengineer H\d\b|\(H\d[a-z]?[,)]")


def _history_mentions(root: str) -> List[str]:
    """Lines of the code, tests, docs and scripts that name an issue or a work session
    (the CHANGELOG keeps history by date and version, and is left out)."""
    found = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("build", "dist", "__pycache__")
                       and not d.endswith(".egg-info")]
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            if not f.endswith((".py", ".md", ".toml", ".cfg", ".txt")) and rel != os.path.join(".ci", "run"):
                continue
            if rel == "CHANGELOG.md" or rel.startswith(os.path.join("tests", "compat") + os.sep):
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    if _HISTORY.search(line):
                        found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_issue_or_session_numbers_outside_the_changelog():
    assert _history_mentions(REPO) == []


def test_history_mentions_are_found(tmp_path):
    issue, stop = "iss" + "ue", "st" + "op"  # spelled apart: this file is scanned too
    (tmp_path / "a.py").write_text(f'"""Fixes ({issue} 12)."""\n# fine: a t{issue} 5 is not an {issue}\n')
    (tmp_path / "CHANGELOG.md").write_text(f"{issue} 3\n")
    (tmp_path / "b.md").write_text(f"at {stop} 21 the bench...\n")
    assert sorted(x.split(":")[0] for x in _history_mentions(str(tmp_path))) == ["a.py", "b.md"]
