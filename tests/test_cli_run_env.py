"""What a new user meets around `pack-assets run`: which Dagster home, a quiet stderr, a true `--jobs`
help, a time line that adds up, progress that stays readable on many shards (issue 22)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pack_assets
from pack_assets.cli import main
from pack_assets.events import Progress
from pack_assets.runner.progress import MAX_LINES, ShardProgress, StageBars
from pack_assets.runner.runenv import (
    DAGSTER_YAML,
    JOBS_FROM_SHARDS,
    default_jobs,
    ensure_dagster_yaml,
    resolve_dagster_home,
)

REPO = Path(pack_assets.__file__).resolve().parent.parent


def test_dagster_home_order_flag_then_env_then_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"DAGSTER_HOME": "from_env"}  # relative: made absolute, as Dagster requires
    assert resolve_dagster_home("flag", env) == (tmp_path / "flag", "--dagster-home")
    assert resolve_dagster_home(None, env) == (tmp_path / "from_env", "DAGSTER_HOME")
    assert resolve_dagster_home(None, {"DAGSTER_HOME": ""}) == (tmp_path / "dagster_home", "default ./dagster_home")
    assert resolve_dagster_home(None, {}) == (tmp_path / "dagster_home", "default ./dagster_home")


def test_new_home_gets_the_project_dagster_yaml_and_an_existing_one_is_kept(tmp_path):
    # the shipped copy is the repository's dagster_home/dagster.yaml
    assert DAGSTER_YAML.read_text() == (REPO / "dagster_home" / "dagster.yaml").read_text()
    assert "enabled: false" in DAGSTER_YAML.read_text()
    home = tmp_path / "new" / "home"
    assert ensure_dagster_yaml(home) is True
    assert (home / "dagster.yaml").read_text() == DAGSTER_YAML.read_text()
    assert os.listdir(home) == ["dagster.yaml"]  # no temp file left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    assert ensure_dagster_yaml(mine) is False
    assert (mine / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"


def test_help_says_what_the_defaults_do(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default: one per core, {os.cpu_count()} here, at most one per shard that needs it)" in text
    assert "$DAGSTER_HOME if set, else ./dagster_home" in text
    assert default_jobs(JOBS_FROM_SHARDS - 1, cores=4) == 1
    assert default_jobs(JOBS_FROM_SHARDS, cores=4) == 4
    assert default_jobs(1, cores=4) == 1


def test_run_help_has_a_description_required_flags_defaults_and_every_algorithm(capsys):
    from pack_assets.core.binpack import ACCEPTED, ALGORITHMS, check_algorithm

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert out.startswith("usage: pack-assets run (--input DIR --max-len N | --recipe FILE) [options]\n\nScan ")
    assert "required: --input and --max-len, or --recipe: --input DIR" in text
    for shown in ("(default: work)", "(default: packed)", "(default: qwen3-vl)", "(default: 0)",
                  "(default: 1000;", "(default: all)", "(default: copy)"):
        assert shown in text, shown
    # the planner's own list: every algorithm `assign` takes is named, and every name shown is taken
    assert f"packing algorithm: {', '.join(ACCEPTED)} (default: bfd" in text
    assert len(ACCEPTED) == len(ALGORITHMS) and all(check_algorithm(a.replace("_N", "_8")) is None for a in ACCEPTED)


def test_one_default_for_packs_per_output_shard_in_demo_run_and_the_resource(tmp_path, monkeypatch):
    from pack_assets import cli
    from pack_assets.core.plan import PlanConfig
    from pack_assets.defs.resources import PackSettings

    monkeypatch.chdir(tmp_path)
    (tmp_path / cli.DEMO_INPUT).mkdir(parents=True)
    (tmp_path / cli.DEMO_INPUT / "part-0.tar").touch()  # the demo data exists: none is generated
    built = []
    monkeypatch.setattr(cli, "_run", lambda args, **extra: built.append(cli._settings(args, **extra)) or 0)
    for argv in (["demo"], ["run", "--input", "in", "--max-len", "4096"]):
        assert cli.main(argv) == 0
    default = PlanConfig().max_packs_per_shard
    assert [s.plan.max_packs_per_shard for s in built] == [default, default]
    assert PackSettings().max_packs_per_shard == default
    assert cli.main(["run", "--input", "in", "--max-len", "4096", "--max-packs-per-shard", "7"]) == 0
    assert built[-1].plan.max_packs_per_shard == 7


def _parts_add_up(total: float, parts: dict) -> None:
    # dagster-load: Dagster's import and instance after the helpers were forked (they scan meanwhile)
    assert {"start-up", "dagster-load", "manifest+token_lengths", "pack_plan", "packed_shards", "audit_report",
            "other"} == set(parts)
    assert abs(sum(parts.values()) - total) <= 0.01 * len(parts)  # each figure is rounded to 0.01 s
    assert all(v >= 0 for v in parts.values())


def test_flag_beats_env_and_the_time_line_adds_up(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "env_home"))
    assert main(["run", "--input", str(dataset), "--max-len", "1500", "--work", str(tmp_path / "work"),
                 "--output", str(tmp_path / "out"), "--dagster-home", str(tmp_path / "flag_home")]) == 0
    out = capsys.readouterr().out
    assert f"dagster    {tmp_path / 'flag_home'} (from --dagster-home)" in out
    assert (tmp_path / "flag_home" / "dagster.yaml").exists() and not (tmp_path / "env_home").exists()
    total, parts = re.search(r"^time\s+([\d.]+) s \((.*)\)$", out, re.M).groups()
    _parts_add_up(float(total), {k: float(v) for k, v in re.findall(r"(\S+) ([\d.]+) s", parts)})


def test_clean_run_from_dagster_home_env_in_a_fresh_home_is_quiet(dataset, tmp_path):
    """As a user runs it: the command in its own process, DAGSTER_HOME exported, a home that does not exist."""
    home = tmp_path / "env_home"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pack_assets.cli", "run", "--input", str(dataset), "--max-len", "1500",
                           "--work", "work", "--output", "out", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["dagster_home"], s["dagster_home_from"]) == (str(home), "DAGSTER_HOME")
    assert not (tmp_path / "dagster_home").exists()
    assert (home / "dagster.yaml").read_text() == DAGSTER_YAML.read_text() and (home / "history").is_dir()
    # stderr is not a terminal: no progress, nothing but what the user needs, the new home
    assert proc.stderr.splitlines() == [f"new Dagster home {home}: wrote dagster.yaml (telemetry off, concurrency "
                                        "pools)"], proc.stderr
    assert s["jobs"] == min(os.cpu_count(), 2)  # shard workers: one per core, at most one per shard
    _parts_add_up(s["seconds"], s["stage_seconds"])
    assert s["stage_seconds"]["start-up"] > 0  # the command's imports, counted from process start
    # the helpers' own span, from their start: what the shard stage took, not hidden in another stage's figure
    assert 0 < s["helpers_scan_count_seconds"] < s["seconds"]


def _on_a_terminal(cmd: list[str], cwd: Path, env: dict) -> tuple[int, str]:
    """Run `cmd` with stderr on a pseudo-terminal of 100 columns (stdout a pipe); its exit code and stderr."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end closed with the process
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    return proc.wait(timeout=300), err.decode(errors="replace")


@pytest.fixture(scope="module")
def run_on_a_terminal(tmp_path_factory) -> tuple[int, str, str]:
    """One `pack-assets run` as a user starts it (``python -m pack_assets.cli``: runpy runs the module as
    ``__main__``, as ``-m`` does), stderr on a terminal; its exit code, stderr, and whether its own process had
    imported pandas when it exited (an atexit handler: the command's exit runs them, then ``os._exit``).
    Read-only, for the two tests below: one run where each started its own."""
    from conftest import small_dataset

    tmp_path = tmp_path_factory.mktemp("terminal_run")
    dataset, flag = small_dataset(tmp_path / "in"), tmp_path / "pandas_imported"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = ["pack_assets.cli", "run", "--input", str(dataset), "--max-len", "1500", "--work", "work", "--output",
            "out", "--dagster-home", "home"]
    code = ("import atexit, runpy, sys; "
            f"atexit.register(lambda: open({str(flag)!r}, 'w').write(str('pandas' in sys.modules))); "
            f"sys.argv = {argv!r}; runpy.run_module('pack_assets.cli', run_name='__main__', alter_sys=True)")
    rc, err = _on_a_terminal([sys.executable, "-c", code], tmp_path, env)
    return rc, err, flag.read_text() if flag.exists() else "no atexit record"


def test_progress_of_the_whole_run_on_a_terminal(run_on_a_terminal):
    """On a terminal: a start-up line, the shards' bar, then a bar per pack stage with its count."""
    code, err, _ = run_on_a_terminal
    assert code == 0, err[-3000:]
    shown = [s.strip() for s in re.split(r"[\r\n]+", err) if s.strip()]
    assert shown[1].startswith("start-up: 2 shard(s), 2 to scan and count"), shown
    last = {stage: [s for s in shown if s.startswith(f"{stage}:")][-1]
            for stage in ("shards", "plan", "write", "audit")}
    assert "2/2" in last["shards"] and "samples/s" in last["shards"]
    assert re.match(r"plan: 1/1 step \|█+\| \S+, \d+ packs$", last["plan"]), last
    assert re.match(r"write: (\d+)/\1 output shards \|█+\| \S+, [1-9]\d* packs written$", last["write"]), last
    assert re.match(r"audit: (\d+)/\1 output shards \|█+\| \S+, [1-9]\d* members re-hashed$", last["audit"]), last
    order = [next(i for i, s in enumerate(shown) if s.startswith(f"{k}:")) for k in ("start-up", "shards", "plan",
                                                                                        "write", "audit")]
    assert order == sorted(order)


def test_the_command_process_itself_never_imports_pandas(run_on_a_terminal):
    """pyarrow imports pandas (~0.35 s, a tenth of a one-shard run) the first time it builds an array from
    Python values or hands one to NumPy: the command's own process does neither (its helpers may), up to its
    exit."""
    code, err, pandas_imported = run_on_a_terminal
    assert code == 0, err[-3000:]
    assert pandas_imported == "False", err[-2000:]


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_lines_for_a_caller_s_log_are_bounded_and_nothing_off_a_terminal():
    lines: list[str] = []
    with ShardProgress(10_000, log=lines.append, stream=_Stream(tty=True)) as p:
        assert p.bar is None
        for i in range(10_000):
            p.update(f"part-{i:05d}", 100)
    assert len(lines) == MAX_LINES
    assert lines[-1].startswith("[10000/10000] shards scanned and counted (100%), 1000000 samples")
    assert all("samples/s" in ln and "ETA" in ln for ln in lines)
    few: list[str] = []
    with ShardProgress(3, log=few.append) as p:
        for i in range(3):
            p.update(f"part-{i}", 5)
    assert few == [f"[{i + 1}/3] scanned and counted part-{i}" for i in range(3)]
    quiet = _Stream(tty=False)  # the command's own progress, stderr not a terminal: nothing
    with ShardProgress(3, stream=quiet) as p:
        for i in range(3):
            p.update(f"part-{i}", 5)
    bars = StageBars(quiet)
    bars(Progress("write", 1, 2, "output shards", 7, "packs written"))
    bars.line("start-up")
    bars.close()
    assert quiet.getvalue() == ""


def test_a_failing_progress_listener_is_dropped_and_logged_once_while_the_run_goes_on(caplog):
    from pack_assets import events

    seen = []

    def broken(event):
        raise OSError("the terminal went away")

    with events.listening(seen.append), events.listening(broken):
        for i in range(3):
            events.emit(Progress("scan", i, 3, "shards"))  # the stage that emits goes on
    assert [e.done for e in seen] == [0, 1, 2]
    failed = [r for r in caplog.records if r.name == "pack_assets.events"]
    assert len(failed) == 1 and "the terminal went away" in caplog.text
    events.emit(Progress("scan", 3, 3, "shards"))  # both scopes closed: nobody listens, nothing raises
    assert len(seen) == 3


def test_progress_bar_only_on_a_terminal():
    tty = _Stream(tty=True)
    with ShardProgress(50, stream=tty) as p:
        assert p.bar is not None
        for i in range(50):
            p.update(f"part-{i}", 10)
    text = tty.getvalue()
    assert "\r" in text and "50/50" in text and "500 samples" in text and "samples/s" in text
    logged = []
    with ShardProgress(50, log=logged.append, stream=_Stream(tty=True)) as p:  # a caller's log: plain lines
        assert p.bar is None
        for i in range(50):
            p.update(f"part-{i}", 10)
    assert len(logged) == MAX_LINES


def test_the_cli_event_log_commits_without_an_fsync_each_in_wal_mode_only(tmp_path):
    # a fresh interpreter: the listener is process-wide, as it is in a `pack-assets run`
    code = f"""
import sqlalchemy as sa
from sqlalchemy.pool import NullPool
from pack_assets.runner.runenv import relax_event_log_sync
relax_event_log_sync(); relax_event_log_sync()  # once is enough; twice is harmless
def sync(name, wal):
    engine = sa.create_engine("sqlite:///{tmp_path}/" + name, poolclass=NullPool)
    if wal:
        with engine.connect() as c:
            c.execute(sa.text("PRAGMA journal_mode=WAL"))
    with engine.connect() as c:  # a new connection, as Dagster makes one per event
        return c.execute(sa.text("PRAGMA synchronous")).scalar()
print(sync("wal.db", True), sync("journal.db", False))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "2"]  # NORMAL in WAL mode; a rollback-journal database keeps FULL


def test_the_cli_event_log_is_created_in_wal_mode(tmp_path):
    # Dagster makes each run's database in rollback-journal mode, then switches it to WAL (~40 fsyncs)
    home = tmp_path / "dh"
    home.mkdir()
    code = f"""
import os, sqlalchemy as sa
from sqlalchemy.pool import NullPool
os.environ["DAGSTER_HOME"] = "{home}"
from pack_assets.runner.runenv import relax_event_log_sync
relax_event_log_sync()
def event(path):
    engine = sa.create_engine("sqlite:///" + path, poolclass=NullPool)
    with engine.connect() as c:  # a new connection per event, as Dagster makes them
        c.execute(sa.text("CREATE TABLE IF NOT EXISTS e (x)"))
        c.execute(sa.text("INSERT INTO e VALUES (1)"))
        c.commit()
        mode = c.execute(sa.text("PRAGMA journal_mode")).scalar()
    engine.dispose()
    return mode, os.path.exists(path + "-wal")
print(*event("{home}/run.db"), *event("{home}/run.db"), *event("{tmp_path}/elsewhere.db"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # under DAGSTER_HOME: WAL from the start, checkpointed at each last close (what `dagster dev` watches for);
    # any other new database keeps SQLite's default
    assert out.stdout.split() == ["wal", "False", "wal", "False", "delete", "False"]


def test_the_cli_reads_dagsters_migration_scripts_once_and_stamps_new_run_databases_at_head(tmp_path):
    # a fresh interpreter, as a `pack-assets run` process: each run's new event database is stamped with the
    # schema revision from the one directory object this process keeps (runenv.cache_alembic_scripts)
    home = tmp_path / "dh"
    code = f"""
import glob, sqlite3
from pathlib import Path
import dagster as dg
from alembic import util
from alembic.script import ScriptDirectory
loads = []
real = ScriptDirectory._load_revisions
def counted(self):
    loads.append(self.dir)
    yield from real(self)
ScriptDirectory._load_revisions = counted
from pack_assets.runner.orchestrate import instance_for
instance = instance_for(Path("{home}"))
@dg.asset
def a():
    return 1
for _ in range(3):
    assert dg.materialize([a], instance=instance).success
read = len(loads)
head = ScriptDirectory(util.coerce_resource_to_filename("dagster:_core/storage/alembic")).get_current_head()
stamps = {{sqlite3.connect(p).execute("SELECT version_num FROM alembic_version").fetchone()[0]
          for p in glob.glob("{home}/history/runs/*.db") if not p.endswith("index.db")}}
print(read, len(set(loads)), len(glob.glob("{home}/history/runs/*.db")), stamps == {{head}})
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    loads, dirs, run_dbs, at_head = out.stdout.split()
    assert loads == dirs == "1" and int(run_dbs) >= 3 and at_head == "True"


def test_a_full_standard_output_is_one_line_and_exit_120():
    """`pack-assets ... > /dev/full`: the result cannot be written; one line on stderr, exit 120 (CPython's code
    for a failed final flush), no traceback. Both ways it can fail: while printing, and at the exit's flush (a
    reader that went away before the buffered output was flushed)."""
    with open("/dev/full", "w") as full:
        big = subprocess.run([sys.executable, "-m", "pack_assets.cli", "profiles"], stdout=full, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
    assert big.returncode == 120 and big.stderr.strip().splitlines() == [
        "error: could not write the result to standard output: [Errno 28] No space left on device"]
    small = subprocess.Popen([sys.executable, "-c",
                              "import sys; from pack_assets.runner.runenv import exit_without_teardown\n"
                              "sys.stdin.readline(); sys.stdout.write('short'); exit_without_teardown(0)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})  # buffered output
    small.stdout.close()  # the reader is gone before the child flushes
    _, err = small.communicate("go\n", timeout=60)
    assert small.returncode == 120 and "Traceback" not in err


def test_the_exit_joins_a_pool_still_alive_and_its_work_finishes(tmp_path):
    """A thread pool left alive at exit (a stage's executor): its queued work completes and the process ends,
    instead of hanging or being cut off by ``os._exit``."""
    done = tmp_path / "done"
    code = ("import time; from concurrent.futures import ThreadPoolExecutor\n"
            "from pack_assets.runner.runenv import exit_without_teardown\n"
            "pool = ThreadPoolExecutor(2)\n"
            f"pool.submit(lambda: (time.sleep(0.3), open({str(done)!r}, 'w').write('ok')))\n"
            "exit_without_teardown(3)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 3, proc.stderr
    assert done.read_text() == "ok"


def test_pyarrow_writes_python_values_without_importing_pandas_and_still_converts_to_it(tmp_path):
    # a fresh interpreter, as the command's: the helpers forked from it write Parquet from Python values
    code = f"""
import sys
import pyarrow as pa, pyarrow.parquet as pq
from pack_assets.runner.runenv import pyarrow_without_pandas
pyarrow_without_pandas()
pq.write_table(pa.table({{"s": pa.array(["a", "b"]), "n": pa.array([1, None])}}), "{tmp_path}/t.parquet")
print("pandas" in sys.modules, any(type(f).__name__ == "_WithheldPandas" for f in sys.meta_path))
print(pq.read_table("{tmp_path}/t.parquet").to_pandas()["s"].tolist())  # asked for: pandas is imported
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["False False", "['a', 'b']"]
    # without it pyarrow imports pandas at the first array built from Python values (else this test proves nothing)
    plain = "import sys, pyarrow as pa; pa.array(['a']); print('pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def test_the_cli_dagster_storages_share_an_engine_per_database_and_still_close_each_connection(tmp_path):
    # a fresh interpreter, as the command's: a run stores its events through a handful of engines, not one per
    # event, and no connection stays open (each close checkpoints the WAL into the .db `dagster dev` watches)
    home = tmp_path / "dh"
    home.mkdir()
    code = f"""
import os, sqlalchemy
os.environ["DAGSTER_HOME"] = "{home}"
import dagster as dg
from pack_assets.runner.runenv import prepare_dagster_process
engines = []
init = sqlalchemy.engine.Engine.__init__
def counted(self, *a, **k):
    engines.append(1)
    init(self, *a, **k)
sqlalchemy.engine.Engine.__init__ = counted
prepare_dagster_process()
instance = dg.DagsterInstance.get()
@dg.asset
def a():
    return 1
for _ in range(2):
    assert dg.materialize([a], instance=instance).success
print(len(engines), len(instance.get_runs()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    engines, runs = map(int, out.stdout.split())
    assert runs == 2 and engines <= 6  # runs, schedules, index and one per run's events (Dagster's own: ~100)
    dbs = sorted(p.name for p in (home / "history").rglob("*.db*"))
    assert dbs and not [n for n in dbs if n.endswith("-wal")], dbs
