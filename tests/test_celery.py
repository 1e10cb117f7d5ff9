"""Scale-out on dagster-celery: `deploy/celery/run.sh` starts Redis (Debian's redis-server), two Celery
workers and the Dagster daemon; the sensors find the shards, and every shard run and the pack run are
executed by the workers. Skips (saying so) where redis-server or dagster-celery is absent; CI installs both."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import needs, small_dataset

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    needs(shutil.which("redis-server") is None,
          reason="redis-server not installed (Debian package `redis-server`); .ci/run installs it"),
    needs(importlib.util.find_spec("dagster_celery") is None,
          reason="dagster-celery not installed (extra `celery`); .ci/run installs it"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _as_a_service() -> None:
    """The signal state a service manager starts run.sh with: none blocked, none ignored. A test runner started
    in the background (``cmd &``, nohup) hands its children SIGINT, SIGQUIT and SIGHUP ignored, and a shell
    cannot trap a signal it was started ignoring."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def test_shard_runs_execute_on_two_celery_workers(tmp_path, monkeypatch):
    import dagster as dg

    from pack_assets.core import store

    inp = small_dataset(tmp_path / "in", n_shards=4, per_shard=9)
    home, port = tmp_path / "home", _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PACK_ASSETS_INPUT": str(inp),
           "PACK_ASSETS_WORK": str(tmp_path / "work"), "PACK_ASSETS_OUTPUT": str(tmp_path / "out"),
           "PACK_ASSETS_MAX_LEN": "1500", "PACK_ASSETS_REDIS_PORT": str(port), "PACK_ASSETS_CELERY_WORKERS": "2",
           "PACK_ASSETS_SENSOR_INTERVAL": "3", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", str(ROOT / "deploy/celery/run.sh")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_a_service)
    logs = home / "celery-logs"
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # DagsterInstance.get() below reads the same instance
    try:
        deadline, audit, instance = time.time() + 300, None, None
        with contextlib.ExitStack() as opened:
            while time.time() < deadline and proc.poll() is None:
                time.sleep(2)
                if not (home / "dagster.yaml").exists() or not (home / "storage").exists():
                    continue
                # one instance for the whole wait (each query reads the storage afresh): a new one per poll
                # loads its storages and config again
                instance = instance or opened.enter_context(dg.DagsterInstance.get())
                audit = instance.get_latest_materialization_event(dg.AssetKey("audit_report"))
                runs = instance.get_runs()
                # the audit's materialization comes before its check and the run's end: wait for every run to end
                if audit is not None and all(r.is_finished for r in runs):
                    break
        assert proc.poll() is None, f"run.sh exited early:\n{proc.stdout.read() if proc.stdout else ''}"
        assert audit is not None, "no audit_report within 300 s; logs: " + "\n".join(
            f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    shard_runs = [r for r in runs if r.job_name == "shard_job"]
    assert sorted(r.tags["dagster/partition"] for r in shard_runs) == ["part-000", "part-001", "part-002", "part-003"]
    assert all(r.is_success for r in runs) and any(r.job_name == "pack_job" for r in runs)
    # every run went through the broker, and each worker executed some of them
    task_ids = {r.tags["dagster-celery/task_id"] for r in runs}
    done = {w.name: set(re.findall(r"Task execute_job\[([0-9a-f-]+)\] succeeded", w.read_text()))
            for w in sorted(logs.glob("worker*.log"))}
    assert len(done) == 2 and all(done.values()), done
    assert set().union(*done.values()) == task_ids and sum(map(len, done.values())) == len(runs)

    md = audit.asset_materialization.metadata
    assert md["violations"].value == 0
    with store.connect(tmp_path / "work", read_only=True) as con:
        status = dict(con.execute("select status, count(*) from samples group by status").fetchall())
        assert status == {"ok": 4 * 9, "rejected": 4}
        assert con.execute("select count(*) from rejected").fetchone()[0] == 4
    # SIGTERM stopped everything run.sh started, the broker included
    assert proc.returncode == 0 and not _port_open(port), proc.stdout.read() if proc.stdout else ""
