"""The Dagster UI in a real browser: `dagster dev` on 127.0.0.1 and headless Chromium show the five assets
and a materialization's metadata, every image of it rendered. Skips (saying so) where Chromium is absent; CI
installs it."""

from __future__ import annotations

import json
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


def _in_its_profile(profile: Path) -> dict:
    """Chromium's environment with its temporary files in its profile folder, which the test removes: in /tmp,
    a Chromium killed outright leaves an org.chromium.Chromium.* folder behind."""
    profile.mkdir(parents=True)
    return {**os.environ, "TMPDIR": str(profile)}


def _dom(url: str, budget_ms: int = 25000) -> str:
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"chromium-{os.getpid()}-{time.time_ns()}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url]
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120,
                              env=_in_its_profile(profile)).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


# Opens every "[Show Markdown]" of an asset page's metadata in turn and reads the images of its dialog as the
# browser decoded them: a link the UI cannot resolve (a path relative to a file it never sees) loads nothing
# and has naturalWidth 0. Also every image on the page itself.
IMAGES_JS = """(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const until = async (cond, ms) => { const end = Date.now() + ms;
    while (Date.now() < end) { const v = cond(); if (v) return v; await sleep(100); } return cond(); };
  const links = () => [...document.querySelectorAll('a')].filter(a => a.textContent.trim() === '[Show Markdown]');
  await until(() => links().length >= %(markdowns)d, 60000);
  const shown = async imgs => {
    await Promise.all(imgs.map(i => i.complete ? 0 : new Promise(r => { i.onload = i.onerror = r; })));
    return imgs.map(i => ({src: (i.getAttribute('src') || '').slice(0, 60), width: i.naturalWidth})); };
  const out = {page: await shown([...document.images]), markdown: []};
  for (let k = 0; k < links().length; k++) {
    links()[k].click();
    const md = await until(() => document.querySelector('.dagster-dialog .dagster-markdown'), 10000);
    await sleep(300);
    const imgs = md ? [...md.querySelectorAll('img')] : [];
    out.markdown.push(await shown(imgs));
    const close = [...document.querySelectorAll('.dagster-dialog button')].find(b => b.innerText.trim() === 'Close');
    if (close) close.click();
    await until(() => !md || !md.isConnected, 10000);
  }
  return out;
})()"""


def _images(url: str, markdowns: int) -> dict:
    """Every image of an asset page and of each of its markdown metadata dialogs: src and naturalWidth, read
    through the DevTools protocol of headless Chromium (`--dump-dom` cannot say whether an image loaded)."""
    from websockets.sync.client import connect

    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"chromium-{os.getpid()}-{time.time_ns()}"
    proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=_in_its_profile(profile))
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()) and time.time() < deadline:
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30))
        with connect(next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page"), max_size=None) as ws:
            def call(n: int, method: str, **params) -> dict:
                ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while (msg := json.loads(ws.recv(timeout=120))).get("id") != n:
                    pass
                return msg

            call(1, "Page.navigate", url=url)
            reply = call(2, "Runtime.evaluate", expression=IMAGES_JS % {"markdowns": markdowns}, awaitPromise=True,
                         returnByValue=True)
        assert "exceptionDetails" not in reply, reply
        return reply["result"]["result"]["value"]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def ui(dataset, tmp_path):
    from pack_assets.defs.resources import PackSettings
    from pack_assets.runner.orchestrate import instance_for, run_pipeline

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


def test_assets_groups_and_materialization_metadata_with_every_image_rendered_in_the_browser(ui):
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
    # audit_report.md links its plots by relative path; the metadata shows it with each plot inlined, so none
    # is a broken image (issue 37: the report showed 5)
    found = _images(f"{ui}/assets/audit_report", markdowns=2)  # report_markdown, plots
    report, plots = found["markdown"]
    assert len(report) == 5 and len(plots) == 2, found  # lengths, fill, the what-if pair, reasons; lengths, fill
    broken = [i for i in [*found["page"], *report, *plots] if i["width"] == 0]
    assert not broken, broken

