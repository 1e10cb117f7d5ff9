"""The Dagster graph as `pack_assets.definitions:defs` exposes it, against tests/snapshots/asset_graph.json.

It guards refactors of the Dagster layer: assets, checks, jobs and sensors must come out the same.
An intended change is recorded with `pytest tests/test_graph_snapshot.py --update-snapshot`."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "snapshots" / "asset_graph.json"
INTERVAL_ENV = "PACK_ASSETS_SENSOR_INTERVAL"


def _partitions(pdef: dg.PartitionsDefinition | None) -> dict | None:
    if pdef is None:
        return None
    return {"type": type(pdef).__name__, "name": getattr(pdef, "name", None)}


def _backfill(policy: dg.BackfillPolicy | None) -> dict | None:
    if policy is None:
        return None
    return {"type": policy.policy_type.value, "max_partitions_per_run": policy.max_partitions_per_run}


def _assets(graph) -> dict:
    out = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        out[key.to_user_string()] = {
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "partitions": _partitions(node.partitions_def),
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "code_version": node.code_version,
            "pools": sorted(node.pools or ()),
            "backfill_policy": _backfill(node.backfill_policy),
        }
    return out


def _check_name(key: dg.AssetCheckKey) -> str:
    return f"{key.asset_key.to_user_string()}:{key.name}"


def _entity_name(key) -> str:
    return _check_name(key) if isinstance(key, dg.AssetCheckKey) else key.to_user_string()


def _checks(graph) -> dict:
    out = {}
    for key in sorted(graph.asset_check_keys, key=_check_name):
        spec = graph.get_check_spec(key)
        out[_check_name(key)] = {
            "asset": key.asset_key.to_user_string(),
            "blocking": spec.blocking,
            "partitions": _partitions(spec.partitions_def),
            # what runs in the same step: a check_spec shares its asset's step, an @asset_check has its own
            "same_step_as": sorted(_entity_name(k) for k in graph.get_execution_set_asset_and_check_keys(key)
                                   if k != key),
        }
    return out


def _jobs(repo: dg.RepositoryDefinition) -> dict:
    out = {}
    for job in sorted(repo.get_all_jobs(), key=lambda j: j.name):
        if job.name in repo.get_implicit_asset_job_names():
            continue
        layer = job.asset_layer
        out[job.name] = {
            "assets": sorted(k.to_user_string() for k in layer.selected_asset_keys),
            "checks": sorted(_check_name(k) for k in layer.asset_graph.asset_check_keys),
            "ops": [n.name for n in job.nodes_in_topological_order],
            "executor": job.executor_def.name,
            "partitions": _partitions(job.partitions_def),
        }
    return out


def _sensors(repo: dg.RepositoryDefinition) -> dict:
    return {s.name: {"job": s.job_name, "minimum_interval_seconds": s.minimum_interval_seconds,
                     "default_status": s.default_status.value, "resources": sorted(s.required_resource_keys)}
            for s in sorted(repo.sensor_defs, key=lambda s: s.name)}


def snapshot() -> dict:
    from pack_assets.definitions import defs

    assert isinstance(defs, dg.Definitions)
    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    return {"assets": _assets(graph), "checks": _checks(graph), "jobs": _jobs(repo), "sensors": _sensors(repo),
            "schedules": sorted(s.name for s in repo.schedule_defs),
            "resources": sorted(repo.get_top_level_resources())}


def _fresh_snapshot(tmp_path: Path) -> dict:
    """Built in a fresh interpreter with the sensor interval unset: the interval is read at import time,
    and another test may have imported the definitions under a different environment. Without
    DAGSTER_HOME: loading the definitions registers the input's shards in that instance (defs/partitions.py)."""
    env = {k: v for k, v in os.environ.items() if k not in (INTERVAL_ENV, "DAGSTER_HOME")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = tmp_path / "snapshot.json"
    proc = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _dump(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_asset_graph_matches_the_snapshot(tmp_path, request):
    fresh = _dump(_fresh_snapshot(tmp_path))
    if request.config.getoption("--update-snapshot"):
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(fresh)
        return
    assert SNAPSHOT.exists(), f"{SNAPSHOT} missing: run pytest {Path(__file__).name} --update-snapshot"
    stored = SNAPSHOT.read_text()
    if fresh != stored:
        diff = "".join(difflib.unified_diff(stored.splitlines(True), fresh.splitlines(True),
                                            "stored " + SNAPSHOT.name, "fresh"))
        raise AssertionError("the Dagster graph changed; if intended, rerun with --update-snapshot\n" + diff)


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(_dump(snapshot()))
