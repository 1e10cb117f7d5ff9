"""Kill the pipeline (SIGKILL, in a subprocess) at 24 points across scan, count, plan and write; rerun;
the final DuckDB tables and output bytes equal those of a clean run."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from pack_assets.core import store

HARNESS = Path(__file__).with_name("fault_harness.py")
KILL_POINTS = [
    ("pack_assets.core.scan:iter_entries", 2),
    ("pack_assets.core.scan:classify", 7),
    ("pack_assets.core.scan:probe_image", 3),
    ("pack_assets.core.store:BatchedParquet.flush", 2),
    ("pack_assets.core.store:BatchedParquet.close", 3),
    ("pack_assets.core.store:write_manifest", 2),
    ("pack_assets.core.store:os.replace", 1),
    ("pack_assets.core.store:os.replace", 2),
    ("pack_assets.core.store:pq.write_table", 2),
    ("pack_assets.core.pipeline:run_token_lengths", 2),
    ("pack_assets.core.tokens:TokenCounter.lengths", 1),
    ("pack_assets.core.store:write_token_lengths", 1),
    ("pack_assets.core.store:atomic_write_text", 2),
    ("pack_assets.core.pipeline:make_plan", 1),
    ("pack_assets.core.pipeline:simulate", 1),
    ("pack_assets.core.pipeline:plan_jsonl", 1),
    ("pack_assets.core.pipeline:check_plan", 1),
    ("pack_assets.core.pipeline:shard_jobs", 1),
    ("pack_assets.core.write:_header", 9, 1),
    ("pack_assets.core.write:_header", 25, 1),
    ("pack_assets.core.write:_header", 5, 2),  # a writer process of the pool dies
    ("pack_assets.core.write:os.fsync", 1),
    ("pack_assets.core.write:os.replace", 2),
    ("pack_assets.core.write:write_energon_meta", 1),
    ("pack_assets.core.write:write_wids_index", 1),
]


def run(inp: Path, work: Path, out: Path, *fault) -> int:
    return subprocess.run([sys.executable, str(HARNESS), str(inp), str(work), str(out), *map(str, fault)],
                          capture_output=True, timeout=300).returncode


def snapshot(work: Path, out: Path) -> dict:
    with store.connect(work, read_only=True) as con:
        tables = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                  for t in ("samples", "members", "rejected", "token_lengths", "pack_plan", "pack_members", "dropped")}
    files = {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != "index.sqlite"}
    return {"tables": tables, "files": files, "plan": (work / "pack_plan.jsonl").read_bytes()}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    from conftest import small_dataset

    root = tmp_path_factory.mktemp("rel")
    inp = small_dataset(root / "in", n_shards=3, per_shard=10)
    assert run(inp, root / "work", root / "out") == 0
    return inp, snapshot(root / "work", root / "out")


@pytest.mark.parametrize("point", KILL_POINTS, ids=[f"{p[0].split(':')[1]}#{p[1]}" + (f"-w{p[2]}" if len(p) > 2 else "")
                                                   for p in KILL_POINTS])
def test_kill_then_rerun_equals_a_clean_run(clean, tmp_path, point):
    inp, expected = clean
    work, out = tmp_path / "work", tmp_path / "out"
    target, n, *workers = point
    code = run(inp, work, out, target, n, *workers)
    # killed at that point: the process itself, or (pool worker) the run fails on the broken pool
    assert code == -9 if workers != [2] else code not in (0, 3)
    assert run(inp, work, out) == 0
    got = snapshot(work, out)
    assert got["plan"] == expected["plan"]
    assert got["tables"] == expected["tables"]
    assert got["files"] == expected["files"]
    assert not [p for p in out.rglob(".*tmp*")] and not [p for p in work.rglob(".*.tmp-*")]
