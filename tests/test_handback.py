"""Memory a process freed is handed back to the system where the process would otherwise hold it while it waits
or share it with the children it forks (core/handback.py; docs/benchmarks.md, issue 41, session 51): each helper
after its shard's scan and count (it may then wait through the pack stages), the command after the writer's
staging and before the writer processes fork."""

from __future__ import annotations

from conftest import small_dataset

from pack_assets.core import handback, store
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.settings import Settings
from pack_assets.core.write import copy as write_copy
from pack_assets.core.write import run_write
from pack_assets.runner import shardwork


def test_a_helper_hands_back_what_its_shard_freed_once_the_shards_files_are_written(tmp_path, monkeypatch):
    inp = small_dataset(tmp_path / "in", n_shards=1, per_shard=9)
    work = tmp_path / "work"
    flat = Settings.from_flat({"input_dir": str(inp), "work_dir": str(work),
                               "output_dir": str(tmp_path / "out")}).flat()
    calls: list[bool] = []
    monkeypatch.setattr(shardwork, "hand_back", lambda: calls.append(any(work.rglob("token_lengths.parquet"))))
    assert shardwork.work_shard(flat, "part-000", force=True) == 10
    assert calls == [True]  # once, after the scan and the count


def test_the_writers_fork_after_the_command_hands_back_what_the_staging_freed(tmp_path, monkeypatch):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    shards = list(store.find_shards(inp))
    profile = load_profile("qwen3-vl")
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), profile)
    events: list[str] = []
    monkeypatch.setattr(write_copy, "hand_back", lambda: events.append("hand_back"))
    real = write_copy.write_all
    monkeypatch.setattr(write_copy, "write_all", lambda *a, **k: (events.append("pool"), real(*a, **k))[1])
    monkeypatch.setattr(write_copy, "GROUP_SAMPLES", 1)  # a job per output shard: several, so staged
    run_write(work, inp, out, workers=2)
    assert events == ["hand_back", "pool"]  # (the writer processes' own calls are theirs, not seen here)
    assert len(list(out.glob("*.tar"))) >= 2  # two jobs, the pool's

    events.clear()
    run_write(work, inp, tmp_path / "out1", workers=1)  # no pool: nothing forked, nothing handed back before
    assert events[0] == "pool" and events.count("hand_back") == 2  # (each job's own, in this process)


def test_hand_back_runs_where_the_c_library_has_no_malloc_trim(monkeypatch):
    handback.hand_back()
    monkeypatch.setattr(handback, "_malloc_trim", lambda: None)  # musl, macOS: Arrow's pool only
    handback.hand_back()
