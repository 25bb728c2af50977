"""Every public name of webdataset 1.0.2's modules exists in resumewds's module of that name.

The names are listed from the installed webdataset: each submodule
(``pkgutil``), its ``__all__`` if it has one, else every name without a
leading underscore that it defines or imports (a module that cannot be
imported here, ``multi`` without ``zmq``, is read from its source).
``resumewds.<module>`` must have each, except the names in :data:`EXCLUDED`:
another library's names that webdataset's modules import for their own code
(each is checked to be one).  The second half compares what the names added
for this do with what webdataset's do, call for call.
"""

from __future__ import annotations

import ast
import importlib
import io
import os
import pickle
import pkgutil
import random
import re
import sys
import tarfile
import types
import warnings
from typing import Any, Dict, Iterator, Tuple

import numpy as np
import pytest
import webdataset

import resumewds

#: name -> why resumewds's module of the same name does not have it: each is another
#: library's name that a webdataset module imports for its own code. Import it from where
#: it lives; a module re-exporting another library's names is not API, and binding them
#: here would tie resumewds's modules to webdataset's import lines.
_STDLIB_MODULE = "a standard-library module (import it)"
_STDLIB_NAME = "a standard-library name (import it from its module)"
_TYPING = "a typing name (from typing import ...)"
EXCLUDED: Dict[str, str] = {
    **dict.fromkeys(("copy", "glob", "io", "itertools", "os", "pickle", "random", "re", "subprocess", "sys", "time",
                     "urllib", "uuid", "warnings"), _STDLIB_MODULE),
    "itt": "itertools, as webdataset.utils names it (import itertools)",
    **dict.fromkeys(("Popen", "SimpleNamespace", "islice", "partial", "reduce", "urlparse"), _STDLIB_NAME),
    **dict.fromkeys(("Callable", "Iterable", "Optional", "Set", "Union"), _TYPING),
    "braceexpand": "the braceexpand package (resumewds expands braces itself: resumewds.sources._urls.expand_braces)",
    "np": "numpy (import numpy as np)",
    "yaml": "PyYAML (import yaml)",
    "zmq": "pyzmq, which webdataset.multi imports at its top (resumewds.multi.reader imports it when called)",
}


def _foreign(obj: Any) -> bool:
    """Whether ``obj`` comes from another library than webdataset."""
    if isinstance(obj, types.ModuleType):
        return not obj.__name__.startswith("webdataset")
    mod = getattr(obj, "__module__", None)
    return isinstance(mod, str) and not mod.startswith("webdataset")


def _from_source(path: str) -> Dict[str, bool]:
    """``name -> foreign`` of a module's top-level names, read from its source."""
    out: Dict[str, bool] = {}
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = False
        elif isinstance(node, ast.Assign):
            out.update({t.id: False for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.Import):
            out.update({(a.asname or a.name).split(".")[0]: not a.name.startswith("webdataset") for a in node.names})
        elif isinstance(node, ast.ImportFrom):
            own = node.level > 0 or (node.module or "").startswith("webdataset")
            out.update({a.asname or a.name: not own for a in node.names})
    return {n: f for n, f in out.items() if not n.startswith("_")}


def webdataset_names() -> Iterator[Tuple[str, Dict[str, bool]]]:
    """``(module, {name: foreign})`` for every submodule of the installed webdataset."""
    for info in pkgutil.iter_modules(webdataset.__path__):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(f"webdataset.{info.name}")
        except ImportError:  # multi: needs zmq
            yield info.name, _from_source(os.path.join(webdataset.__path__[0], f"{info.name}.py"))
            continue
        names = list(mod.__all__) if hasattr(mod, "__all__") else [n for n in dir(mod) if not n.startswith("_")]
        yield info.name, {n: _foreign(getattr(mod, n)) for n in names}


MODULES = dict(webdataset_names())


def test_the_listing_sees_every_module():
    assert {"filters", "writer", "mix", "cache", "tenbin", "multi", "extradatasets", "pytorch",
            "typecheck"} <= set(MODULES)
    assert MODULES["filters"]["compose"] is False and MODULES["filters"]["np"] is True
    assert MODULES["multi"]["MultiLoader"] is False and MODULES["multi"]["zmq"] is True


#: (module, name) -> why resumewds's name is of another kind (module, class, function, value)
KIND_DIFFERS = {
    ("cache", "default_cache_dir"): "resumewds.cache is the engine's shard cache: its default_cache_dir() is a "
                                    "function of the environment; webdataset's FileCache default is "
                                    "resumewds.wds.filecache.default_cache_dir",
    ("mix", "RandomMix"): "a function: MixedDataset for sources resumewds mixes exactly, StreamMix (webdataset's "
                          "class) for the others (docs/COMPAT.md)",
}


def _kind(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        return "class"
    return "callable" if callable(obj) else "value"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_public_name_exists(module):
    ours = importlib.import_module(f"resumewds.{module}")
    missing = [n for n in MODULES[module] if not hasattr(ours, n)]
    unexplained = [n for n in missing if n not in EXCLUDED]
    assert not unexplained, f"resumewds.{module} lacks webdataset's {unexplained}"
    own = [n for n in missing if not MODULES[module][n]]
    assert not own, f"resumewds.{module} lacks {own}, which webdataset's module defines (no exclusion applies)"
    try:
        theirs = importlib.import_module(f"webdataset.{module}")
    except ImportError:  # multi without zmq
        return
    kinds = {n: (_kind(getattr(theirs, n)), _kind(getattr(ours, n))) for n in MODULES[module] if hasattr(ours, n)}
    other = {n: k for n, k in kinds.items() if k[0] != k[1] and (module, n) not in KIND_DIFFERS}
    assert not other, f"resumewds.{module}: of another kind than webdataset's (theirs, ours): {other}"


def test_every_top_level_name_exists():
    names = {n: _foreign(getattr(webdataset, n)) for n in dir(webdataset) if not n.startswith("_")}
    missing = sorted(n for n in names if not hasattr(resumewds, n))
    assert not missing, f"resumewds lacks webdataset's {missing}"
    assert resumewds.LRUCleanup is resumewds.cache.LRUCleanup
    assert resumewds.with_epoch is resumewds.extradatasets.with_epoch


def test_every_exclusion_is_needed_and_foreign():
    used = {n for module, names in MODULES.items() for n, foreign in names.items()
            if foreign and not hasattr(importlib.import_module(f"resumewds.{module}"), n)}
    assert set(EXCLUDED) == used


# ---- the names do what webdataset's do -------------------------------------------------

def _both(name: str):
    module, attr = name.rsplit(".", 1)
    return getattr(importlib.import_module(f"webdataset.{module}"), attr), \
        getattr(importlib.import_module(f"resumewds.{module}"), attr)


def test_filters_helpers_match_webdataset():
    for lib in (webdataset, resumewds):
        f = lib.filters
        stage = f.compose(f.map(lambda x: x * 3), f.select(lambda x: x % 2 == 0))
        assert list(stage(iter(range(10)))) == [0, 6, 12, 18, 24]
        assert f.compose(len)("abc") == 3 and f.compose2(str, len)(12345) == 5
        assert list(f.pipeline(iter(range(5)), f.map(lambda x: -x))) == [0, -1, -2, -3, -4]
        assert f.pipeline([1]) == [1]
        assert list(f.FilterFunction(lambda d, k: d[:k], 2)("abcd")) == ["a", "b"]
        assert f.RestCurried(lambda d, k: d * k)(3)("ab") == "ababab"
        assert f.tuple2dict(("a", "b")) == {0: "a", 1: "b"} and f.dict2tuple({0: "a", 1: "b"}) == ("a", "b")
        assert f.decode_text(io.BytesIO(b"hi")) == "hi" and f.decode_bin(io.BytesIO(b"\x01")) == b"\x01"
        assert f.decode_pickle(io.BytesIO(pickle.dumps({"a": 1}))) == {"a": 1}
    # pick draws as webdataset's shuffle buffer does: the same items for the same rng
    draws = []
    for lib in (webdataset, resumewds):
        buf, rng = list(range(20)), random.Random(5)
        draws.append([lib.filters.pick(buf, rng) for _ in range(20)])
    assert draws[0] == draws[1]
    wf, of = _both("filters.find_decoder")
    decs = [("*.txt", "T"), ("*.jpg", "J"), ("*.txt", "T2")]
    for path in ("a.txt", "x/b.JPG", "c.png", "__key__"):
        got_w, got_o = wf(decs, path), of(decs, path)
        assert (got_w if isinstance(got_w, (str, type(None))) else "id") == \
            (got_o if isinstance(got_o, (str, type(None))) else "id")
    wc, oc = _both("filters.combine_values")
    import torch

    for b in ([1, 2.5], [np.zeros(3), np.ones(3)], [torch.zeros(2), torch.ones(2)], ["a", "b"]):
        w, o = wc(b), oc(b)
        assert type(w) is type(o) and repr(w) == repr(o)
    assert resumewds.filters.TorchTensor is torch.Tensor


def test_mix_random_samples_draws_as_webdataset():
    out = []
    for lib in (webdataset, resumewds):
        random.seed(11)
        out.append(list(lib.mix.random_samples([iter(range(30)), iter("abcdefghij")], [0.75, 0.25], longest=True)))
    assert out[0] == out[1] and len(out[0]) == 40


def test_tenbin_matches_webdataset(tmp_path):
    arrays = [np.arange(12, dtype="float32").reshape(3, 4), np.array([-3, 7], dtype="int16"),
              np.zeros((2, 1, 2), dtype="uint8")]
    infos = ["img", "lab", "z"]
    w, o = webdataset.tenbin, resumewds.tenbin
    assert bytes(w.encode_buffer(arrays, infos)) == bytes(o.encode_buffer(arrays, infos))
    for name in ("magic", "magic_bytes", "magic_str"):
        assert getattr(w, name) == getattr(o, name)
    assert [o.roundup(n) for n in (0, 1, 64, 65)] == [w.roundup(n) for n in (0, 1, 64, 65)]
    assert o.str64("f4") == w.str64("f4") and o.unstr64(w.str64("ab")) == "ab"
    for a in arrays:
        assert bytes(o.encode_header(a, "x")) == bytes(w.encode_header(a, "x"))
        assert o.decode_header(w.encode_header(a, "x"))[::2] == w.decode_header(w.encode_header(a, "x"))[::2]
    chunks = w.encode_list(arrays)
    assert [x.tolist() for x in o.decode_list(chunks)] == [x.tolist() for x in arrays]
    assert bytes(o.encode_chunks(chunks)) == bytes(w.encode_chunks(chunks))
    assert [bytes(c) for c in o.decode_chunks(w.encode_chunks(chunks))] == [bytes(c) for c in chunks]
    s_w, s_o = io.BytesIO(), io.BytesIO()
    w.write(s_w, arrays, infos)
    o.write(s_o, arrays, infos)
    assert s_w.getvalue() == s_o.getvalue()
    s_o.seek(0)
    got, names = o.read(s_o, infos=True)
    assert names == infos and all((x == y).all() for x, y in zip(got, arrays))
    o.save(str(tmp_path / "a.ten"), *arrays)
    assert [x.tolist() for x in w.load(str(tmp_path / "a.ten"))] == [x.tolist() for x in arrays]
    with pytest.raises(ValueError, match=".ten"):
        o.save(str(tmp_path / "a.bin"), *arrays)
    with pytest.raises(ValueError, match="doesn't match"):
        o.check_infos(arrays, infos, ["img", "other", "z"])
    assert o.check_infos(arrays, infos, list(infos)) is arrays


def test_shardlists_and_tariterators_names(monkeypatch):
    monkeypatch.setenv("WDS_BUCKET", "b1")
    for lib in (webdataset, resumewds):
        s = lib.shardlists
        assert s.envsubst("gs://${BUCKET}/x") == "gs://b1/x"
        assert s.envlookup(re.match(r"\$\{(\w+)\}", "${BUCKET}")) == "b1"
        assert s.expand("~") == os.path.expanduser("~")
        assert len(list(s.resampled_(iter(["a", "b"]), 7))) == 7
        assert s.MSSource(name="a", urls=["x"]).urls == ["x"] and s.MSSource().perepoch == -1
        assert s.is_iterable([1]) and not s.is_iterable(3)
        t = lib.tariterators
        assert (t.meta_prefix, t.meta_suffix, t.trace) == ("__", "__", False)
    assert resumewds.shardlists.pipelinefilter is resumewds.filters.pipelinefilter


def _tar(path: str, n: int = 3) -> str:
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            data = f"sample {i}".encode()
            ti = tarfile.TarInfo(f"k{i}.txt")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def test_cache_module_api_matches_webdataset(tmp_path, served):
    root, srv = served
    _tar(os.path.join(root, "a.tar"))
    url = f"http://127.0.0.1:{srv.port}/a.tar"
    with open(os.path.join(root, "junk.tar"), "wb") as f:
        f.write(b"<html>not a tar</html>" * 40)
    for lib in (webdataset, resumewds):
        c = lib.cache
        assert c.url_to_cache_name(url) == "a.tar" and c.url_to_cache_name("http://h/d/e/f.tar", 1) == "e/f.tar"
        assert c.islocal("/x/a.tar") and not c.islocal(url)
        assert c.check_tar_format(os.path.join(root, "a.tar"))
        assert not c.check_tar_format(os.path.join(root, "junk.tar"))
        d = tmp_path / lib.__name__
        fc = c.FileCache(cache_dir=str(d))
        (item,) = list(fc([{"url": url}]))
        assert item["local_path"] == str(d / "a.tar") and item["stream"].read() == open(os.path.join(root, "a.tar"),
                                                                                          "rb").read()
        with pytest.raises(ValueError, match="is not a tar archive"):
            list(c.FileCache(cache_dir=str(d))([url.replace("a.tar", "junk.tar")]))
        (streamed,) = list(c.StreamingOpen()([url]))
        assert streamed["url"] == url and streamed["stream"].read()[:512] == open(os.path.join(root, "a.tar"),
                                                                                 "rb").read()[:512]
        c.download(url, str(tmp_path / f"{lib.__name__}.dl"))
        assert open(tmp_path / f"{lib.__name__}.dl", "rb").read() == open(os.path.join(root, "a.tar"), "rb").read()
        for i in range(4):
            (d / f"f{i}").write_bytes(b"x" * 100)
        c.LRUCleanup(str(d), cache_size=250, interval=None).cleanup()
        assert sum(os.path.getsize(d / n) for n in os.listdir(d)) <= 250
        assert isinstance(c.gopen, types.ModuleType)


def test_gopen_pipe_names_as_webdataset(tmp_path):
    src = tmp_path / "x.bin"
    src.write_bytes(b"payload")
    for lib in (webdataset, resumewds):
        assert lib.writer.gopen is lib.gopen  # webdataset 1.0.2's writer.gopen is the function
        g = lib.tariterators.gopen  # the module (img2dataset's "Pipe = wds.writer.gopen.Pipe" is an older form)
        with g.Pipe(f"cat {src}", mode="rb", shell=True) as p:
            assert p.read() == b"payload"
        out = tmp_path / f"{lib.__name__}.out"
        p = g.Pipe(f"cat > {out}", mode="wb", shell=True, bufsize=8192)
        p.write(b"abc")
        p.close()
        assert out.read_bytes() == b"abc"
        stream = g.gopen_curl(f"file://{src}")
        assert stream.read() == b"payload" and g.set_options(stream, timeout=5) is True
        assert g.set_options(io.BytesIO()) is False
        assert isinstance(g.info, dict) and g.PIPE == -1
        with pytest.raises(OSError, match="exit"):
            bad = g.Pipe("exit 3", mode="rb", shell=True)
            bad.read()
            bad.close()


def test_extradatasets_and_pytorch():
    import torch.utils.data

    e, p = resumewds.extradatasets, resumewds.pytorch
    assert p.IterableDataset is torch.utils.data.IterableDataset and p.DataLoader is torch.utils.data.DataLoader
    assert list(e.MockDataset(7, 3)) == [7, 7, 7]
    assert list(e.repeatedly([1, 2], nepochs=3)) == [1, 2] * 3
    ep = e.with_epoch(range(5), 3)
    assert list(ep) + list(ep) == [0, 1, 2, 3, 4, 0] and len(ep) == 3
    wl = e.with_length(range(4), 9)
    assert list(torch.utils.data.DataLoader(wl, batch_size=None)) == [0, 1, 2, 3] and len(wl) == 9
    assert resumewds.typecheck.modules == webdataset.typecheck.modules
    assert resumewds.pipeline.add_length_method(type("P", (), {"size": 4})()).__len__() == 4


def test_multi_and_compat_names():
    m = resumewds.multi
    assert m.EOF(index=3).index == 3 and m.the_protocol == pickle.HIGHEST_PROTOCOL
    c = resumewds.compat
    assert c.DataPipeline is resumewds.DataPipeline and c.filters is resumewds.filters
    assert list(c.group_by_keys(iter([{"fname": "a.txt", "data": b"1", "__url__": "u"}]))) == \
        [{"__key__": "a", "__url__": "u", "txt": b"1"}]
    assert resumewds.autodecode.utils is resumewds.utils and resumewds.filters.utils is resumewds.utils
    assert resumewds.autodecode.pytorch_weights_only in (True, False)
    assert sys.modules["resumewds.gopen"] is resumewds.tariterators.gopen is resumewds.cache.gopen
