"""`dg` (dagster-dg-cli) finds the project through [tool.dg] in pyproject.toml and loads its definitions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import needs

ROOT = Path(__file__).resolve().parents[1]
_beside = Path(sys.executable).parent / "dg"
DG = str(_beside) if _beside.exists() else shutil.which("dg")
needs_dg = needs(DG is None, "dg is not installed (pip install 'dagster-dg-cli>=1.13,<1.14')")


def _dg(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # a DAGSTER_HOME of its own with telemetry off: no first-run notice, nothing written to the user's home
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([DG, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _json_from(stdout: str) -> dict:
    """The JSON document in stdout, ignoring any notice printed before it."""
    start = stdout.find("{")
    assert start >= 0, stdout[-2000:]
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


@needs_dg
def test_dg_list_defs_lists_the_contract_assets_checks_jobs_and_sensors(tmp_path):
    proc = _dg(tmp_path, "list", "defs", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = _json_from(proc.stdout)
    assert {a["asset_key"] for a in listed["assets"]} == {
        "manifest", "token_lengths", "pack_plan", "packed_shards", "audit_report"}
    assert {s["name"] for s in listed["sensors"]} == {"new_shard_sensor", "replan_sensor"}
    assert {j["name"] for j in listed["jobs"]} >= {"shard_job", "pack_job", "lookup_job"}
    assert {c["key"] for c in listed["asset_checks"]} == {
        "manifest:every_sample_accounted", "pack_plan:every_sample_once", "audit_report:nothing_lost"}


@needs_dg
def test_dg_check_defs_passes(tmp_path):
    proc = _dg(tmp_path, "check", "defs")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "All definitions loaded successfully" in proc.stdout + proc.stderr


def test_definitions_load_from_an_installed_copy_without_pyproject(tmp_path):
    """definitions.py lists its definitions itself: a package installed without its source tree (no
    pyproject.toml, so no [tool.dg]) still loads, which `dg.load_from_defs_folder` would not."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "pack_assets", site / "pack_assets", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import pack_assets.definitions as d; print(d.__file__); "
            "print(len(d.defs.resolve_asset_graph().get_all_asset_keys()))")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(site / "pack_assets" / "definitions.py"), "5"]
