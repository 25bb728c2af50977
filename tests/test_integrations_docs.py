"""The examples of docs/FRAMEWORKS.md run (each in its own directory)."""

from __future__ import annotations

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "FRAMEWORKS.md")
FRAMEWORK_OF = {"lightning": "lightning.pytorch", "accelerate": "accelerate", "transformers": "transformers",
                "lightning_journal": "lightning.pytorch", "lightning_stateful": "lightning.pytorch",
                "stateful": "torchdata.stateful_dataloader"}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")


def examples():
    """``{name: code}`` of the doc's python blocks: a first line ``# example: NAME`` names a block, else
    the resumewds.integrations module it imports."""
    with open(DOC, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    out = {}
    for code in blocks:
        named = re.match(r"# example: (\w+)\n", code)
        out[named.group(1) if named else re.search(r"^from resumewds\.integrations\.(\w+) import", code,
                                                    re.M).group(1)] = code
    return out


def test_one_example_per_framework():
    assert sorted(examples()) == sorted(FRAMEWORK_OF)


# the transformers example (about 12 s, most of it the import) under -m slow; its
# integration stays in the default run (tests/test_integrations_transformers.py)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "transformers" else n
                                  for n in sorted(FRAMEWORK_OF)])
def test_example_runs(name, tmp_path, monkeypatch, cache_dir):
    pytest.importorskip(FRAMEWORK_OF[name])
    monkeypatch.chdir(tmp_path)
    code = examples()[name]
    exec(compile(code, f"{DOC}:{name}", "exec"), {"__name__": "__main__"})
