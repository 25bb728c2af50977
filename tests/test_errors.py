"""The error tree: every class pickles,
crosses a real DataLoader worker with its type and fields, and is also an
instance of what webdataset 1.0.2 raises in the same situation (checked
against the real, installed webdataset package)."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import warnings

import pytest

import resumewds as rw
from resumewds import errors
from resumewds.journal import Journal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FIELDS = {
    "FetchError": dict(url="http://h/a.tar", status=503),
    "TransientFetchError": dict(url="http://h/a.tar", status=429, retry_after=2.5),
    "PermanentFetchError": dict(url="http://h/a.tar", status=404),
    "ShardNotFoundError": dict(url="/d/a.tar"),
    "ChecksumMismatch": dict(url="a.tar", expected="1", actual="2", what="size"),
    "ShardFormatError": dict(shard="a.tar", offset=512, problem="bad header"),
    "MissingKeyError": dict(key="jpg"),
}

#: the error tree (HandlerStop, also in errors, is a handler's signal to stop, not an error)
ERRORS = [n for n in errors.__all__ if issubclass(getattr(errors, n), errors.ResumeWDSError)]


def test_handler_stop_is_a_signal_not_an_error():
    assert set(errors.__all__) - set(ERRORS) == {"HandlerStop"}
    assert not issubclass(errors.HandlerStop, errors.ResumeWDSError)  # `except ResumeWDSError` lets it pass
    assert type(pickle.loads(pickle.dumps(errors.HandlerStop("stop")))) is errors.HandlerStop


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_pickles_with_its_fields(name):
    cls = getattr(errors, name)
    fields = FIELDS.get(name, {})
    exc = cls(f"{name}: something went wrong", **fields)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc) == f"{name}: something went wrong"
    assert back.args == (f"{name}: something went wrong",)
    for k, v in fields.items():
        assert getattr(back, k) == v
    assert isinstance(back, errors.ResumeWDSError)


def test_positional_forms_still_work_and_pickle():
    c = errors.ChecksumMismatch("a.tar", "10", "12", what="size")
    s = errors.ShardFormatError("b.tar", 1024, "truncated")
    for exc in (c, s):
        back = pickle.loads(pickle.dumps(exc))
        assert (type(back), str(back), back.__dict__) == (type(exc), str(exc), exc.__dict__)
    assert str(c) == "a.tar: size mismatch: expected 10, got 12" and c.url == "a.tar"
    assert str(s) == "b.tar: at byte 1024: truncated" and (s.shard, s.offset) == ("b.tar", 1024)


def test_key_and_os_bases_keep_the_plain_message():
    assert str(errors.MissingKeyError("sample k has no jpg", key="jpg")) == "sample k has no jpg"
    e = errors.ShardNotFoundError("/d/a.tar: no such file", "/d/a.tar")
    assert str(e) == "/d/a.tar: no such file" and e.errno == 2 and e.url == "/d/a.tar"


# ---------------------------------------------------------------------------
# across a real DataLoader worker, with the never-emitted "fail" event
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_worker_error_keeps_type_and_fields_and_is_journaled_as_fail(make_shards, tmp_path, workers):
    paths = make_shards(shards=3, samples=10)
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    os.remove(paths[1])
    journal = str(tmp_path / "run.db")
    loader = rw.WebLoader(rw.WebDataset(manifest), batch_size=5, num_workers=workers,
                          journal=journal)
    with pytest.raises(rw.ShardNotFoundError) as info:
        for step, _ in enumerate(loader):
            loader.commit(step)
    exc = info.value
    assert exc.url == paths[1] and isinstance(exc, FileNotFoundError)
    assert "\n" not in str(exc) and "Traceback" not in str(exc)
    assert loader.stats()["failures"] == 1
    loader.close()
    with Journal(journal, readonly=True) as j:
        assert j.shard(paths[1])["state"] == "failed"
        (ev,) = j.events("fail")
        assert ev["url"] == paths[1] and "no such file" in ev["detail"]["error"]


def test_checksum_mismatch_crosses_a_worker_with_its_fields(make_shards, tmp_path):
    paths = make_shards(shards=2, samples=10)
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    with open(paths[0], "r+b") as f:  # same size, other bytes
        f.seek(700)
        f.write(b"\xff" * 8)
    loader = rw.WebLoader(rw.WebDataset(manifest, verify="always"), batch_size=5, num_workers=2)
    with pytest.raises(errors.IntegrityError) as info:
        list(loader)
    exc = info.value
    assert isinstance(exc, errors.ChecksumMismatch), repr(exc)
    assert exc.url == paths[0] and exc.expected and exc.actual and exc.expected != exc.actual
    loader.close()


# ---------------------------------------------------------------------------
# what webdataset 1.0.2 raises in the same situation
# ---------------------------------------------------------------------------

def _tar(path, members):
    with tarfile.open(path, "w") as tf:
        for n, d in members:
            ti = tarfile.TarInfo(n)
            ti.size = len(d)
            tf.addfile(ti, io.BytesIO(d))


def _raised(fn):
    try:
        fn()
    except BaseException as exc:  # what each package raises is the point
        return exc
    raise AssertionError("nothing was raised")


@pytest.fixture
def bad_inputs(tmp_path, cache_dir):
    d = tmp_path / "in"
    d.mkdir()
    _tar(d / "ok.tar", [("a.txt", b"x"), ("a.cls", b"1")])
    _tar(d / "dup.tar", [("a.txt", b"x"), ("a.txt", b"y")])
    (d / "notar.tar").write_bytes(b"hello, not a tar at all " * 100)
    (d / "trunc.tar").write_bytes((d / "ok.tar").read_bytes()[:700])
    return d


CASES = {
    "not a tar": ("notar.tar", None, tarfile.ReadError),
    "truncated": ("trunc.tar", None, tarfile.ReadError),
    "repeated extension": ("dup.tar", None, ValueError),
    "missing file": ("missing.tar", None, FileNotFoundError),
    "fetch failure": ("http://127.0.0.1:1/x.tar", None, OSError),
    "missing to_tuple field": ("ok.tar", lambda d: d.to_tuple("jpg"), ValueError),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_our_errors_are_what_webdataset_raises(case, bad_inputs, monkeypatch):
    wds = pytest.importorskip("webdataset")
    name, stage, expected = CASES[case]
    url = name if "://" in name else str(bad_inputs / name)
    stage = stage or (lambda d: d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "://" in url:
            # webdataset's WebDataset races tarfile against curl's exit status
            # (ReadError "empty file" or OSError); its gopen, which raises for
            # a failed fetch, is deterministic
            def fetch() -> None:
                s = wds.gopen(url)
                s.read()
                s.close()
            theirs = _raised(fetch)
        else:
            theirs = _raised(lambda: list(stage(wds.WebDataset(url, shardshuffle=False))))
    assert isinstance(theirs, expected), repr(theirs)  # the reference, measured
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "1")
    ours = _raised(lambda: list(stage(rw.WebDataset(url))))
    assert isinstance(ours, errors.ResumeWDSError), repr(ours)
    assert isinstance(ours, type(theirs)), f"{case}: ours {type(ours).__mro__}, theirs {type(theirs)}"
    assert "\n" not in str(ours)


class _Raise:
    """A map stage that raises ``errors.<name>`` with its fields (picklable for spawn)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, sample):
        raise getattr(errors, self.name)(f"{self.name} in a stage", **FIELDS.get(self.name, {}))


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_crosses_a_real_dataloader_worker(name, make_shards):
    paths = make_shards(shards=1, samples=4)
    loader = rw.WebLoader(rw.WebDataset(paths).map(_Raise(name)), batch_size=2, num_workers=1)
    cls = getattr(errors, name)
    with pytest.raises(cls) as info:
        list(loader)
    exc = info.value
    assert type(exc) is cls and str(exc) == f"{name} in a stage"
    for k, v in FIELDS.get(name, {}).items():
        assert getattr(exc, k) == v
    assert any("DataLoader worker 0" in n for n in getattr(exc, "__notes__", ["DataLoader worker 0"]))
    loader.close()


def test_the_loader_leaves_the_dataset_collate_fn_alone(make_shards):
    ds = rw.WebDataset(make_shards(shards=1, samples=4))
    loader = rw.WebLoader(ds, batch_size=2, collate_fn=lambda s: len(s))
    assert list(loader) == [2, 2]
    assert ds.collate_fn is None
