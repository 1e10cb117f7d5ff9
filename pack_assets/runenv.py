"""What a `pack-assets run` needs around Dagster, kept free of the dagster import so `--help` stays fast:
which Dagster home and its dagster.yaml, how its SQLite event log commits, how many shard processes by
default, when the process started."""

from __future__ import annotations

import os
import time
from pathlib import Path

DEFAULT_HOME = Path("dagster_home")
# The project's instance settings (telemetry off, concurrency pools), shipped in the package so a home
# made from any folder gets them; the repository's dagster_home/dagster.yaml is the same file.
DAGSTER_YAML = Path(__file__).with_name("dagster.yaml")

# Shard runs go to worker processes (one per core) only when at least this many shards need a run: workers
# pay ~3 s of imports each and leave the parent cold for plan and audit (~3 s more), which fewer shards do not
# win back. bench/bench_jobs.py: --jobs 1 won every whole run up to 16 shards; 24 extrapolates the saving's
# slope (docs/benchmarks.md).
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
    from .core.safety import mkstemp

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


_RELAXED = False  # the listener is process-wide: installed once


def relax_event_log_sync() -> None:
    """Commit this process's Dagster SQLite writes (run and event log, one commit per event) without an fsync
    each: `synchronous=NORMAL` on every SQLAlchemy SQLite connection in WAL mode (Dagster's own). SQLite's
    documented trade-off: a WAL database stays consistent; a power cut may lose the last events, never the
    run's outputs, which the stages fsync themselves. On a busy disk each fsync took 10-80 ms, ~100 events
    per `pack-assets run`. Only the CLI's processes do this; `dagster dev` keeps Dagster's settings."""
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
                if cur.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    cur.execute("PRAGMA synchronous=NORMAL")
            finally:
                cur.close()

    event.listen(Engine, "connect", on_connect)
    _RELAXED = True



class ShardPrefetch:
    """Scan and count the shards that need it in a second process while this one imports Dagster and sets up
    its run (~3 s of one core, while the machine's other core would sit idle).

    The shard runs still happen, one materialization per shard partition as before: their steps take each
    shard's lock, so they wait for a shard the prefetch is on and then find it current (the stages keep a
    manifest and counts made from the same tar and profile), or do it themselves first. The prefetch goes
    from the last shard to the first, the runs from the first, so they meet in the middle instead of racing
    for the same shard. It only saves time: a failure in it is ignored and the step does the work and reports.
    Spawned, not forked (a fork would inherit this process's DuckDB and Arrow threads); a daemon, so it ends
    with this process.
    """

    def __init__(self, settings, shards: list[str]) -> None:
        import multiprocessing

        self.shards = list(shards)  # not current when it started: each gets its shard run whatever it finds
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_prefetch_shards, args=(settings.flat(), self.shards[::-1]), name="pack-assets-prefetch",
            daemon=True)
        self.proc.start()

    def stop(self) -> None:
        """After the shard runs: every shard is done, so what is left of the prefetch is a skip at most."""
        if self.proc.pid is None:
            return
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def _prefetch_shards(flat: dict, shards: list[str]) -> None:
    import contextlib

    from .core.scan import run_manifest
    from .core.settings import Settings
    from .core.tokens import run_token_lengths

    settings = Settings.from_flat(flat)
    profile = settings.model_profile()
    for shard in shards:
        with contextlib.suppress(Exception):  # the shard's own run repeats the work and reports the error
            run_manifest(settings.input_root, settings.work, shard, settings.scan)
            run_token_lengths(settings.work, shard, profile)


def idle_core() -> bool:
    """Whether the machine has a core to spare (1-minute load average below cores - 1): on a busy machine a
    second process only takes CPU from the first (bench/results/small_i21b_prefetch.jsonl: start-up 13-20 s
    against 4-6 s at a load average of 8 on 2 cores)."""
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1) - 1
    except OSError:
        return False


def shards_to_prefetch(settings, jobs: int, force: bool, idle: bool | None = None) -> list[str]:
    """The shards a run will scan or count, when `--jobs 0` (the default) keeps them in this process and a
    core is idle (``idle``: None asks idle_core()); else none (`--jobs 1` means one process: no prefetch)."""
    from .core import store
    from .core.scan import manifest_is_current
    from .core.tokens import token_lengths_are_current

    if jobs != 0 or force or not settings.input_root.is_dir() or not (idle_core() if idle is None else idle):
        return []
    shards = list(store.find_shards(settings.input_root, settings.recursive))
    profile = settings.model_profile()
    todo = [k for k in shards if manifest_is_current(settings.input_root, settings.work, k) is None
            or not token_lengths_are_current(settings.work, k, profile)]
    return todo if default_jobs(len(todo)) == 1 else []
