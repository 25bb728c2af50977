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
    m = re.search(r"## Repository layout\s*\n(?:[^`]|`[^`])*?```[^\n]*\n(.*?)\n```", text, re.S)
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
    """``src`` defines or assigns ``name``, or (a package's face) loads it on first use."""
    return (re.search(_DEF.format(re.escape(name)), src) is not None
            or re.search(r'^\s*"' + re.escape(name) + r'"\s*:', src, re.M) is not None)


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
           "  fetch/\n    _settings.py  FetchConfig\n```\n"
           "`dataset._NOT_THERE` and `FetchConfig.no_such_field` and `_nowhere_at_all`; "
           "`plan._epoch.cut_partitions` is fine.\n")
    assert ("resumewds/gone.py" in {p for p, _ in layout_paths(doc)})
    assert ("resumewds/fetch/_settings.py" in {p for p, _ in layout_paths(doc)})
    assert sorted(dangling_names(doc)) == ["FetchConfig.no_such_field", "_nowhere_at_all", "dataset._NOT_THERE"]


def _folder_order(text: str) -> List[str]:
    """The folders of the layout table, bottom (imports nothing of ours) first."""
    return re.findall(r"^\| `(\w+)/` \|", text, re.M)


def _imported_folders(path: str, module: str) -> Set[str]:
    """The package's folders that a module imports (anywhere in it: lazy imports count)."""
    import ast

    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    is_pkg = path.endswith("__init__.py")
    out: Set[str] = set()
    for node in ast.walk(tree):
        targets: List[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_pkg else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = base + ("." + node.module if node.module else "")
            else:
                target = node.module or ""
            targets = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            parts = t.split(".")
            if parts[0] == "resumewds" and len(parts) > 1 and os.path.isdir(os.path.join(PKG, parts[1])):
                out.add(parts[1])
    return out


def folder_imports() -> Dict[str, Set[str]]:
    """folder -> the other folders its modules import."""
    out: Dict[str, Set[str]] = {}
    for rel in _sources():
        parts = rel[:-3].split(os.sep)
        if len(parts) < 2:
            continue  # a top-level module
        module = "resumewds." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        here = parts[0]
        out.setdefault(here, set()).update(_imported_folders(os.path.join(PKG, rel), module) - {here})
    return out


def test_each_folder_imports_only_the_folders_listed_above_it():
    with open(DOC, encoding="utf-8") as f:
        order = _folder_order(f.read())
    folders = {d for d in os.listdir(PKG) if os.path.isfile(os.path.join(PKG, d, "__init__.py"))}
    assert sorted(order) == sorted(folders), "docs/ARCHITECTURE.md's folder table and resumewds/ differ"
    rank = {f: i for i, f in enumerate(order)}
    upward = sorted(f"{f} imports {g}" for f, gs in folder_imports().items() for g in gs if rank[g] > rank[f])
    assert upward == [], upward


def test_an_upward_import_is_caught(tmp_path):
    (tmp_path / "m.py").write_text("def late():\n    from ..cli import main\n")
    assert _imported_folders(str(tmp_path / "m.py"), "resumewds.fetch.m") == {"cli"}
