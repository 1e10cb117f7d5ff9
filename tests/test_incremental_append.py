"""The append-only incremental plan (core/incremental.py): what it writes equals what the incremental plan that
reads the whole stored plan writes, and a run killed in its window leaves a plan the next run finishes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import small_dataset

from pack_assets.core import incremental, store
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest

PROFILE = load_profile("qwen3-vl")
CONFIG = PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True)
SHARDS = ["part-000", "part-001", "part-002"]


def counted(inp: Path, work: Path, shards: list[str]) -> None:
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)


def plan_state(work: Path) -> tuple[bytes, dict, str]:
    """pack_plan.jsonl's bytes, the plan tables' rows and the fingerprint."""
    with store.connect(work, read_only=True) as con:
        tables = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                  for t in ("pack_plan", "pack_members", "dropped", "split_pieces")}
        fingerprint = store.read_plan_info(con)["fingerprint"]
    return (work / "pack_plan.jsonl").read_bytes(), tables, fingerprint


@pytest.fixture(scope="module")
def two_planned(tmp_path_factory):
    """Two shards planned (the plan file recorded), the third counted but not yet planned."""
    root = tmp_path_factory.mktemp("append")
    inp, work = small_dataset(root / "in", n_shards=3), root / "work"
    counted(inp, work, SHARDS)
    assert run_plan(work, SHARDS[:2], CONFIG, PROFILE).violations == []
    return work


def test_an_append_writes_what_the_incremental_plan_reading_every_pack_writes(two_planned, tmp_path, monkeypatch):
    appended, whole = tmp_path / "appended", tmp_path / "whole"
    shutil.copytree(two_planned, appended)
    shutil.copytree(two_planned, whole)
    calls = []
    real = incremental.append_plan_file
    monkeypatch.setattr(incremental, "append_plan_file", lambda *a: calls.append(1) or real(*a))
    for _ in range(2):  # a new shard, then a rerun with nothing new: both appended
        s = run_plan(appended, SHARDS, CONFIG, PROFILE)
        assert s.violations == []
    assert len(calls) == 2
    monkeypatch.setattr(incremental, "appendable", lambda *a: None)  # the plan that reads the stored plan
    for _ in range(2):
        w = run_plan(whole, SHARDS, CONFIG, PROFILE)
    assert plan_state(appended) == plan_state(whole)
    assert (s.stats | {"seconds": 0}) == (w.stats | {"seconds": 0})


def test_a_changed_plan_file_is_written_whole_not_appended_to(two_planned, tmp_path, monkeypatch):
    work, reference = tmp_path / "work", tmp_path / "reference"
    shutil.copytree(two_planned, work)
    shutil.copytree(two_planned, reference)
    with open(work / "pack_plan.jsonl", "r+b") as f:  # the same size, another byte
        f.seek(3)
        f.write(b"X")
    monkeypatch.setattr(incremental, "append_plan_file", None)  # called, it would fail the run
    run_plan(work, SHARDS, CONFIG, PROFILE)
    monkeypatch.undo()
    run_plan(reference, SHARDS, CONFIG, PROFILE)
    assert plan_state(work) == plan_state(reference)


KILL = """import sys
sys.path.insert(0, sys.argv[3])
from fault_harness import arm
arm(sys.argv[2], 1)
from pathlib import Path
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.plan import PlanConfig, run_plan
SHARDS = sys.argv[4].split(",")
run_plan(Path(sys.argv[1]), SHARDS, PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True),
         load_profile("qwen3-vl"))
"""


# killed as the new plan file is renamed into place; with the file in place and the tables not yet; with the
# tables committed and the plan file not yet recorded
@pytest.mark.parametrize("point", ["pack_assets.core.safety:replace", "pack_assets.core.store:save_plan",
                                   "pack_assets.core.incremental:record_plan_file"])
def test_a_kill_during_an_append_leaves_a_plan_the_next_run_finishes(two_planned, tmp_path, point):
    work, reference = tmp_path / "work", tmp_path / "reference"
    shutil.copytree(two_planned, work)
    shutil.copytree(two_planned, reference)
    before = (work / "pack_plan.jsonl").read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL, str(work), point, str(Path(__file__).parent),
                           ",".join(SHARDS)],
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    grew = (work / "pack_plan.jsonl").read_bytes() != before
    assert grew == (point != "pack_assets.core.safety:replace")  # the kill fell where it was meant to
    assert run_plan(work, SHARDS, CONFIG, PROFILE).violations == []
    # the plan the killed run committed stands: the rerun extends it, as a second rerun extends a clean one
    for _ in range(2 if point.endswith("record_plan_file") else 1):
        run_plan(reference, SHARDS, CONFIG, PROFILE)
    assert plan_state(work) == plan_state(reference)
    assert not list(work.glob(".pack_plan.jsonl.tmp-*")) or point == "pack_assets.core.safety:replace"


def test_the_check_after_an_append_finds_a_new_pack_repeating_or_losing_a_sample(two_planned, tmp_path):
    from pack_assets.core.plancheck import check_plan

    work = tmp_path / "work"
    shutil.copytree(two_planned, work)
    with store.connect(work) as con:
        first = incremental.appendable(con, store.read_plan_info(con), work / "pack_plan.jsonl").next_number
    assert run_plan(work, SHARDS, CONFIG, PROFILE).violations == []
    with store.connect(work) as con:
        assert check_plan(con, CONFIG, since=first) == []
        new = f"p{first:08d}"
        old = con.execute("SELECT sample_id FROM pack_members WHERE pack_id < ? LIMIT 1", [new]).fetchall()[0][0]
        lost = con.execute("SELECT sample_id FROM pack_members WHERE pack_id = ? AND position = 0", [new]).fetchall()
        con.execute("UPDATE pack_members SET sample_id = ? WHERE pack_id = ? AND position = 0", [old, new])
        found = {v["check"] for v in check_plan(con, CONFIG, since=first)}
    assert {"duplicate_sample", "lost_sample"} <= found, (found, lost)


def _retype(work: Path, sample_id: str, media_type: str) -> None:
    """The sample's media type changed in its shard's manifest and counts, its length left as it is (as a
    rescan that found another kind of media of the same token count would leave it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    changed = 0
    for path in [p for p in work.rglob("*.parquet") if p.name in ("samples.parquet", "token_lengths.parquet")]:
        table = store.read_parquet(path)
        ids = table.column("sample_id").to_pylist()
        if sample_id not in ids:
            continue
        types = table.column("media_type").to_pylist()
        types[ids.index(sample_id)] = media_type
        at = table.schema.get_field_index("media_type")
        pq.write_table(table.set_column(at, table.schema.field(at), pa.array(types, pa.string())), path)
        changed += 1
    assert changed == 2  # the manifest's row and the count's


def test_a_kept_sample_whose_media_type_changed_is_planned_as_the_plan_reading_every_pack_plans_it(
        two_planned, tmp_path, monkeypatch):
    """The plan check looks at each pack's media types (mixed_media): a stored sample whose media type changed
    while its length did not is seen by the check of the whole plan, so an append (which checks the new packs)
    must not be taken then. Both paths give the same plan, the same violations and the same record."""
    with store.connect(two_planned, read_only=True) as con:
        sample, mt = con.execute(
            "SELECT pm.sample_id, p.media_type FROM pack_members pm JOIN pack_plan p USING (pack_id) "
            "WHERE len(p.sample_ids) > 1 ORDER BY pm.pack_id, pm.position LIMIT 1").fetchall()[0]
    appended, whole = tmp_path / "appended", tmp_path / "whole"
    for work in (appended, whole):
        shutil.copytree(two_planned, work)
        _retype(work, sample, "video" if mt != "video" else "image")
    a = run_plan(appended, SHARDS, CONFIG, PROFILE)
    monkeypatch.setattr(incremental, "appendable", lambda *a, **k: None)  # the plan that reads the stored plan
    w = run_plan(whole, SHARDS, CONFIG, PROFILE)
    assert {v["check"] for v in w.violations} == {"mixed_media"}  # the change is one the check sees
    assert a.violations == w.violations
    assert plan_state(appended) == plan_state(whole)
    assert (a.stats | {"seconds": 0}) == (w.stats | {"seconds": 0})
    for work in (appended, whole):  # neither records its plan file as checked: the next run writes it whole
        with store.connect(work, read_only=True) as con:
            assert incremental.PLAN_FILE not in store.read_plan_info(con)


def _retyped_copy(two_planned: Path, work: Path) -> dict:
    """A copy of the two planned shards with a packed sample's media type changed in its manifest (and counts);
    the manifest stamps the stored plan recorded."""
    with store.connect(two_planned, read_only=True) as con:
        sample, mt = con.execute(
            "SELECT pm.sample_id, p.media_type FROM pack_members pm JOIN pack_plan p USING (pack_id) "
            "ORDER BY pm.pack_id, pm.position LIMIT 1").fetchall()[0]
        recorded = store.read_plan_info(con)[incremental.MANIFEST_STAMPS]
    shutil.copytree(two_planned, work)
    _retype(work, sample, "video" if mt != "video" else "image")
    return recorded


def test_an_append_looks_up_media_types_only_in_the_shards_whose_manifest_changed(two_planned, tmp_path):
    """The stored plan records each planned shard's manifest stamp; a shard whose stamp is the recorded one is
    the file the stored plan's check read, so its members' media types are not read again (the cost of the
    rerun after adding one shard). Shown by a retyped member whose shard is (falsely) given its recorded stamp:
    not looked up, the append is taken; given its real stamp, it is refused."""
    work = tmp_path / "work"
    recorded = _retyped_copy(two_planned, work)
    assert sorted(recorded) == SHARDS[:2] and all(recorded.values())
    with store.connect(work) as con:
        store.build_catalog(con, work, SHARDS, PROFILE.name)
        info, stamps = store.read_plan_info(con), incremental.manifest_stamps(con)
        assert stamps.keys() == set(SHARDS) and stamps != {**recorded, SHARDS[2]: stamps[SHARDS[2]]}
        path = work / "pack_plan.jsonl"
        assert incremental.appendable(con, info, path, True, stamps) is None
        assert incremental.appendable(con, info, path, True, {**stamps, **recorded}) is not None
