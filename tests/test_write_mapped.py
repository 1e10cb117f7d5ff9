"""The copy writer's packs written over mapped sources (`core/write/mapped.py`): the same bytes as read and
written, its maps unmapped as the bytes viewed reach their bound, and a source cut short before or while it is
copied a clear error, no SIGBUS (which would kill this test process) and nothing left under a final or
temporary name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import small_dataset

from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import ScanOptions, run_manifest
from pack_assets.core.write import copy as copy_mod
from pack_assets.core.write import mapped, run_write
from pack_assets.core.write import shard as shard_mod

PROFILE = load_profile("qwen3-vl")


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mapped")
    inp, work = small_dataset(root / "in", per_shard=9), root / "work"
    shards = ["part-000", "part-001"]
    for s in shards:
        run_manifest(inp, work, s, ScanOptions(hash_members=True))
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=2048, max_packs_per_shard=2), PROFILE)
    return inp, work


def _bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}


def test_packs_over_mapped_sources_are_the_bytes_read_and_written(planned, tmp_path, monkeypatch):
    inp, work = planned
    writes, threaded = [], []
    real, one_call = mapped.writev_all, copy_mod.in_one_call
    monkeypatch.setattr(mapped, "writev_all", lambda fd, bufs: (writes.append(len(bufs)), real(fd, bufs))[1])
    monkeypatch.setattr(copy_mod, "in_one_call", lambda job: (threaded.append(one_call(job)), threaded[-1])[1])
    run_write(work, inp, tmp_path / "mapped", workers=1)
    assert writes, "no pack went over the maps"
    assert threaded and all(threaded), "a shard of such packs is written in the job's thread"
    n = len(writes)
    unmapped = []
    real_close = mapped.Maps.close
    monkeypatch.setattr(mapped.Maps, "close", lambda self: (unmapped.append(len(self.views)), real_close(self)))
    monkeypatch.setattr(mapped.Maps.__init__, "__defaults__", (256, 1))  # each pack's views: the bound
    run_write(work, inp, tmp_path / "one_map", workers=1)
    assert len(writes) > 2 * n  # before each pack, what is queued written and the maps unmapped
    shards = len(list((tmp_path / "one_map").glob("*.tar")))
    assert len(unmapped) > shards and min(unmapped) > 0  # unmapped within a shard, not only at its end
    monkeypatch.setattr(shard_mod, "mappable", lambda pack: False)
    run_write(work, inp, tmp_path / "read", workers=1)
    written = _bytes(tmp_path / "read")
    assert len(written) >= 2 and _bytes(tmp_path / "mapped") == written == _bytes(tmp_path / "one_map")


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_source_cut_short_is_a_clear_error_and_leaves_no_file(planned, tmp_path, monkeypatch, when):
    """``before``: the source is cut just before it is mapped, shorter than the catalog says (its packs are
    read instead: the read path's error); ``while``: cut after it was mapped, before its views are written
    (EFAULT from the kernel, where a read of the map in this process would be a SIGBUS)."""
    inp, work = planned
    copy = tmp_path / "in"
    copy.mkdir()
    for p in inp.glob("*.tar"):
        shutil.copy2(p, copy / p.name)  # the same size and mtime: the writer's check of its sources passes
    cut = copy / "part-000.tar"

    def shorten():
        with open(cut, "r+b") as f:
            f.truncate(2048)  # the first sample's record and header blocks: its media gone

    if when == "before":
        real_map = mapped._mapped
        monkeypatch.setattr(mapped, "_mapped", lambda path: (path != str(cut) or shorten(), real_map(path))[1])
    else:
        real = mapped.writev_all
        monkeypatch.setattr(mapped, "writev_all", lambda fd, bufs: (shorten(), real(fd, bufs))[1])
    out = tmp_path / "out"
    with pytest.raises(OSError, match="ends early" if when == "before" else "ended early while it was copied"):
        run_write(work, copy, out, workers=1)
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tar") or ".tmp-" in p.name) == []
