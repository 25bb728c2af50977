"""The ``resumewds`` command line.

Commands: ``index``, ``cat``, ``status``, ``verify``, ``prefetch``,
``report``, ``demo``.  Start-up does not import torch; only commands that
run a loader do.

The ``cat`` line format is a public contract::

    SHARD<TAB>KEY<TAB>DIGEST

SHARD is the basename of the shard's URL, KEY the sample's ``__key__``,
DIGEST the xxh3_64 hex digest of the sample's member bytes concatenated in
ascending order of extension name (:func:`resumewds.tario.sample_digest`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterator, List, Optional

import click

from .errors import ResumeWDSError


def _progress(length: int, label: str, enabled: Optional[bool] = None) -> Any:
    """A click progress bar on stderr; silent when stderr is not a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return _NoBar()
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True,
                             show_eta=True)


class _NoBar:
    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *a: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ResumeWDSError as exc:
            raise click.ClickException(str(exc)) from exc


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
@click.option("--offsets", type=click.Choice(["auto", "inline", "file"]), default="auto", show_default=True,
              help="Sample offsets inline in the JSON, or in a memory-mapped side file "
                   "(auto: a side file above 1,000,000 samples).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
def index(sources: List[str], output: str, cache_dir: Optional[str], offsets: str,
          progress: Optional[bool]) -> None:
    """Index shards: sizes, xxh3_64, sample counts and sample byte ranges.

    \b
    Example:
        resumewds index data/shard-*.tar -o data/manifest.json
        resumewds index 'http://host/d/shard-{0000..0099}.tar' -o manifest.json
    """
    from .cache import ShardStore
    from .dataset import build_manifest
    from .sources import resolve_sources

    n = len(resolve_sources(list(sources)).shards)
    store = ShardStore(cache_dir=cache_dir)
    with _progress(n, "indexing", progress) as bar:
        m = build_manifest(list(sources), output, store=store, progress=bar.update, offsets=offsets)
    click.echo(f"{output}: {len(m.shards)} shards, {m.total_samples} samples, "
               f"{sum(s.size or 0 for s in m.shards)} bytes", err=True)


def cat_line(sample: dict) -> str:
    """One ``resumewds cat`` line (without newline) for a raw sample."""
    from .manifest import shard_basename
    from .tario import sample_digest

    return f"{shard_basename(sample['__url__'])}\t{sample['__key__']}\t{sample_digest(sample)}"


def _dataset_options(f: Callable) -> Callable:
    opts = [
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the order."),
        click.option("--shuffle", "shuffle", flag_value="window", default=None,
                     help="Shuffle: shard order per epoch and samples within windows of shards."),
        click.option("--shuffle-mode", "shuffle_mode", type=click.Choice(["window", "shards", "none"]),
                     default=None, help="Explicit order algorithm (overrides --shuffle)."),
        click.option("--shuffle-window", type=int, default=8, show_default=True,
                     help="Shards per shuffle window."),
        click.option("--cache-dir", default=None, help="Shard cache directory (RESUMEWDS_CACHE_DIR)."),
        click.option("--cache-size", default=None, help='Cache size limit, e.g. "20GB" (RESUMEWDS_CACHE_SIZE).'),
        click.option("--verify", type=click.Choice(["once", "always", "never"]), default="once",
                     show_default=True, help="When to verify shard checksums."),
        click.option("--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True,
                     help="A shard that cannot be fetched or verified: stop, or skip it (and say so)."),
        click.option("--allow-remote-pipe", is_flag=True, help="Allow pipe: urls from a remote manifest."),
        click.option("--timeout", type=float, default=None, help="Read timeout in seconds for http."),
        click.option("--attempts", type=int, default=None, help="Fetch attempts per shard."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _make_dataset(sources: List[str], seed: int, shuffle: Optional[str], shuffle_mode: Optional[str],
                  shuffle_window: int, cache_dir: Optional[str], cache_size: Optional[str], verify: str,
                  on_error: str, allow_remote_pipe: bool, timeout: Optional[float],
                  attempts: Optional[int]) -> Any:
    from .dataset import WebDataset
    from .fetch import FetchConfig

    fc = FetchConfig()
    if timeout is not None:
        fc.read_timeout = timeout
    if attempts is not None:
        fc.attempts = attempts
    mode: Any = shuffle_mode or shuffle or False
    src: Any = list(sources) if len(sources) > 1 else sources[0]
    return WebDataset(src, seed=seed, shuffle=mode, shuffle_window=shuffle_window, cache_dir=cache_dir,
                      cache_size=cache_size, verify=verify, on_error=on_error,
                      allow_remote_pipe=allow_remote_pipe, fetch=fc)


@cli.command()
@click.argument("sources", nargs=-1, required=True)
@_dataset_options
@click.option("--epochs", type=int, default=1, show_default=True, help="Epochs to print.")
@click.option("--limit", type=int, default=None, help="Stop after N samples in all (across restarts).")
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader worker processes.")
@click.option("--chunk", type=int, default=64, show_default=True, help="Samples per worker task.")
@click.option("--journal", type=click.Path(dir_okay=False), default=None,
              help="SQLite journal; a rerun continues after its last commit.")
@click.option("--commit-every", type=int, default=100, show_default=True,
              help="With --journal: commit every K delivered samples.")
@click.option("--rank", type=int, default=None, help="This rank (default: RANK or 0).")
@click.option("--world-size", type=int, default=None, help="World size (default: WORLD_SIZE or 1).")
@click.option("--progress", is_flag=True, help="Progress bar on stderr.")
@click.option("--stats", "show_stats", is_flag=True, help="Print loader stats as JSON on stderr at the end.")
def cat(sources: List[str], epochs: int, limit: Optional[int], workers: int, chunk: int,
        journal: Optional[str], commit_every: int, rank: Optional[int], world_size: Optional[int],
        progress: bool, show_stats: bool, **dsopts: Any) -> None:
    """Print one line per delivered sample: SHARD<TAB>KEY<TAB>DIGEST.

    SHARD is the basename of the shard's URL, KEY the sample's __key__,
    DIGEST the xxh3_64 of the sample's member bytes concatenated in
    ascending order of extension name.  Two runs deliver the same samples in
    the same order exactly when their outputs are equal.

    \b
    Example:
        resumewds cat data/manifest.json --seed 7 --shuffle --epochs 2 > run.txt
        resumewds cat data/manifest.json --seed 7 --shuffle --journal run.db --commit-every 100
    """
    from .loader import WebLoader

    if commit_every < 1:
        raise click.BadParameter("must be >= 1", param_hint="--commit-every")
    ds = _make_dataset(list(sources), **dsopts)
    loader = WebLoader(ds, batch_size=None, num_workers=workers, chunk_size=chunk, rank=rank,
                       world_size=world_size, journal=journal, resume=journal is not None,
                       preempt=journal is not None)  # SIGTERM: stop, commit what was printed, exit 143
    out = sys.stdout
    n = loader.samples_total
    since = 0
    total = min(limit, epochs * int(loader.config["samples"])) if limit else epochs * int(loader.config["samples"])
    bar = _progress(total, "cat", progress if progress else False)
    try:
        with bar:
            bar.update(n)
            while loader.epoch < epochs and (limit is None or n < limit) and not loader.preempted:
                for sample in loader:
                    out.write(cat_line(sample) + "\n")
                    n += 1
                    since += 1
                    if journal is not None and since >= commit_every:
                        out.flush()
                        loader.commit(n)
                        since = 0
                    bar.update(1)
                    if limit is not None and n >= limit:
                        break
        out.flush()
        if journal is not None and since:
            loader.commit(n)
        if loader.preempted:
            click.echo(f"resumewds: stopped by signal {loader.preempt_signal} after {n} samples; "
                       f"committed to {journal}: rerun to continue", err=True)
            sys.exit(143)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    finally:
        failed = loader.stats_.failed
        if failed:
            click.echo(f"resumewds: {len(failed)} shard(s) failed and were skipped:", err=True)
            for url, err in sorted(failed.items()):
                click.echo(f"  {url}: {err}", err=True)
        if show_stats:
            click.echo(json.dumps(loader.stats(), default=str), err=True)
        loader.close()


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
    from .journal import format_status, status as journal_status

    st = journal_status(journal)
    if as_json:
        click.echo(json.dumps(st, indent=2, sort_keys=True, default=str))
    else:
        click.echo(format_status(st))


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
    from .report import write_report

    write_report(journal, output)
    click.echo(f"wrote {output}", err=True)


def _store_and_shards(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
                      allow_remote_pipe: bool) -> Any:
    from .cache import ShardStore
    from .sources import resolve_sources

    m = resolve_sources(list(sources), allow_remote_pipe=allow_remote_pipe)
    return ShardStore(cache_dir=cache_dir, cache_size=cache_size, verify="always"), m


def _cache_pass_options(f: Callable) -> Callable:
    """The arguments shared by ``verify`` and ``prefetch``."""
    opts = [
        click.argument("sources", nargs=-1, required=True),
        click.option("--cache-dir", default=None, help="Shard cache directory (RESUMEWDS_CACHE_DIR)."),
        click.option("--cache-size", default=None, help='Cache size limit, e.g. "20GB".'),
        click.option("--allow-remote-pipe", is_flag=True, help="Allow pipe: urls from a remote manifest."),
        click.option("--progress/--no-progress", default=None,
                     help="Progress bar (default: when stderr is a terminal)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _cache_pass(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
                allow_remote_pipe: bool, progress: Optional[bool], verb: str) -> None:
    """Run ``verify_all`` or ``prefetch_all`` over the sources with a byte progress bar."""
    store, m = _store_and_shards(sources, cache_dir, cache_size, allow_remote_pipe)
    run = store.verify_all if verb == "verify" else store.prefetch_all
    with _progress(sum(s.size or 0 for s in m.shards), verb + "ing", progress) as bar:
        results = run(m.shards, progress=bar.update)
    _report_results(results, verb)


def _report_results(results: Any, verb: str) -> None:
    bad = [(s, e) for s, ok, e in results if not ok]
    for s, e in bad:
        click.echo(f"FAILED {s.url}: {e}", err=True)
    click.echo(f"{verb}: {len(results) - len(bad)} ok, {len(bad)} failed", err=True)
    if bad:
        raise SystemExit(1)


@cli.command()
@_cache_pass_options
def verify(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
           allow_remote_pipe: bool, progress: Optional[bool]) -> None:
    """Check every shard against the manifest's size and xxh3_64.

    Local shards are hashed in place; remote shards are checked in the
    cache, and fetched or repaired when missing or corrupt.  Exits 1 if any
    shard fails.

    \b
    Example:
        resumewds verify data/manifest.json
    """
    _cache_pass(sources, cache_dir, cache_size, allow_remote_pipe, progress, "verify")


@cli.command()
@_cache_pass_options
def prefetch(sources: List[str], cache_dir: Optional[str], cache_size: Optional[str],
             allow_remote_pipe: bool, progress: Optional[bool]) -> None:
    """Download every remote shard into the cache, verified, ahead of a run.

    \b
    Example:
        resumewds prefetch http://host/data/manifest.json --cache-dir /scratch/cache
    """
    _cache_pass(sources, cache_dir, cache_size, allow_remote_pipe, progress, "prefetch")


@cli.command()
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="Where to write the demo shards (default: a temporary directory).")
@click.option("--shards", type=int, default=16, show_default=True)
@click.option("--samples", type=int, default=250, show_default=True, help="Samples per shard.")
def demo(directory: Optional[str], shards: int, samples: int) -> None:
    """Generate shards, index them, shuffle, interrupt, resume, and compare.

    \b
    Example:
        resumewds demo
    """
    from .demo import run_demo

    ok = run_demo(directory, shards=shards, samples=samples)
    if not ok:
        raise click.ClickException("demo: sequences differ")


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point (``resumewds`` and ``python -m resumewds``)."""
    cli.main(args=argv, prog_name="resumewds")


if __name__ == "__main__":  # pragma: no cover
    main()
