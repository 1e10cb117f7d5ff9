"""The append's reads of the catalog (issue 41 item 4, session 55): every ok sample's length without its id, the
new samples looked for in the shards whose manifest or token_lengths file changed since the stored plan's check,
and the check's lost-sample search there; what comes out is what the plan that reads the whole stored plan makes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import small_dataset
from test_incremental_append import CONFIG, PROFILE, SHARDS, _retype, counted, plan_state

from pack_assets.core import incremental, store
from pack_assets.core import plan as plan_mod
from pack_assets.core.binpack import lower_bounds
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.plancheck import check_plan


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Two shards planned, the third counted; one sample of part-000 rejected by its counts when planned (its
    token_lengths file as counted kept aside)."""
    root = tmp_path_factory.mktemp("changed")
    inp, work = small_dataset(root / "in", n_shards=3), root / "work"
    counted(inp, work, SHARDS)
    path = store.token_dir(work, PROFILE.name, SHARDS[0]) / "token_lengths.parquet"
    shutil.copy2(path, root / "counted.parquet")
    table = store.read_parquet(path)
    status = table.column("status").to_pylist()
    at = status.index("ok")
    status[at] = "rejected"
    i = table.schema.get_field_index("status")
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(status, pa.string())), path)
    assert run_plan(work, SHARDS[:2], CONFIG, PROFILE).violations == []
    return work, root / "counted.parquet", table.column("sample_id")[at].as_py()


def _copy(planned, to: Path) -> Path:
    """A copy of the planned work folder, its stored plan's stamps those of the copy's files (as if planned there:
    a copied file's inode and ctime are not the original's)."""
    shutil.copytree(planned[0], to)
    with store.connect(to) as con:
        info = store.read_plan_info(con)
        store.build_catalog(con, to, info["shards"], PROFILE.name)
        con.execute("UPDATE plan_info SET info = ?",
                    [json.dumps({**info, incremental.MANIFEST_STAMPS: incremental.manifest_stamps(con)})])
    return to


def _spied(monkeypatch) -> list:
    """The `incremental.appended_rows` results of the runs that follow; `plan.ok_lengths` refused (an append
    reads no sample id of the stored plan)."""
    seen, real = [], incremental.appended_rows
    monkeypatch.setattr(incremental, "appended_rows", lambda *a: seen.append(real(*a)) or seen[-1])
    monkeypatch.setattr(plan_mod, "ok_lengths", lambda *a, **k: pytest.fail("ok_lengths read on an append"))
    return seen


def test_an_append_after_a_new_shard_looks_for_new_samples_in_it_alone(planned, tmp_path, monkeypatch):
    appended, whole = _copy(planned, tmp_path / "a"), _copy(planned, tmp_path / "w")
    seen, lengths = _spied(monkeypatch), []
    a = run_plan(appended, SHARDS, CONFIG, PROFILE, on_lengths=lengths.append)
    assert a.violations == [] and [g.changed for g in seen] == [[SHARDS[2]]]
    assert all(s.startswith(f"{SHARDS[2]}/") for s in seen[0].new["sample_ids"].tolist())
    monkeypatch.undo()
    monkeypatch.setattr(incremental, "appendable", lambda *a, **k: None)  # the plan that reads the stored plan
    every = []
    w = run_plan(whole, SHARDS, CONFIG, PROFILE, on_lengths=every.append)
    assert plan_state(appended) == plan_state(whole)
    assert (a.stats | {"seconds": 0}) == (w.stats | {"seconds": 0})
    # the what-if sweep gets the lengths and media types the whole plan reads, in the same order
    assert np.array_equal(lengths[0]["lengths"], every[0]["lengths"])
    assert lengths[0]["media_types"].tolist() == every[0]["media_types"].tolist()


def test_a_recount_that_makes_a_sample_ok_is_planned_by_the_append(planned, tmp_path, monkeypatch):
    """The manifest of part-000 is the stored plan's, its counts are not (a recount made a rejected sample ok):
    the shard's token_lengths stamp names it changed, so its new sample is looked for there, and planned."""
    work, counted_file, sample = planned
    appended, whole = _copy(planned, tmp_path / "a"), _copy(planned, tmp_path / "w")
    for w in (appended, whole):
        shutil.copy(counted_file, store.token_dir(w, PROFILE.name, SHARDS[0]) / "token_lengths.parquet")
    seen = _spied(monkeypatch)
    assert run_plan(appended, SHARDS[:2], CONFIG, PROFILE).violations == []
    assert [g.changed for g in seen] == [[SHARDS[0]]] and seen[0].new["sample_ids"].tolist() == [sample]
    monkeypatch.undo()
    monkeypatch.setattr(incremental, "appendable", lambda *a, **k: None)
    assert run_plan(whole, SHARDS[:2], CONFIG, PROFILE).violations == []
    assert plan_state(appended) == plan_state(whole)


def test_new_samples_outside_the_changed_shards_are_looked_for_everywhere(planned, tmp_path):
    """The new samples found must make up every ok sample with the stored ones; where they do not (a shard
    wrongly taken for unchanged), they are looked for in every shard."""
    work = _copy(planned, tmp_path / "w")
    with store.connect(work) as con:
        store.build_catalog(con, work, SHARDS, PROFILE.name)
        stamps = incremental.manifest_stamps(con)
        base = incremental.appendable(con, store.read_plan_info(con), work / "pack_plan.jsonl", True, stamps)
        assert base is not None and base.changed == [SHARDS[2]]
        every = incremental.every_length(con, 4, "256MB")
        right = incremental.appended_rows(con, base, every)
        wrong = incremental.appended_rows(con, dataclasses.replace(base, changed=[SHARDS[0]]), every)
    assert right.changed == [SHARDS[2]] and wrong.changed is None
    assert len(right.new["sample_ids"]) > 0
    for k, v in right.new.items():
        assert v.tolist() == wrong.new[k].tolist(), k


def test_the_appended_check_finds_a_lost_sample_in_the_changed_shards(planned, tmp_path):
    work = _copy(planned, tmp_path / "w")
    with store.connect(work) as con:
        first = incremental.appendable(con, store.read_plan_info(con), work / "pack_plan.jsonl").next_number
    assert run_plan(work, SHARDS, CONFIG, PROFILE).violations == []
    with store.connect(work) as con:
        assert check_plan(con, CONFIG, since=first, changed=[SHARDS[2]]) == []
        con.execute("UPDATE pack_members SET sample_id = 'gone' WHERE pack_id = ? AND position = 0",
                    [f"p{first:08d}"])
        lost = {SHARDS[2]: "lost_sample", None: "lost_sample", SHARDS[0]: None}  # (only the shards named)
        for changed, check in lost.items():
            found = {v["check"] for v in check_plan(con, CONFIG, since=first, changed=changed and [changed])}
            assert (check in found) if check else ("lost_sample" not in found), (changed, found)


def test_the_appended_check_finds_a_new_pack_mixing_media_types(planned, tmp_path):
    """The new packs' members' media types are looked up in the manifests of their own shards alone."""
    work = _copy(planned, tmp_path / "w")
    with store.connect(work) as con:
        first = incremental.appendable(con, store.read_plan_info(con), work / "pack_plan.jsonl").next_number
    assert run_plan(work, SHARDS, CONFIG, PROFILE).violations == []
    with store.connect(work, read_only=True) as con:
        sample, mt = con.execute(
            "SELECT pm.sample_id, p.media_type FROM pack_members pm JOIN pack_plan p USING (pack_id) "
            "WHERE pm.pack_id >= ? AND len(p.sample_ids) > 1 ORDER BY pm.pack_id LIMIT 1",
            [f"p{first:08d}"]).fetchall()[0]
    assert sample.startswith(f"{SHARDS[2]}/")
    _retype(work, sample, "video" if mt != "video" else "image")
    with store.connect(work) as con:
        store.build_catalog(con, work, SHARDS, PROFILE.name)
        found = {v["check"] for v in check_plan(con, CONFIG, since=first, changed=[SHARDS[2]])}
    assert found == {"mixed_media"}


def test_an_append_with_drops_keeps_the_lower_bound_of_the_whole_plan(tmp_path, monkeypatch):
    """Over-long samples dropped by the stored plan and by the append: the lower bound, over every sample not
    dropped, is the whole plan's (counted from the lengths' histogram, the new drops taken out as values)."""
    config = PlanConfig(max_len=300, max_packs_per_shard=2, incremental=True)
    inp, work = small_dataset(tmp_path / "in", n_shards=3), tmp_path / "work"
    counted(inp, work, SHARDS)
    assert run_plan(work, SHARDS[:2], config, PROFILE).violations == []
    whole = _copy((work,), tmp_path / "w")
    _spied(monkeypatch)
    a = run_plan(work, SHARDS, config, PROFILE)
    monkeypatch.undo()
    monkeypatch.setattr(incremental, "appendable", lambda *a, **k: None)
    w = run_plan(whole, SHARDS, config, PROFILE)
    with store.connect(work, read_only=True) as con:
        drops = [r[0] for r in con.execute("SELECT sample_id FROM dropped").fetchall()]
    assert {d.split("/")[0] for d in drops} >= {SHARDS[0], SHARDS[2]}  # stored drops and new ones
    assert plan_state(work) == plan_state(whole)
    assert (a.stats | {"seconds": 0}) == (w.stats | {"seconds": 0})


def test_without_takes_values_out_as_a_multiset():
    from pack_assets.core.binpack import without

    rng = np.random.default_rng(5)
    for _ in range(300):
        values = rng.integers(1, 12, rng.integers(1, 40))
        gone = rng.choice(len(values), rng.integers(0, len(values) + 1), replace=False)
        kept = np.delete(values, gone)
        assert sorted(without(values, values[gone]).tolist()) == sorted(kept.tolist())
        assert lower_bounds(without(values, values[gone]), 20) == lower_bounds(kept, 20)
    with pytest.raises(RuntimeError):
        without(np.array([5, 7]), np.array([5, 5]))
