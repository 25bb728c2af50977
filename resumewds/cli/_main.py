r"""The ``resumewds`` command line.

Commands: ``index``, ``cat``, ``status``, ``verify``, ``prefetch``,
``report``, ``demo``.  Start-up does not import torch; only commands that
run a loader do.

The ``cat`` line format (a public contract) is in :func:`cat`'s help and
:func:`escape_field`.  Bad input ends with one ``Error: <what>: <problem>``
line and status 1 (2 for a bad option), never a traceback
(``RESUMEWDS_DEBUG=1`` shows it); Ctrl-C ends with ``Aborted!`` and 130.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import click

from .. import config
from ..errors import ResumeWDSError, ShardFormatError, naming
from ..redact import redact_text
from ..tar import sample_digest, scan_file
from ._out import SkipLines, quiet_numpy_warning
from ._out import StdoutError as _StdoutError
from ._out import detach_stdout as _detach_stdout
from ._out import flush as _flush
from ._out import write as _write
from ._progress import Bar as _Bar  # noqa: F401  (imported from here by tests)
from ._progress import NoBar as _NoBar  # noqa: F401
from ._progress import progress_bar as _progress


class _Interrupt:
    """Ctrl-C (SIGINT) of the ``resumewds`` process: never lost, whatever swallows it.

    torch's start-up imports numpy from C and clears any error raised meanwhile,
    so a plain ``KeyboardInterrupt`` can vanish; raised inside a callback that
    torch's C++ start-up runs, it aborts the process (``terminate called after
    throwing an instance of 'pybind11::error_already_set'``, status -6).
    :meth:`handler` remembers the signal and raises it, except within
    :meth:`deferred` (around the import of torch), which raises it once the
    import is done; :meth:`check` raises it again at the next step, and
    :func:`main` ends with status 130 however the command ended.
    """

    seen = False
    deferring = False

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        cls.seen = True
        if not cls.deferring:
            raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def deferred(cls) -> Iterator[None]:
        """A Ctrl-C within the block stops the command right after it, not inside it."""
        cls.deferring = True
        try:
            yield
        finally:
            cls.deferring = False
        cls.check()

    @classmethod
    def check(cls) -> None:
        """Raise ``KeyboardInterrupt`` again if a Ctrl-C came (and was swallowed)."""
        if cls.seen:
            raise KeyboardInterrupt


class _Group(click.Group):
    """Maps errors to one ``Error:`` line; a closed stdout ends quietly with status 1.

    OSError/ValueError are last-resort mappings; ``RESUMEWDS_DEBUG=1`` lets them propagate.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `resumewds status run.db | head -1`: the reader left, as for unix tools
            _detach_stdout()
            sys.exit(1)
        except ResumeWDSError as exc:
            raise click.ClickException(str(exc)) from exc
        except (OSError, ValueError, OverflowError, MemoryError) as exc:
            try:
                debug = bool(config.value("debug"))
            except ValueError:
                debug = False
            if debug:
                raise
            raise click.ClickException(redact_text(_describe_error(exc))) from exc


def _describe_error(exc: BaseException) -> str:
    """One line naming the file (when there is one) and the problem."""
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        if exc.filename is not None:
            return f"{exc.filename}: {what}"
        return what
    if isinstance(exc, MemoryError):
        return "out of memory (an input asks for more than this machine has)"
    return str(exc) or type(exc).__name__


def check_output(path: str, option: str = "-o") -> None:
    """The directory of an output file must exist and be writable (``click.BadParameter``)."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise click.BadParameter(f"{path}: directory {d} does not exist", param_hint=option)
    if not os.access(d, os.W_OK):
        raise click.BadParameter(f"{path}: directory {d} is not writable", param_hint=option)
    if os.path.isdir(path):
        raise click.BadParameter(f"{path}: is a directory", param_hint=option)


def _cache_size_option(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    """Validate ``--cache-size`` at parse time."""
    if value is None:
        return None
    try:
        config.parse_size(value)
    except (ValueError, ResumeWDSError) as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def check_environment() -> None:
    """Validate the environment variables the CLI's commands read (``NAME=value: problem``)."""
    for setting in list(config.VARS) + list(config.FETCH_VARS):
        try:
            config.value(setting)
        except (ValueError, ResumeWDSError) as exc:
            raise click.ClickException(str(exc)) from None


def refuse_duplicate_shards(manifest: Any) -> None:
    """Refuse the same shard twice (``cat m.json m.json``): its samples twice per epoch."""
    seen: Dict[str, int] = {}
    for i, s in enumerate(manifest.shards):
        j = seen.setdefault(s.url, i)
        if j != i:
            raise click.ClickException(f"{s.url}: the same shard is listed twice (positions {j} and {i}; "
                                   "was a manifest or pattern given twice?); refusing to read it twice per epoch")


@click.group(cls=_Group)
@click.version_option(package_name="resumewds")
def cli() -> None:
    """resumewds: crash-safe, exactly-resumable WebDataset loading.

    \b
    Example:
        resumewds index data/shard-*.tar -o data/manifest.json
        resumewds cat data/manifest.json --seed 7 --shuffle | head
    """


@cli.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write manifest.json (urls are stored relative to it).")
@click.option("--cache-dir", default=None, help="Cache for remote shards.")
@click.option("--cache-size", default=None, callback=_cache_size_option,
              help='Cache size limit for remote shards, e.g. "20GB" (default: RESUMEWDS_CACHE_SIZE).')
@click.option("--offsets", type=click.Choice(["auto", "inline", "file", "index"]), default="auto",
              show_default=True,
              help="Sample offsets inline in the JSON, in a memory-mapped side file (version 2/3), or in an "
                   "index file per shard (version 4; auto: inline up to 10,000 samples, else index).")
@click.option("--digests/--no-digests", default=True, show_default=True,
              help="Record each sample's xxh3_64 (manifest version 3); --no-digests writes "
                   "version 1/2 for older readers.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Shards indexed at once, each in its own process (default: the CPUs, at most 8).")
@click.option("--counts-only", is_flag=True,
              help="Read no shard: write the sample counts the sources give (a wids shard index, img2dataset's "
                   "*_stats.json); each shard's checksum and offsets are recorded when it is first read.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
def index(sources: List[str], output: str, cache_dir: Optional[str], cache_size: Optional[str], offsets: str,
          digests: bool, jobs: Optional[int], counts_only: bool, progress: Optional[bool]) -> None:
    """Index shards: sizes, xxh3_64, sample counts and sample byte ranges.

    Shards are indexed in parallel processes.  What is done is kept in
    OUTPUT.indexing: an index that is interrupted (even killed) continues
    where it stopped when the same command runs again, and ends with the
    manifest a clean run writes.  A wids shard index (or img2dataset's
    NNNNN_stats.json files) may be given as the source.

    \b
    Example:
        resumewds index data/shard-*.tar -o data/manifest.json
        resumewds index 'http://host/d/shard-{0000..0099}.tar' -o manifest.json -j 16
        resumewds index data/wids-index.json -o data/manifest.json --counts-only
    """
    # lazy, as every import in a function here: --help stays fast
    from ..sources import check_sources, default_jobs, resolve_sources, run_index, warn_duplicate_content

    check_sources(sources)
    check_output(output)
    check_environment()
    resolved = resolve_sources(list(sources), cache_dir=cache_dir)
    refuse_duplicate_shards(resolved)
    n = sum(1 for s in resolved.shards if not s.indexed)

    def resumed(done: int, todo: int) -> None:
        click.echo(f"{output}: continuing an interrupted index: {done} of {todo} shards already done", err=True)

    with _progress(n, "indexing", progress, unit="shards") as bar:
        m = run_index(resolved, output, jobs=jobs or default_jobs(), offsets=offsets, digests=digests,
                      cache_dir=cache_dir, cache_size=cache_size, counts_only=counts_only, progress=bar.update,
                      on_resume=resumed)
    warn_duplicate_content(m.shards)
    click.echo(f"{output}: {len(m.shards)} shards, {m.total_samples} samples, "
               f"{sum(s.size or 0 for s in m.shards)} bytes", err=True)


_NEEDS_ESCAPE = re.compile("[\\\\\t\n\r\0\udc80-\udcff]")
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}
_UNESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.S)


def _escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    e = _ESCAPES.get(c)
    return e if e is not None else f"\\x{ord(c) - 0xDC00:02x}"  # a non-UTF-8 byte of the name


def escape_field(text: str) -> str:
    r"""Escape a SHARD or KEY field of a ``resumewds cat`` line (so a line has exactly three fields).

    Backslash, TAB, newline, carriage return and NUL become ``\\``, ``\t``,
    ``\n``, ``\r``, ``\0``; a byte of a tar name that is not UTF-8 (a
    surrogate escape) becomes ``\xHH``.  Every plain key is unchanged.

    Example:
        >>> escape_field("dir/sample-0001")
        'dir/sample-0001'
        >>> print(escape_field("a\tb\\c\0"), escape_field(b"caf\xe9".decode("utf-8", "surrogateescape")))
        a\tb\\c\0 caf\xe9
    """
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    return _NEEDS_ESCAPE.sub(_escape_char, text)


def unescape_field(text: str) -> str:
    r"""Invert :func:`escape_field` (``\xHH`` back to a surrogate escape).

    Raises:
        ValueError: an escape :func:`escape_field` does not produce.

    Example:
        >>> unescape_field(r"a\tb\\c\x80") == "a\tb\\c\udc80"
        True
    """
    def one(m: re.Match[str]) -> str:
        g = m.group(1)
        if len(g) == 3 and g[0] == "x":
            return chr(0xDC00 + int(g[1:], 16))
        if g in _UNESCAPES:
            return _UNESCAPES[g]
        raise ValueError(f"bad escape \\{g} in a cat field")

    return _UNESCAPE.sub(one, text)


def cat_line(sample: dict) -> str:
    r"""One ``resumewds cat`` line (without newline) for a raw sample.

    Example:
        >>> cat_line({"__url__": "/d/s-0.tar", "__key__": "k\t1", "txt": b"x"}).split("\t")[:2]
        ['s-0.tar', 'k\\t1']
    """
    from ..manifest import shard_basename

    return (f"{escape_field(shard_basename(sample['__url__']))}\t{escape_field(sample['__key__'])}\t"
            f"{sample_digest(sample)}")


def _options(*opts: Callable) -> Callable[[Callable], Callable]:
    """One decorator for several click options, applied in the order listed."""

    def apply(f: Callable) -> Callable:
        for o in reversed(opts):
            f = o(f)
        return f

    return apply


_CACHE_DIR = click.option("--cache-dir", default=None, help="Shard cache directory (RESUMEWDS_CACHE_DIR).")
_ALLOW_REMOTE = (
    click.option("--allow-remote-pipe", is_flag=True, help="Allow pipe: urls from a remote manifest."),
    click.option("--allow-remote-local", is_flag=True, default=None,
                 help="Allow a remote manifest to name local files (RESUMEWDS_ALLOW_REMOTE_LOCAL)."),
)

_dataset_options = _options(
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of the order."),
    click.option("--shuffle", "shuffle", flag_value="window", default=None,
                 help="Shuffle: shard order per epoch and samples within windows of shards."),
    click.option("--shuffle-mode", "shuffle_mode", type=click.Choice(["window", "shards", "none"]),
                 default=None, help="Explicit order algorithm (overrides --shuffle)."),
    click.option("--shuffle-window", type=click.IntRange(min=1), default=8, show_default=True,
                 help="Shards per shuffle window."),
    _CACHE_DIR,
    click.option("--cache-size", default=None, callback=_cache_size_option,
                 help='Cache size limit, e.g. "20GB" (RESUMEWDS_CACHE_SIZE).'),
    click.option("--verify", type=click.Choice(["once", "always", "never"]), default="once",
                 show_default=True, help="When to verify shard checksums."),
    click.option("--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True,
                 help="A shard that cannot be fetched or verified: stop, or skip it (and say so)."),
    *_ALLOW_REMOTE,
    click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="Read timeout in seconds for http."),
    click.option("--attempts", type=click.IntRange(min=1), default=None, help="Fetch attempts per shard."),
)


def _make_dataset(sources: List[str], seed: int, shuffle: Optional[str], shuffle_mode: Optional[str],
                  shuffle_window: int, cache_dir: Optional[str], cache_size: Optional[str], verify: str,
                  on_error: str, allow_remote_pipe: bool, allow_remote_local: Optional[bool],
                  timeout: Optional[float], attempts: Optional[int]) -> Any:
    from ..dataset import WebDataset
    from ..sources import check_sources, resolve_sources

    check_sources(sources)
    check_environment()
    fc = _fetch_config(timeout, attempts)
    manifest = resolve_sources(list(sources), fetch_config=fc, allow_remote_pipe=allow_remote_pipe,
                               cache_dir=cache_dir, allow_remote_local=allow_remote_local)
    refuse_duplicate_shards(manifest)
    mode: Any = shuffle_mode or shuffle or False
    return WebDataset(manifest, seed=seed, shuffle=mode, shuffle_window=shuffle_window, cache_dir=cache_dir,
                      cache_size=cache_size, verify=verify, on_error=on_error,
                      allow_remote_pipe=allow_remote_pipe, allow_remote_local=allow_remote_local, fetch=fc)


def _fetch_config(timeout: Optional[float], attempts: Optional[int]) -> Any:
    from ..fetch import FetchConfig

    if attempts is not None and attempts < 1:
        raise click.BadParameter(f"must be >= 1, got {attempts}", param_hint="--attempts")
    if timeout is not None and not timeout > 0:
        raise click.BadParameter(f"must be > 0, got {timeout}", param_hint="--timeout")
    try:  # defaults, then RESUMEWDS_FETCH_*, then the flags
        return FetchConfig.from_env(read_timeout=timeout, attempts=attempts)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.argument("sources", nargs=-1, required=True)
@_dataset_options
@click.option("--epochs", type=click.IntRange(min=0), default=1, show_default=True, help="Epochs to print.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Stop after N samples in all (across restarts).")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="DataLoader worker processes.")
@click.option("--chunk", type=click.IntRange(min=1), default=64, show_default=True, help="Samples per worker task.")
@click.option("--journal", type=click.Path(dir_okay=False), default=None,
              help="SQLite journal; a rerun continues after its last commit.")
@click.option("--commit-every", type=int, default=100, show_default=True,
              help="With --journal: commit every K delivered samples.")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="This rank (default: RANK or 0).")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="World size (default: WORLD_SIZE or 1).")
@click.option("--progress", is_flag=True, help="Progress bar on stderr.")
@click.option("--stats", "show_stats", is_flag=True, help="Print loader stats as JSON on stderr at the end.")
def cat(sources: List[str], epochs: int, limit: Optional[int], workers: int, chunk: int,
        journal: Optional[str], commit_every: int, rank: Optional[int], world_size: Optional[int],
        progress: bool, show_stats: bool, **dsopts: Any) -> None:
    """Print one line per delivered sample: SHARD<TAB>KEY<TAB>DIGEST.

    SHARD is the basename of the shard's URL, KEY the sample's __key__,
    DIGEST the xxh3_64 of the sample's member bytes concatenated in
    ascending order of extension name.  Two runs deliver the same samples in
    the same order exactly when their outputs are equal.  In SHARD and KEY,
    backslash, TAB, newline, CR and NUL are printed as \\\\, \\t, \\n,
    \\r, \\0, and a byte of a name that is not UTF-8 as \\xHH; plain
    names are unchanged.

    \b
    Example:
        resumewds cat data/manifest.json --seed 7 --shuffle --epochs 2 > run.txt
        resumewds cat data/manifest.json --seed 7 --shuffle --journal run.db --commit-every 100
    """
    quiet_numpy_warning()  # before the loader imports torch
    with _Interrupt.deferred():  # torch's start-up: a Ctrl-C stops the command right after it
        from ..loader import WebLoader  # lazy: torch
    if commit_every < 1:
        raise click.BadParameter("must be >= 1", param_hint="--commit-every")
    ds = _make_dataset(list(sources), **dsopts)
    if epochs == 0:
        click.echo("resumewds: --epochs 0: nothing to print", err=True)
        return
    loader = WebLoader(ds, batch_size=None, num_workers=workers, chunk_size=chunk, rank=rank,
                       world_size=world_size, journal=journal, resume=journal is not None,
                       preempt=journal is not None)  # SIGTERM: stop, commit what was printed, exit 143
    out = sys.stdout
    n = loader.samples_total
    since = 0
    per_epoch = int(loader.config["samples"])
    total = min(limit, epochs * per_epoch) if limit is not None else epochs * per_epoch
    if _nothing_left(loader, journal, epochs, limit, n):
        loader.close()
        return
    bar = _progress(total, "cat", progress if progress else False, initial=n)
    skips = SkipLines(loader.stats_.failed, lambda line: click.echo(redact_text(line), err=True))
    try:
        with bar:
            while loader.epoch < epochs and (limit is None or n < limit) and not loader.preempted:
                for sample in loader:
                    _Interrupt.check()
                    _write(out, cat_line(sample) + "\n")
                    n += 1
                    since += 1
                    if journal is not None and since >= commit_every:
                        _flush(out)  # commit only what reached stdout
                        loader.commit(n)
                        since = 0
                    bar.update(1)
                    skips.poll()
                    if limit is not None and n >= limit:
                        break
        _flush(out)
        if journal is not None and since:
            loader.commit(n)
        if loader.preempted:
            click.echo(f"resumewds: stopped by signal {loader.preempt_signal} after {n} samples; "
                       f"committed to {journal}: rerun to continue", err=True)
            sys.exit(143)
    except BrokenPipeError:
        _detach_stdout()
        sys.exit(1)
    except _StdoutError as exc:
        _detach_stdout()
        lost = f"; the last {since} line(s) were not committed to {journal}" if journal and since else ""
        raise click.ClickException(f"cannot write to stdout: {exc}{lost}") from None
    finally:
        skips.close()
        if show_stats:
            click.echo(redact_text(json.dumps(loader.stats(), default=str)), err=True)
        loader.close()


def _nothing_left(loader: Any, journal: Optional[str], epochs: int, limit: Optional[int], n: int) -> bool:
    """Say so (on stderr) when a resumed run has nothing left to print."""
    if limit is not None and n >= limit:
        if journal and n:
            click.echo(f"resumewds: --limit {limit} already reached (journal {journal} holds {n} delivered "
                       "samples); nothing to print (raise --limit to continue)", err=True)
        else:
            click.echo(f"resumewds: --limit {limit}: nothing to print", err=True)
        return True
    if loader.epoch >= epochs:
        click.echo(f"resumewds: all {epochs} epoch(s) were already delivered ({n} samples, journal "
                   f"{journal}); nothing to print (raise --epochs to continue)", err=True)
        return True
    return False


@cli.command()
@click.argument("journal", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (fields in `resumewds.journal.status`).")
def status(journal: str, as_json: bool) -> None:
    """Show a run's progress from its journal (all ranks' files together).

    Epoch and position, per-shard states, retries, repairs, failures, last
    errors and recent throughput.

    \b
    Example:
        resumewds status run.db
        resumewds status run.db --json | jq .latest
    """
    from ..report import full_status  # (the journal's sqlite_utils imports numpy)

    st = full_status(journal)
    if as_json:
        click.echo(json.dumps(st, indent=2, sort_keys=True, default=str))
    else:
        from ..journal import format_status

        click.echo(format_status(st))
        if st.get("consumption", {}).get("complete"):
            click.echo(f"complete: epoch {st['consumption']['epoch']} was delivered in full "
                       f"({st['consumption']['samples']} samples)")


@cli.command()
@click.argument("journal", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
def report(journal: str, output: str) -> None:
    """Write one self-contained HTML page about a run (all ranks' files).

    Throughput, cache hit rate, retries/repairs/faults over time, shard
    states and a summary.  plotly.js is embedded: the page works offline.
    Needs plotly (pip install 'resumewds[report]').

    \b
    Example:
        resumewds report run.db -o report.html
    """
    from ..report import write_report

    check_output(output)
    write_report(journal, output)
    click.echo(f"wrote {output}", err=True)


#: the arguments shared by ``verify`` and ``prefetch``
_cache_pass_options = _options(
    click.argument("sources", nargs=-1, required=True),
    _CACHE_DIR,
    click.option("--cache-size", default=None, callback=_cache_size_option, help='Cache size limit, e.g. "20GB".'),
    *_ALLOW_REMOTE,
    click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal)."),
)


def _cache_pass(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
                allow_remote_pipe: bool, allow_remote_local: Optional[bool], progress: Optional[bool],
                verb: str) -> None:
    """Run ``verify_all`` or ``prefetch_all`` over the sources with a byte progress bar."""
    from ..cache import ShardStore
    from ..sources import check_results, check_sources, echo_range_repairs, resolve_sources

    check_sources(sources)
    check_environment()
    m = resolve_sources(list(sources), allow_remote_pipe=allow_remote_pipe, cache_dir=cache_dir,
                        allow_remote_local=allow_remote_local)
    store = ShardStore(cache_dir=cache_dir, cache_size=cache_size, verify="always")
    if verb == "verify":
        store.on_event = echo_range_repairs(lambda line: click.echo(line, err=True))
    run = store.verify_all if verb == "verify" else store.prefetch_all
    with _progress(sum(s.size or 0 for s in m.shards), verb + "ing", progress, unit="bytes") as bar:
        results = run(m.shards, progress=bar.update)
    if verb == "verify":
        results = [(s, ok, e) if not ok else (s, *check_structure(store, s)) for s, ok, e in results]
        results = check_results(store, results, lambda line: click.echo(line, err=True))
    _report_results(results, verb)


def check_structure(store: Any, shard: Any) -> Tuple[bool, Optional[BaseException]]:
    """``(ok, error)`` of a shard that passed :meth:`ShardStore.verify_all`, read through the tar framer.

    Without a checksum the bytes are a whole tar archive only once the framer has
    walked them (an empty file or a gzip is never "ok"); a manifest's index must match.
    """
    from ..fetch import is_remote_url, local_path

    path = store.entry_path(shard.url) if is_remote_url(shard.url) else local_path(shard.url)
    if shard.xxh3_64 is not None and not is_remote_url(shard.url):
        return True, None  # hashed against the manifest just now
    try:
        if os.path.isdir(path):
            raise ShardFormatError(path, 0, "is a directory, not a shard file")
        idx = scan_file(path, shard.url if not is_remote_url(shard.url) else f"{shard.url} (cached copy)")
    except ResumeWDSError as exc:
        return False, exc
    except OSError as exc:
        return False, ShardFormatError(path, 0, f"cannot read: {exc.strerror or exc}")
    if shard.indexed and (idx.samples != shard.samples or list(idx.offsets) != [int(x) for x in shard.offsets]):
        return False, ShardFormatError(shard.url, 0, f"holds {idx.samples} samples at other offsets than the "
                                       f"manifest's {shard.samples} (manifest does not match the shard)")
    if shard.samples is not None and idx.samples != shard.samples:  # a counts-only source (a wids index)
        return False, ShardFormatError(shard.url, 0, f"holds {idx.samples} samples, its source says "
                                       f"{shard.samples}")
    return True, None


def _report_results(results: Any, verb: str) -> None:
    bad = [(s, e) for s, ok, e in results if not ok]
    for s, e in bad:
        click.echo(redact_text(f"FAILED {naming(s.url, e)}"), err=True)
    note = ""
    if verb == "verify":
        loose = sum(1 for s, ok, _ in results if ok and s.xxh3_64 is None)
        if loose:
            note = f" ({loose} without a checksum in the manifest: checked as whole tar archives only)"
    click.echo(f"{verb}: {len(results) - len(bad)} ok, {len(bad)} failed{note}", err=True)
    if bad:
        raise SystemExit(1)


@cli.command()
@_cache_pass_options
def verify(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
           allow_remote_pipe: bool, allow_remote_local: Optional[bool], progress: Optional[bool]) -> None:
    """Check every shard against the manifest's size and xxh3_64.

    Local shards are hashed in place; remote shards are checked in the
    cache, and fetched or repaired when missing or corrupt.  Exits 1 if any
    shard fails.

    \b
    Example:
        resumewds verify data/manifest.json
    """
    _cache_pass(sources, cache_dir, cache_size, allow_remote_pipe, allow_remote_local, progress, "verify")


@cli.command()
@_cache_pass_options
def prefetch(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
             allow_remote_pipe: bool, allow_remote_local: Optional[bool], progress: Optional[bool]) -> None:
    """Download every remote shard into the cache, verified, ahead of a run.

    \b
    Example:
        resumewds prefetch http://host/data/manifest.json --cache-dir /scratch/cache
    """
    _cache_pass(sources, cache_dir, cache_size, allow_remote_pipe, allow_remote_local, progress, "prefetch")


@cli.command()
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="Where to write the demo shards (default: a temporary directory).")
@click.option("--shards", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=250, show_default=True, help="Samples per shard.")
def demo(directory: Optional[str], shards: int, samples: int) -> None:
    """Generate shards, index them, shuffle, interrupt, resume, and compare.

    \b
    Example:
        resumewds demo
    """
    with _Interrupt.deferred():  # torch's start-up
        from ._demo import run_demo

    ok = run_demo(directory, shards=shards, samples=samples)
    if not ok:
        raise click.ClickException("demo: sequences differ")


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point (``resumewds`` and ``python -m resumewds``); owns SIGINT (:class:`_Interrupt`)."""
    own = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not when started ignoring it
    previous = signal.signal(signal.SIGINT, _Interrupt.handler) if own else None
    _Interrupt.seen = False
    try:
        cli.main(args=argv, prog_name="resumewds")
    except BaseException as exc:
        if not _Interrupt.seen:
            raise
        # click said "Aborted!" (or the Error: line) with status 1; otherwise the
        # command ended on its own after a swallowed Ctrl-C, or failed because of it
        if not (isinstance(exc, SystemExit) and exc.code == 1):
            click.echo("Aborted!", err=True)
        sys.exit(130)
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":  # pragma: no cover
    main()
