"""Shard lists with webdataset's names: the first stage of a :class:`~resumewds.DataPipeline`.

They iterate ``{"url": ...}`` dicts as in webdataset 1.0.2; inside a DataPipeline they are
compiled into the deterministic plan instead (differences: docs/COMPAT.md).
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from .. import config
from ..sources import expand_braces
from . import utils  # noqa: F401  (webdataset's shardlists.utils)
from .filters import _Generic, pipelinefilter
from .splitters import single_node_only, split_by_node, split_by_worker
from .utils import is_iterable, make_seed, obsolete, pytorch_worker_seed

__all__ = ["DirectoryShardList", "MSSource", "MultiShardSample", "ResampledShardList", "ResampledShards",
           "SimpleShardList", "default_rng", "envlookup", "envsubst", "expand", "expand_source", "expand_urls",
           "is_iterable", "non_empty", "obsolete", "pipelinefilter", "resampled", "resampled_", "shardspec",
           "single_node_only", "split_by_node", "split_by_worker"]


def envlookup(m: re.Match) -> str:
    """The environment variable ``WDS_<name>`` of a ``${name}`` match (webdataset's)."""
    key = "WDS_" + m.group(1)
    if key not in os.environ:
        raise ValueError(f"{m.string}: missing environment variable {key}")
    return os.environ[key]


def envsubst(s: str) -> str:
    """Replace ``${NAME}`` with the environment variable ``WDS_NAME`` (webdataset's rule)."""
    return re.sub(r"\$\{(\w+)\}", envlookup, s)


def expand(s: str) -> str:
    """``~`` and ``$VARS`` expanded (webdataset's, for shard specs)."""
    return os.path.expanduser(os.path.expandvars(s))


def expand_urls(urls: str) -> List[str]:
    """Expand ``::``-joined brace patterns (and ``${NAME}`` from ``WDS_NAME``) into a list of urls."""
    out: List[str] = []
    for part in urls.split("::"):
        for _ in range(10):
            last, part = part, envsubst(part)
            if part == last:
                break
        if part:
            out.extend(expand_braces(part))
    return out


def expand_source(source: Union[str, Iterable[str]], max_urls: int = int(1e9)) -> List[str]:
    """A string pattern, a list of urls or any iterable of urls (its first ``max_urls``), as a list."""
    if isinstance(source, str):
        return expand_urls(source)
    if isinstance(source, list):
        return source
    if hasattr(source, "__iter__") and not isinstance(source, (bytes, bytearray)):
        return list(islice(source, max_urls))
    raise ValueError(f"cannot handle {type(source)}")


class SimpleShardList:
    """The shards of ``urls`` (a brace pattern or a list), in order, or shuffled with ``seed``.

    Example:
        >>> len(SimpleShardList(["a.tar", "b.tar"]))
        2
    """

    def __init__(self, urls: Union[str, Sequence[str]], seed: Union[None, bool, int] = None):
        self.urls = expand_urls(urls) if isinstance(urls, str) else list(urls)
        if not self.urls or not all(isinstance(u, str) for u in self.urls):
            raise ValueError(f"SimpleShardList needs a non-empty list of url strings, got {urls!r}")
        if seed is True:
            seed = int(time.time())
        self.seed = seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[Dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for u in urls:
            yield {"url": u}


class ResampledShards:
    """An endless stream of shards drawn at random, with replacement, from ``urls`` (webdataset's class).

    Standalone it is webdataset 1.0.2's (seeded with ``make_seed(worker_seed(), epoch, seed)``, plus
    pid, time and ``os.urandom`` unless ``deterministic``); in a DataPipeline it is compiled into the plan.

    Example:
        >>> rs = ResampledShards(["a.tar", "b.tar"], nshards=3, deterministic=True)
        >>> len([d["url"] for d in rs]), rs.epoch
        (3, 0)
    """

    def __init__(self, urls: Union[str, Iterable[str]], nshards: int = sys.maxsize, seed: int = 0,
                 worker_seed: Optional[Callable[[], int]] = None, deterministic: bool = False,
                 max_urls: int = int(1e6), empty_check: bool = True):
        self.urls = expand_source(urls, max_urls)
        if empty_check and not self.urls:
            raise ValueError("empty_check=True, but no shards found in ResampledShards")
        if self.urls and not isinstance(self.urls[0], str):
            raise ValueError(f"ResampledShards needs url strings, got {self.urls[0]!r}")
        self.nshards = nshards
        self.worker_seed = pytorch_worker_seed if worker_seed is None else worker_seed
        self.deterministic = deterministic
        self.seed = seed
        self.epoch = -1

    def __iter__(self) -> Iterator[Dict[str, str]]:
        self.epoch += 1
        if self.deterministic:
            seed = make_seed(self.worker_seed(), self.epoch, self.seed)
        else:
            seed = make_seed(self.worker_seed(), self.epoch, self.seed, os.getpid(), time.time_ns(),
                             os.urandom(4))
        if config.value("show_seed"):
            print(f"# ResampledShards seed {seed}")
        self.rng = random.Random(seed)
        for _ in range(self.nshards):
            index = self.rng.randint(0, len(self.urls) - 1)
            yield {"url": self.urls[index]}


ResampledShardList = ResampledShards


def check_pid_is_running(pid: int) -> bool:
    """True if process ``pid`` exists (``os.kill(pid, 0)``)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def without_last_extension(fname: str) -> str:
    """``fname`` without its last ``.extension``.

    Example:
        >>> without_last_extension("a/b.tar._123_")
        'a/b.tar'
    """
    return re.sub(r"\.[^.]*$", "", fname)


def get_pid_from_filename(fname: str) -> Optional[int]:
    """The pid in a claimed shard's name (``name._PID_``), or None.

    Example:
        >>> get_pid_from_filename("/d/x.tar._42_"), get_pid_from_filename("/d/x.tar")
        (42, None)
    """
    m = re.match(r"^(.*)\._(\d+)_$", fname)
    return int(m.group(2)) if m else None


class DirectoryShardList:
    """Shards taken from a directory as they appear: webdataset 1.0.2's work queue.

    Each iteration claims a file matching ``pattern`` by renaming it ``name._PID_``, yields it, then
    recycles it by ``mode`` (``"unlink"``, ``"keep"``: ``name._done_``, ``"resample"``: back).
    ``poll=None`` ends when no file matches.  Never part of the plan (not exactly resumable).

    Example:
        >>> import tempfile, pathlib
        >>> d = tempfile.mkdtemp() + "/"; pathlib.Path(d + "a.tar").touch()
        >>> ds = DirectoryShardList(d, "*.tar", poll=None, mode="unlink")
        >>> [os.path.basename(x["url"]).split("._")[0] for x in ds], os.listdir(d)
        (['a.tar'], [])
    """

    def __init__(self, path: str, pattern: str = "*.{tar,tgz,tar.tgz}", poll: Optional[float] = 1,
                 timeout: float = 1e12, mode: str = "resample", select: str = "random", fate: Any = None):
        if not path.endswith("/"):
            raise ValueError(f"DirectoryShardList: {path}: the directory path must end with '/'")
        if not os.path.isdir(path):
            raise ValueError(f"DirectoryShardList: {path}: not a directory")
        if mode not in ("resample", "unlink", "keep"):
            raise ValueError(f"DirectoryShardList: unknown mode {mode!r} (resample, unlink or keep)")
        if select not in ("random", "oldest"):
            raise ValueError(f"unknown selection strategy {select}")
        self.path = path
        self.poll = poll
        self.pattern = pattern
        self.mode = mode
        self.select = select
        self.fate = fate
        self.timeout = timeout

    def _candidates(self) -> List[str]:
        import glob

        found = set()
        for pat in expand_braces(self.pattern):
            found.update(glob.glob(self.path + pat))
        return sorted(found)

    def recycle(self, activename: str) -> None:
        """Put a claimed shard where ``mode`` says (deleted, ``._done_``, or back)."""
        if self.mode == "unlink":
            os.unlink(activename)
        elif self.mode == "keep":
            os.rename(activename, without_last_extension(activename) + "._done_")
        elif self.mode == "resample":
            os.rename(activename, without_last_extension(activename))

    def cleanup_files_without_processes(self) -> None:
        """Recycle shards claimed by processes that no longer run."""
        import glob

        for fname in glob.glob(os.path.join(self.path, "*._*_")):
            pid = get_pid_from_filename(fname)
            if pid is None:
                continue
            if not check_pid_is_running(pid):
                self.recycle(fname)

    def __iter__(self) -> Iterator[Dict[str, str]]:
        last = time.time()
        while time.time() - last < self.timeout:
            candidates = self._candidates()
            if not candidates:
                if self.poll is None:
                    return
                time.sleep(self.poll)
                continue
            if self.select == "oldest":
                candidate = min(candidates, key=lambda fn: os.stat(fn).st_mtime)
            else:
                candidate = random.choice(candidates)
            activename = candidate + f"._{os.getpid()}_"
            try:
                os.rename(candidate, activename)
            except FileNotFoundError:  # another process claimed it first
                if self.poll is not None:
                    time.sleep(self.poll)
                continue
            yield {"url": activename}
            self.recycle(activename)
            self.cleanup_files_without_processes()


@dataclass
class MSSource:
    """One source of a :class:`MultiShardSample` spec (webdataset's)."""

    name: str = ""
    perepoch: int = -1
    resample: bool = False
    urls: List[str] = field(default_factory=list)


#: webdataset's module-level generator (kept for code that seeds or draws from it)
default_rng = random.Random()


class MultiShardSample:
    """Shards from a YAML (or dict) spec of several sources: webdataset's (obsolete there) class.

    Example:
        >>> ms = MultiShardSample({"datasets": [{"name": "a", "shards": "a-{0..2}.tar"}]})
        >>> sorted(d["url"] for d in ms)
        ['a-0.tar', 'a-1.tar', 'a-2.tar']
    """

    def __init__(self, fname: Union[str, Dict[str, Any]]):
        self.epoch = -1
        self.parse_spec(fname)

    def parse_spec(self, fname: Union[str, Dict[str, Any]]) -> None:
        """Read the spec (a YAML file name or a dict)."""
        self.rng = random.Random()
        if isinstance(fname, dict):
            spec = fname
        else:
            try:
                import yaml  # type: ignore[import-untyped]
            except ImportError:  # pragma: no cover - yaml missing
                raise ValueError(f"{fname}: reading a .yaml shard spec needs PyYAML (pip install pyyaml)") \
                    from None
            with open(fname) as stream:
                spec = yaml.safe_load(stream)
        if not isinstance(spec, dict) or not set(spec).issubset({"prefix", "datasets", "buckets"}):
            raise ValueError(f"{fname}: a shard spec has only prefix, datasets and buckets, got "
                             f"{list(spec) if isinstance(spec, dict) else type(spec).__name__}")

        prefix = expand(spec.get("prefix", ""))
        self.sources: List[MSSource] = []
        for ds in spec["datasets"]:
            if not set(ds).issubset({"buckets", "name", "shards", "resample", "choose"}):
                raise ValueError(f"{fname}: unknown keys in dataset {list(ds)}")
            buckets = ds.get("buckets", spec.get("buckets", []))
            if isinstance(buckets, str):
                buckets = [buckets]
            buckets = [expand(b) for b in buckets] or [""]
            if len(buckets) != 1:
                raise ValueError(f"{fname}: {buckets}: more than one bucket per dataset is not supported")
            bucket = buckets[0]
            shards = ds["shards"]
            if isinstance(shards, str):
                shards = [shards]
            urls = [prefix + os.path.join(bucket, u) for url in shards for u in expand_braces(expand(url))]
            resample = ds.get("resample", -1)
            nsample = ds.get("choose", -1)
            if nsample > len(urls):
                raise ValueError(f"perepoch {nsample} must be no greater than the number of shards")
            if nsample > 0 and resample > 0:
                raise ValueError("specify only one of perepoch or choose")
            self.sources.append(MSSource(name=ds.get("name", "@" + bucket), urls=urls, perepoch=nsample,
                                         resample=resample))

    def set_epoch(self, seed: int) -> None:
        """Reseed the shard selection (the same seed on every node gives the same shards)."""
        self.rng = random.Random(seed)

    def get_shards_for_epoch(self) -> List[str]:
        """This epoch's urls."""
        result: List[str] = []
        for source in self.sources:
            if source.resample > 0:
                chosen = self.rng.choices(source.urls, k=int(source.resample))
            elif source.perepoch > 0:
                chosen = list(source.urls)
                self.rng.shuffle(chosen)
                chosen = chosen[:source.perepoch]
            else:
                chosen = list(source.urls)
            result += chosen
        self.rng.shuffle(result)
        return result

    def __iter__(self) -> Iterator[Dict[str, str]]:
        for shard in self.get_shards_for_epoch():
            yield {"url": shard}


def resampled_(src: Any, n: int = sys.maxsize) -> Iterator[Any]:
    """``n`` items drawn with replacement from everything ``src`` yields (seeded from ``os.urandom``)."""
    items = list(src)
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    for _ in range(n):
        yield rng.choice(items)


def resampled(n: int = sys.maxsize) -> Any:
    """Stage: draw ``n`` items with replacement from everything the previous stage yields.

    Example:
        >>> len(list(resampled(5)(iter(["a.tar", "b.tar"]))))
        5
    """
    return _Generic("resampled", resampled_, n)


def non_empty(src: Any) -> Iterator[Any]:
    """Pass ``src`` through; raise ValueError if it yields nothing."""
    count = 0
    for x in src:
        yield x
        count += 1
    if count == 0:
        raise ValueError("pipeline stage received no data at all and this was declared as an error")


def shardspec(spec: str) -> Union[SimpleShardList, MultiShardSample]:
    """A :class:`MultiShardSample` for a ``.yaml`` spec, else a :class:`SimpleShardList`.

    Example:
        >>> len(shardspec("a-{0..3}.tar"))
        4
    """
    if spec.endswith(".yaml"):
        return MultiShardSample(spec)
    return SimpleShardList(spec)


def __getattr__(name: str) -> Any:
    """``IterableDataset``: torch's (webdataset's name here), loaded on first use."""
    from .pytorch import torch_name  # lazy: imports torch

    return torch_name(__name__, name)
