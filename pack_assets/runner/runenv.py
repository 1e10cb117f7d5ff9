"""What a `pack-assets run` needs around Dagster, kept free of the dagster import so `--help` stays fast:
which Dagster home and its dagster.yaml, how many shard processes by default, when the process started.

And the only places where the command changes process-wide behaviour, each kept because it still pays (figures
in docs/benchmarks.md, `bench/bench_runenv.py`): `prepare_dagster_process` (Dagster's SQLite event log
committed without an fsync per event; alembic's migration scripts read once per process, a patch of
alembic; fewer garbage collections), `exit_without_teardown` (``os._exit`` after the summary, skipping
the interpreter's teardown of every module) and `pyarrow_without_pandas` (pyarrow's look for pandas answered
once, before the helpers are forked). Only the CLI's processes call them; `dagster dev` and library
callers keep Dagster's and Python's defaults."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from pathlib import Path

DEFAULT_HOME = Path("dagster_home")
# The project's instance settings (telemetry off, concurrency pools), shipped in the package so a home
# made from any folder gets them; the repository's dagster_home/dagster.yaml is the same file.
DAGSTER_YAML = Path(__file__).with_name("dagster.yaml")

# Without shard workers (`orchestrate.run_pipeline` called with no `runner.shardwork` workers: a library
# caller), shard runs go to Dagster worker processes (one per core) only when at least this many shards need
# a run: such workers pay Dagster's imports each and leave the parent cold for plan and audit, which fewer
# shards do not win back (bench/bench_jobs.py: --jobs 1 won every whole run up to 16 shards; 24 extrapolates
# the saving's slope, docs/benchmarks.md). `pack-assets run` uses its helper processes instead.
JOBS_FROM_SHARDS = 24


def default_jobs(shards_to_run: int, cores: int | None = None) -> int:
    """What `--jobs 0` (the default) means: 1 below JOBS_FROM_SHARDS shards to run, else one per core."""
    return (cores or os.cpu_count() or 1) if shards_to_run >= JOBS_FROM_SHARDS else 1


def resolve_dagster_home(arg: str | None, environ=os.environ) -> tuple[Path, str]:
    """The Dagster home and where it came from: `--dagster-home`, then DAGSTER_HOME, then ./dagster_home.
    Absolute, since Dagster requires an absolute DAGSTER_HOME."""
    if arg:
        return Path(arg).resolve(), "--dagster-home"
    if environ.get("DAGSTER_HOME"):
        return Path(environ["DAGSTER_HOME"]).resolve(), "DAGSTER_HOME"
    return DEFAULT_HOME.resolve(), "default ./dagster_home"


def ensure_dagster_yaml(home: Path) -> bool:
    """Give a home without dagster.yaml the project's settings; an existing one is never touched.
    Returns whether it was written. Atomic: a temp file linked into place, which fails if one appeared."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if target.exists():
        return False
    from ..core.safety import mkstemp

    fd, tmp = mkstemp(".dagster.yaml.tmp-", home)  # a unique name: a killed run's leftover never blocks the next
    try:
        with os.fdopen(fd, "w") as f:
            f.write(DAGSTER_YAML.read_text())
        os.link(tmp, target)
        return True
    except FileExistsError:  # another run made it first: keep theirs
        return False
    finally:
        os.unlink(tmp)


def process_start() -> float:
    """time.perf_counter() at the moment this process started (Linux /proc: interpreter start-up and every
    import included); elsewhere, now."""
    now = time.perf_counter()
    try:
        since_boot = float(Path("/proc/uptime").read_text().split()[0])
        # field 22, starttime, in clock ticks since boot; the command name before it may hold spaces
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - max(age, 0.0)


# -- process-wide changes, the CLI's processes only ------------------------------------------------------------


def prepare_dagster_process(worker: bool = False) -> None:
    """What a CLI process that runs Dagster changes for the whole process, in this one place: the event log's
    commits (`relax_event_log_sync`), the migration scripts read once (`cache_alembic_scripts`), one SQLAlchemy
    engine per SQLite database (`share_sqlite_engines`), and in a
    Dagster worker process (``worker``) the collector's thresholds (`relax_gc`; the command's own process set
    them at start)."""
    relax_event_log_sync()
    cache_alembic_scripts()
    share_sqlite_engines()
    if worker:
        relax_gc()


_RELAXED = False  # the listener is process-wide: installed once


def _main_file(cur) -> str:
    return next((row[2] for row in cur.execute("PRAGMA database_list") if row[1] == "main"), "")


def _new_in_dagster_home(cur) -> bool:
    """An empty database file under DAGSTER_HOME: one Dagster is about to create (all of its are WAL)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or cur.execute("PRAGMA page_count").fetchone()[0] != 0:
        return False
    path = _main_file(cur)
    return bool(path) and Path(path).resolve().is_relative_to(Path(home).resolve())


def relax_event_log_sync() -> None:
    """Commit this process's Dagster SQLite writes (run and event log, one commit per event) without an fsync
    each: `synchronous=NORMAL` on every SQLAlchemy SQLite connection in WAL mode (Dagster's own), and new run
    databases under DAGSTER_HOME made WAL before their tables. (Holding a connection open to skip the
    checkpoint at each close was tried: `dagster dev` watches the .db file itself, not its -wal, so a UI
    following the run would stall until a checkpoint.) SQLite's
    documented trade-off: a WAL database stays consistent; a power cut may lose the last events, never the
    run's outputs, which the stages fsync themselves. A run commits about a hundred events; on a busy disk
    their fsyncs were a measurable share of a short run (docs/benchmarks.md). Only the CLI's processes do
    this; `dagster dev` keeps Dagster's settings."""
    global _RELAXED
    if _RELAXED:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def on_connect(dbapi_conn, _record) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            cur = dbapi_conn.cursor()
            try:
                mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal" and _new_in_dagster_home(cur):
                    # Dagster creates each run's event database in rollback-journal mode (an fsync of the journal
                    # and its folder per table) and only then switches it to WAL: switch first
                    mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode == "wal":
                    cur.execute("PRAGMA synchronous=NORMAL")
            finally:
                cur.close()

    event.listen(Engine, "connect", on_connect)
    _RELAXED = True


_ALEMBIC_CACHED = False


def cache_alembic_scripts() -> None:
    """Read Dagster's schema migration scripts once per process: a patch of alembic's
    `ScriptDirectory.from_config`, kept because it still pays (bench/bench_runenv.py: one load of the scripts
    per command instead of five to nine). Each time one of Dagster's SQLite storages checks or stamps its
    schema revision (the run, schedule and event log storages at load, each new run's event database),
    alembic makes a new directory object, which loads every one of Dagster's migration scripts again to find
    the head revision. The scripts do not change while a command runs, so this process keeps one directory
    object per set of the options it is made from (Dagster's three alembic.ini files are the same there).
    Only the CLI's processes do this."""
    global _ALEMBIC_CACHED
    if _ALEMBIC_CACHED:
        return
    from alembic.script import ScriptDirectory

    made = ScriptDirectory.from_config.__func__
    cache: dict[tuple, ScriptDirectory] = {}

    def from_config(cls, config, *more, **options):
        if more or options:  # a call this was not written for: as alembic does it
            return made(cls, config, *more, **options)
        # what from_config reads: the [alembic] section, the post-write hooks, the messaging options (not
        # `here`, the ini file's folder, which only interpolates into the values compared)
        key = (cls, *(tuple(sorted((k, v) for k, v in config.get_section(name, {}).items() if k != "here"))
                      for name in (config.config_ini_section, "post_write_hooks")),
               tuple(sorted((k, repr(v)) for k, v in getattr(config, "messaging_opts", {}).items())))
        if key not in cache:
            cache[key] = made(cls, config)
        return cache[key]

    ScriptDirectory.from_config = classmethod(from_config)
    _ALEMBIC_CACHED = True


class _WithheldPandas:
    """A finder that fails the import of pandas (for `pyarrow_without_pandas`, installed for one call)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas withheld from pyarrow's first look (runenv.pyarrow_without_pandas)")
        return None


def pyarrow_without_pandas() -> None:
    """Tell pyarrow, before the command's helpers are forked, that this process has no pandas: pyarrow imports
    pandas (with dateutil, pytz...) the first time it builds an array from Python objects, only to ask whether
    those objects are pandas ones, and remembers the answer; no step of the tool hands it any. Done once in
    the command's process, so each process forked from it (the helpers, whose Parquet writes build such
    arrays) skips that import. pyarrow still imports pandas when asked for one (`Table.to_pandas`); a
    process that already has pandas is left as it is."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _WithheldPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # pyarrow's one look for pandas (a Python list), answered "none"
    finally:
        sys.meta_path.remove(finder)


_ENGINES_SHARED = False


def share_sqlite_engines() -> None:
    """One SQLAlchemy engine per SQLite database for Dagster's storages in this process (event log, runs,
    schedules): they make a new engine for every connection, and a run makes a few hundred (each event
    stored, each read), each engine set up again (dialect, pool, first-connect checks) and disposed of. Every
    connection is still a new SQLite connection closed after its use (the engines keep Dagster's NullPool),
    so each close still checkpoints the WAL into the database file `dagster dev` watches. Only an engine
    asked for as Dagster's SQLite storages ask (a URL, NullPool, connect_args) is shared. Only the CLI's
    processes do this."""
    global _ENGINES_SHARED
    if _ENGINES_SHARED:
        return
    import sqlalchemy
    from dagster._core.storage.event_log.sqlite import sqlite_event_log
    from dagster._core.storage.runs.sqlite import sqlite_run_storage
    from dagster._core.storage.schedules.sqlite import sqlite_schedule_storage
    from sqlalchemy.pool import NullPool

    made = sqlalchemy.create_engine
    engines: dict[tuple, sqlalchemy.Engine] = {}

    def create_engine(url, **kwargs):
        if kwargs.get("poolclass") is not NullPool or set(kwargs) - {"poolclass", "connect_args"}:
            return made(url, **kwargs)
        key = (str(url), repr(sorted((kwargs.get("connect_args") or {}).items())))
        if key not in engines:
            engines[key] = made(url, **kwargs)
        return engines[key]

    for module in (sqlite_event_log, sqlite_run_storage, sqlite_schedule_storage):
        if getattr(module, "create_engine", None) is made:  # a Dagster that makes its engines otherwise: as it is
            module.create_engine = create_engine
    _ENGINES_SHARED = True


# CPython's default thresholds (700, 10, 10) run full collections again and again while a run loads ~1M
# long-lived objects (Dagster, the tokenizer's vocabulary, DuckDB's and matplotlib's modules): a profile of a
# one-shard run found a sixth of it in the collector. A CLI process collects far less often; cycles are still
# collected.
GC_THRESHOLDS = (50_000, 20, 20)


def relax_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def exit_without_teardown(code: int):
    """Leave the process as interpreter exit does up to its teardown, then ``os._exit``: kept because it still
    pays (bench/bench_runenv.py: the interpreter's own teardown, freeing every module and object, took half a
    second after the summary). Up to there as CPython: threading's shutdown (which wakes and joins the worker
    threads of any executor still alive, then the other non-daemon threads), the atexit handlers, output
    flushed (a flush that fails turns success into 120, as CPython's exit does). Every file the tool writes is
    closed and renamed into place before this; Dagster's SQLite commits are in its WAL files."""
    threading._shutdown()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a full disk, a closed pipe: what was printed may be cut short
            code = code or 120
    os._exit(code)
