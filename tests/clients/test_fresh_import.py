"""The webdataset submodules the corpus's clients reach through the package, in a fresh process.

``wds.handlers.warn_and_continue`` (clip-retrieval), ``wds.shardlists.split_by_node``
(Stable Diffusion), ``wds.filters._shuffle`` and ``wds.tariterators.url_opener``
(open_clip), ``wds.utils.pytorch_worker_seed`` (open_clip), ``wds.writer``... are
attributes of the package right after ``import webdataset as wds``; they must be
so after ``import resumewds as wds`` too, in a process that imported nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.clients

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (webdataset's ``gopen`` is its function, not the module, in both packages)
NAMES = {
    "handlers": None, "writer": None, "cache": None, "compat": None, "mix": None,
    "autodecode": None, "pipeline": None,
    "shardlists": None, "filters": None, "tariterators": None, "utils": None, "tenbin": None,
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=r.format(n))] if r else []) for n, r in NAMES.items()])
def test_submodule_is_an_attribute(name):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    code = f"import resumewds as wds; import types; assert isinstance(wds.{name}, types.ModuleType)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1000:]
