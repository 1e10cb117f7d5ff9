"""The packed output loads as it is with wids (random access) and with Megatron-Energon, whose own
`energon prepare` must produce the same index we write (skipped where megatron-energon is not installed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs
from test_packed_shards_and_audit import run_all

needs_energon = needs(importlib.util.find_spec("megatron") is None
                      or importlib.util.find_spec("megatron.energon") is None,
                      reason="megatron-energon not installed (extra `energon`); .ci/run installs it")


@pytest.fixture
def out(dataset, tmp_path):
    run_all(dataset, tmp_path / "work", tmp_path / "out")
    return tmp_path / "out"


def test_wids_reads_every_pack_by_index(out):
    wids = pytest.importorskip("wids")
    index = json.loads((out / "wids-index.json").read_text())
    # wids copies each tar into its cache folder (by default /tmp/_wids_cache, kept after the run): the test's own
    ds = wids.ShardListDataset(str(out / "wids-index.json"), transformations=[], cache_dir=str(out.parent / "wids"))
    assert len(ds) == sum(s["nsamples"] for s in index["shardlist"])
    keys = set()
    for i in range(len(ds)):
        sample = ds[i]
        doc = json.loads(sample[".json"].read() if hasattr(sample[".json"], "read") else sample[".json"])
        assert doc["_meta"]["pack_id"] == sample["__key__"]
        keys.add(sample["__key__"])
    assert len(keys) == len(ds)


def _rows(db: Path, table: str) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return sorted(c.execute(f"SELECT * FROM {table}").fetchall())


@needs_energon
def test_energon_prepare_would_write_exactly_our_metadata(out, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shards = sorted(p.name for p in out.glob("*.tar"))
    for name in shards:
        shutil.copy(out / name, theirs / name)
    energon = Path(sys.executable).parent / "energon"
    if len(shards) == 1:
        parts = "train:" + ",".join(shards)
    else:
        parts = f"train:{shards[0][:-10]}{{{shards[0][-10:-4]}..{shards[-1][-10:-4]}}}.tar"
    subprocess.run([str(energon), "prepare", str(theirs), "--non-interactive", "--split-parts", parts,
                    "--sample-type", "CrudeWebdataset", "--no-progress"], check=True, capture_output=True, timeout=300)
    ours_meta, their_meta = out / ".nv-meta", theirs / ".nv-meta"
    assert json.loads((ours_meta / ".info.json").read_text())["shard_counts"] == \
        json.loads((their_meta / ".info.json").read_text())["shard_counts"]
    for table in ("samples", "sample_parts"):
        assert _rows(ours_meta / "index.sqlite", table) == _rows(their_meta / "index.sqlite", table)
    for name in shards:
        assert (out / f"{name}.idx").read_bytes() == (theirs / f"{name}.idx").read_bytes()


@needs_energon
def test_energon_loads_the_output_without_prepare(out):
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        WorkerConfig,
        basic_sample_keys,
        get_loader,
        get_train_dataset,
        stateless,
    )

    @stateless
    def cook(raw: dict) -> dict:
        doc = raw["json"] if isinstance(raw["json"], dict) else json.loads(raw["json"])
        media = sorted(k for k in raw if k.endswith((".jpg", ".png", ".webp", ".mp4")))
        return {**basic_sample_keys(raw), "pack_id": doc["_meta"]["pack_id"], "media": media}

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

        def batch(self, samples):
            return samples

    ds = get_train_dataset(out, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
                           task_encoder=Encoder(), repeat=False)
    seen = [b[0]["pack_id"] for b in get_loader(ds)]
    plan = [json.loads(line)["pack_id"] for line in (out.parent / "work" / "pack_plan.jsonl").read_text().splitlines()]
    assert sorted(seen) == sorted(plan)
