"""The Dagster UI in a real browser: `dagster dev` on 127.0.0.1 and headless Chromium show the five assets
and a materialization's metadata. Skips (saying so) where Chromium is absent; CI installs it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import needs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = needs(CHROMIUM is None, reason="Chromium not installed (Debian package `chromium`); .ci/run installs it")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dom(url: str, budget_ms: int = 25000) -> str:
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"chromium-{os.getpid()}-{time.time_ns()}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url]
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def ui(dataset, tmp_path):
    from pack_assets.defs.resources import PackSettings
    from pack_assets.orchestrate import instance_for, run_pipeline

    home = tmp_path / "dh"
    old = os.environ.get("DAGSTER_HOME")
    instance = instance_for(home)
    settings = PackSettings(input_dir=str(dataset), work_dir=str(tmp_path / "work"), output_dir=str(tmp_path / "out"),
                            max_len=1500)
    run_pipeline(settings.to_settings(), instance, log=lambda m: None, jobs=1)
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PACK_ASSETS_INPUT": str(dataset),
           "PACK_ASSETS_WORK": str(tmp_path / "work"), "PACK_ASSETS_OUTPUT": str(tmp_path / "out"),
           "PACK_ASSETS_MAX_LEN": "1500"}
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.Popen([str(dagster), "dev", "-m", "pack_assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("dagster dev did not answer on 127.0.0.1 within 120 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old


def test_assets_groups_and_materialization_metadata_in_the_browser(ui):
    # the global lineage collapses groups; audit_report's upstream lineage draws every asset as a graph node
    graph = _dom(f"{ui}/assets/audit_report?view=lineage&lineageScope=upstream&lineageDepth=5")
    nodes = set(re.findall(r'class="AssetNode_assetName[^"]*"[^>]*>([^<]+)<', graph))
    assert nodes == {"manifest", "token_lengths", "pack_plan", "packed_shards", "audit_report"}, nodes
    catalog = _dom(f"{ui}/assets")
    for name in ("manifest", "token_lengths", "pack_plan", "packed_shards", "audit_report"):
        assert name in catalog, name
    lineage = _dom(f"{ui}/asset-groups")
    assert ">ingest<" in lineage and ">pack<" in lineage
    page = _dom(f"{ui}/assets/audit_report")
    assert "samples_read" in page and "media_members_checked" in page
