"""docs/ARCHITECTURE.md names only what exists: every file of its layout, and
every ``module.name`` / ``Class.member`` / private name it puts in backticks.

A contributor map that names files and functions that are gone misleads more
than no map at all; this keeps it honest as the code moves.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterator, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
PKG = os.path.join(ROOT, "resumewds")

_FILE_SUFFIXES = {"py", "md", "db", "lock", "dl", "partial", "etag", "json", "tar", "meta", "txt", "sh"}
_FILE = re.compile(r"^[\w.-]+(\.py|\.md|/)$")
_DEF = r"(?:^|\n)[ \t]*(?:def|class|async def)\s+{0}\b|(?:^|\n)[ \t]*(?:self\.)?{0}\s*[:=]|\b{0}\s*=\s*"


def _layout_block(text: str) -> List[str]:
    m = re.search(r"## Repository layout\s*\n```[^\n]*\n(.*?)\n```", text, re.S)
    assert m, "docs/ARCHITECTURE.md has no '## Repository layout' code block"
    return m.group(1).splitlines()


def layout_paths(text: str) -> Iterator[Tuple[str, str]]:
    """(path relative to the repository, the line) for every file or folder the layout names."""
    stack: List[Tuple[int, str]] = []  # (indent, folder)
    prev = ""
    for line in _layout_block(text):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        names: List[str] = []
        for tok in line.split():
            if not _FILE.match(tok.rstrip(",")) or (names and not prev.endswith(",")):
                break
            names.append(tok.rstrip(","))
            prev = tok
        if not names:
            continue  # a continuation of the description above
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = "/".join(f.rstrip("/") for _, f in stack)
        for n in names:
            yield (f"{base}/{n}" if base else n).rstrip("/"), line
        if len(names) == 1 and names[0].endswith("/"):
            stack.append((indent, names[0]))


def _sources() -> Dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                with open(p, encoding="utf-8") as fh:
                    out[os.path.relpath(p, PKG)] = fh.read()
    return out


def _modules_named(name: str, sources: Dict[str, str]) -> List[str]:
    parts = name.split(".")
    tails = {"/".join(parts) + ".py", "/".join(parts) + "/__init__.py"}
    return [p for p in sources if any(p == t or p.endswith("/" + t) for t in tails)]


def _defines(src: str, name: str) -> bool:
    return re.search(_DEF.format(re.escape(name)), src) is not None


def dangling_names(text: str) -> List[str]:
    """Backticked ``a.b`` and ``_private`` names of the doc that the package does not define."""
    sources = _sources()
    every = "\n".join(sources.values())
    bad: List[str] = []
    seen: Set[str] = set()
    for tok in re.findall(r"`([^`\n]+)`", text):
        tok = re.sub(r"\(.*$", "", tok).strip()  # plan.sample_at(epoch, i) -> plan.sample_at
        if tok in seen or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+|_\w+", tok):
            continue
        seen.add(tok)
        if tok.startswith(("resumewds.", "os.", "http.", "sys.", "torch.")) and not tok.startswith("resumewds."):
            continue
        parts = tok.split(".")
        if parts[-1] in _FILE_SUFFIXES or (len(parts) > 1 and len(parts[0]) == 1):
            continue  # a file name (`loader.py`, `run.db.lock`) or a placeholder (`X.lock`)
        if parts[0] == "resumewds":
            parts = parts[1:]
        if len(parts) == 1:
            if not re.search(r"\b" + re.escape(parts[0]) + r"\b", every):
                bad.append(tok)
            continue
        owner, member = ".".join(parts[:-1]), parts[-1]
        mods = _modules_named(owner, sources)
        if mods:
            if not any(_defines(sources[m], member) for m in mods) and not _modules_named(tok, sources):
                bad.append(tok)
            continue
        holders = [p for p, src in sources.items() if re.search(r"\bclass\s+" + re.escape(owner) + r"\b", src)]
        if holders:
            if not any(re.search(r"\b" + re.escape(member) + r"\b", sources[h]) for h in holders):
                bad.append(tok)
            continue
        if re.fullmatch(r"[A-Z][a-z]\w*", owner.split(".")[0]):
            bad.append(tok)  # names a class that is not there
    return bad


def test_every_file_of_the_layout_exists():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    paths = list(layout_paths(text))
    assert len(paths) > 30, paths  # the parser found the layout
    missing = [(p, line.strip()) for p, line in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing


def test_every_package_module_is_in_the_layout():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    named = {p for p, _ in layout_paths(text)}
    missing = []
    for rel in _sources():
        path = "resumewds/" + rel
        if rel.endswith("__init__.py") or rel == "__main__.py" or rel == "_version.py":
            continue
        if path not in named:
            missing.append(path)
    assert not missing, f"modules missing from docs/ARCHITECTURE.md's layout: {missing}"


def test_every_backticked_name_exists():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert dangling_names(text) == []


def test_a_stale_name_is_caught():
    doc = ("## Repository layout\n```\nresumewds/\n  gone.py   a module that was removed\n"
           "  fetch/\n    settings.py  FetchConfig\n```\n"
           "`dataset._NOT_THERE` and `FetchConfig.no_such_field` and `_nowhere_at_all`; "
           "`epochplan.sample_at` is fine.\n")
    assert ("resumewds/gone.py" in {p for p, _ in layout_paths(doc)})
    assert ("resumewds/fetch/settings.py" in {p for p, _ in layout_paths(doc)})
    assert sorted(dangling_names(doc)) == ["FetchConfig.no_such_field", "_nowhere_at_all", "dataset._NOT_THERE"]
