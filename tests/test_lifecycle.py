"""Day two: add, change and remove source shards, then run again (plain, incremental, through Dagster)."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from conftest import small_dataset, write_tar

from pack_assets.core import store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, PlanInfo, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import run_write
from pack_assets.defs.assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
from pack_assets.defs.partitions import source_shards
from pack_assets.defs.resources import PackSettings

PROFILE = load_profile("qwen3-vl")
MAX_LEN = 1500


def overlong_shard(path: Path, n: int = 3) -> Path:
    """Text samples far over MAX_LEN tokens, plus one that fits."""
    members = [(f"long{i}.json", json.dumps({"messages": [{"role": "user", "content": "word " * (2500 + 100 * i)},
                                                          {"role": "assistant", "content": "ok"}]})) for i in range(n)]
    members.append(("short.json", json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "hello"}]})))
    return write_tar(path, members)


def scan(inp: Path, work: Path, shards: list[str]) -> None:
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)


def dropped_ids(work: Path) -> set[str]:
    with store.connect(work, read_only=True) as con:
        return {r[0] for r in con.execute("SELECT sample_id FROM dropped").fetchall()}


def test_a_plain_rerun_after_adding_a_shard_with_overlong_samples_replaces_dropped(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=2)
    work, out = tmp_path / "work", tmp_path / "out"
    scan(inp, work, ["part-000", "part-001"])
    first = run_plan(work, ["part-000", "part-001"], PlanConfig(max_len=MAX_LEN), PROFILE)
    assert first.violations == []
    before = dropped_ids(work)
    overlong_shard(inp / "part-002.tar")
    scan(inp, work, ["part-002"])
    s = run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE)
    assert s.violations == []
    after = dropped_ids(work)
    assert after - before == {"part-002/long0", "part-002/long1", "part-002/long2"}
    assert len(after) == s.dropped
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).verdict == "PASS"


def test_the_pack_plan_asset_reruns_after_a_shard_with_overlong_samples_is_added(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=2)
    settings = PackSettings(input_dir=str(inp), work_dir=str(tmp_path / "work"), output_dir=str(tmp_path / "out"),
                            max_len=MAX_LEN)
    instance = dg.DagsterInstance.ephemeral()

    def shard_runs(keys):
        instance.add_dynamic_partitions(source_shards.name, keys)
        for key in keys:
            assert dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                                  resources={"settings": settings}).success

    shard_runs(["part-000", "part-001"])
    assert dg.materialize([pack_plan], instance=instance, resources={"settings": settings}).success
    overlong_shard(inp / "part-002.tar")
    shard_runs(["part-002"])
    res = dg.materialize([pack_plan], instance=instance, resources={"settings": settings}, raise_on_error=False)
    assert [(c.check_name, c.passed) for c in res.get_asset_check_evaluations()] == [("every_sample_once", True)]
    assert {"part-002/long0", "part-002/long1", "part-002/long2"} <= dropped_ids(tmp_path / "work")


def test_the_audit_is_incomplete_while_a_registered_shard_waits(tmp_path, capsys):
    from pack_assets.cli import main

    inp = small_dataset(tmp_path / "in", n_shards=3)
    work, out = tmp_path / "work", tmp_path / "out"
    scan(inp, work, ["part-000", "part-001"])
    run_manifest(inp, work, "part-002")  # scanned, never counted
    s = run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE,
                          allow_missing=True)
    assert s.shards_waiting == ["part-002"]
    run_write(work, inp, out, workers=1)
    result = run_audit(work, out)
    assert result.ok and result.verdict == "INCOMPLETE" and result.waiting == ["part-002"]
    report = result.report.read_text()
    assert "**Verdict: INCOMPLETE**" in report and "part-002" in report.split("##")[0]
    assert main(["verify", "--work", str(work), "--output", str(out)]) == 3
    assert capsys.readouterr().out.startswith("INCOMPLETE")
    # once it is counted and planned, the verdict is PASS
    scan(inp, work, ["part-002"])
    run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE)
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).verdict == "PASS"
    assert main(["verify", "--work", str(work), "--output", str(out)]) == 0


def test_the_nothing_lost_check_fails_and_run_exits_non_zero_while_a_shard_waits(tmp_path, monkeypatch, capsys):
    from pack_assets.cli import main
    from pack_assets.runner import orchestrate, shardwork

    inp = small_dataset(tmp_path / "in", n_shards=2)
    real = orchestrate._batch_run

    def batch_run(keys, flat, on_shard=None, instance=None, tags=None):  # part-001's counting never finishes:
        rest = [k for k in keys if k != "part-001"]  # scanned only
        done = real(rest, flat, on_shard, instance, tags) if rest else {}
        if "part-001" in keys:
            dg.materialize([manifest], partition_key="part-001", instance=dg.DagsterInstance.get(),
                           resources={"settings": PackSettings(**flat)})
        return done

    monkeypatch.setattr(orchestrate, "_batch_run", batch_run)
    monkeypatch.setattr(shardwork, "start", lambda work, settings, helpers, force: work)  # no helper scans
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    args = ["run", "--input", str(inp), "--max-len", str(MAX_LEN), "--work", str(tmp_path / "work"),
            "--output", str(tmp_path / "out"), "--dagster-home", str(tmp_path / "dh"), "--jobs", "1"]
    assert main(args) == 3
    text = capsys.readouterr().out
    assert "audit     INCOMPLETE: 1 shard(s) in the input not counted: part-001" in text
    assert main([*args, "--json"]) == 3
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "INCOMPLETE" and summary["shards_waiting"] == ["part-001"]
    instance = dg.DagsterInstance.get()
    (check,) = [e for e in instance.get_records_for_run(instance.get_runs(limit=1)[0].run_id).records
                if e.event_log_entry.dagster_event and e.event_log_entry.dagster_event.event_type_value
                == "ASSET_CHECK_EVALUATION"
                and "nothing_lost" in str(e.event_log_entry.dagster_event.event_specific_data)]
    data = check.event_log_entry.dagster_event.event_specific_data
    assert not data.passed and data.metadata["shards_waiting"].value == ["part-001"]


def _settings(inp: Path, tmp: Path, **kw) -> PackSettings:
    return PackSettings(input_dir=str(inp), work_dir=str(tmp / "work"), output_dir=str(tmp / "out"), max_len=MAX_LEN,
                        max_packs_per_shard=3, **kw)


def _tick(instance, settings, cursor=None):
    from pack_assets.defs.sensors import new_shard_sensor

    ctx = dg.build_sensor_context(instance=instance, resources={"settings": settings}, cursor=cursor)
    result = new_shard_sensor(ctx)
    return result, (result.cursor if isinstance(result, dg.SensorResult) else ctx.cursor)


def _apply(instance, result) -> None:
    for req in result.dynamic_partitions_requests:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(source_shards.name, list(req.partition_keys))
        else:
            for key in req.partition_keys:
                instance.delete_dynamic_partition(source_shards.name, key)


def _shard_run(instance, settings, key):
    assert dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                          resources={"settings": settings}).success


def rewrite_shard(path: Path, text: str) -> None:
    """The same keys, other content (and size): a shard replaced in place."""
    write_tar(path, [("x0.json", json.dumps({"messages": [{"role": "user", "content": text},
                                                          {"role": "assistant", "content": "ok"}]}))])


def _first_tick_packed(instance, settings) -> str:
    """The sensor's first tick, its shard runs and the pack run, as the daemon would launch them; the cursor."""
    first, cursor = _tick(instance, settings)
    _apply(instance, first)
    for r in first.run_requests:
        _shard_run(instance, settings, r.partition_key)
    assert dg.materialize([pack_plan, packed_shards, audit_report], instance=instance,
                          resources={"settings": settings}).success
    return cursor


def test_the_sensor_requests_a_shard_changed_in_place_and_the_plan_follows(dataset, tmp_path, monkeypatch):
    from pack_assets.defs import sensors

    instance, settings = dg.DagsterInstance.ephemeral(), _settings(dataset, tmp_path)
    cursor = _first_tick_packed(instance, settings)
    skip, cursor = _tick(instance, settings, cursor)
    assert isinstance(skip, dg.SkipReason)
    assert isinstance(sensors.replan_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)

    rewrite_shard(dataset / "part-001.tar", "changed " * 30)
    st = (dataset / "part-001.tar").stat()
    result, cursor = _tick(instance, settings, cursor)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [
        ("part-001", f"part-001:{st.st_size}:{st.st_mtime_ns}")]
    assert result.dynamic_partitions_requests == []
    # the same listing again: nothing requested twice, and no manifest read at all
    monkeypatch.setattr(sensors.store, "recorded_stats", lambda *a: pytest.fail("read manifests on a quiet tick"))
    again, cursor = _tick(instance, settings, cursor)
    assert isinstance(again, dg.SkipReason)
    monkeypatch.undo()

    _shard_run(instance, settings, "part-001")
    assert isinstance(sensors.replan_sensor(dg.build_sensor_context(instance=instance)), dg.RunRequest)
    res = dg.materialize([pack_plan, packed_shards, audit_report], instance=instance, resources={"settings": settings})
    assert res.success
    with store.connect(tmp_path / "work", read_only=True) as con:
        ids = {r[0] for r in con.execute("SELECT sample_id FROM pack_members").fetchall()}
    assert "part-001/x0" in ids and not any(i.startswith("part-001/s1_") for i in ids)
    assert isinstance(_tick(instance, settings, cursor)[0], dg.SkipReason)


def test_the_sensor_requests_changed_shards_in_bounded_batches(tmp_path, monkeypatch):
    from pack_assets.defs import sensors

    inp = small_dataset(tmp_path / "in", n_shards=3, per_shard=3)
    instance, settings = dg.DagsterInstance.ephemeral(), _settings(inp, tmp_path)
    first, cursor = _tick(instance, settings)
    _apply(instance, first)
    for r in first.run_requests:
        _shard_run(instance, settings, r.partition_key)
    for s in ("part-000", "part-001", "part-002"):
        rewrite_shard(inp / f"{s}.tar", f"{s} changed")
    monkeypatch.setattr(sensors, "BATCH", 2)
    got = []
    for _ in range(3):
        result, cursor = _tick(instance, settings, cursor)
        got.append([r.partition_key for r in getattr(result, "run_requests", [])])
    assert got == [["part-000", "part-001"], ["part-002"], []]


def test_the_sensor_removes_a_deleted_shard_and_the_replan_drops_its_packs(dataset, tmp_path):
    from pack_assets.defs.sensors import replan_sensor

    instance, settings = dg.DagsterInstance.ephemeral(), _settings(dataset, tmp_path)
    cursor = _first_tick_packed(instance, settings)
    assert isinstance(replan_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)
    (dataset / "part-000.tar").unlink()
    result, cursor = _tick(instance, settings, cursor)
    assert result.run_requests == []
    (req,) = result.dynamic_partitions_requests
    assert isinstance(req, dg.DeleteDynamicPartitionsRequest) and list(req.partition_keys) == ["part-000"]
    _apply(instance, result)
    assert isinstance(replan_sensor(dg.build_sensor_context(instance=instance)), dg.RunRequest)
    res = dg.materialize([pack_plan, packed_shards, audit_report], instance=instance, resources={"settings": settings})
    assert res.success
    assert_no_trace_of(tmp_path / "work", tmp_path / "out", "part-000")
    assert isinstance(replan_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)


def assert_no_trace_of(work: Path, out: Path, shard: str) -> None:
    """No pack, drop or output member refers to the shard; the remaining counts add up."""
    with store.connect(work, read_only=True) as con:
        refs = con.execute("SELECT count(*) FROM pack_members WHERE starts_with(sample_id, ?)",
                           [shard + "/"]).fetchone()[0]
        refs += con.execute("SELECT count(*) FROM dropped WHERE starts_with(sample_id, ?)", [shard + "/"]).fetchone()[0]
        ok = con.execute("SELECT count(*) FROM samples WHERE status = 'ok'").fetchone()[0]
        planned = con.execute("SELECT (SELECT count(*) FROM pack_members) + (SELECT count(*) FROM dropped)"
                              ).fetchone()[0]
    assert refs == 0 and ok == planned
    from pack_assets.reader import iter_packs

    packs = list(iter_packs(sorted(out.glob("*.tar"))))
    assert packs and not any(sid.startswith(shard + "/") for p in packs for sid in p["_meta"]["sample_ids"])
    result = run_audit(work, out)
    assert result.verdict == "PASS", result.violations
    assert shard not in result.stats["per_shard"]


def text_shard(path: Path, n: int = 4) -> Path:
    return write_tar(path, [(f"t{i}.json", json.dumps({"messages": [
        {"role": "user", "content": "text " * (40 + 50 * i)}, {"role": "assistant", "content": "ok"}]}))
                            for i in range(n)])


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_a_removed_shard_leaves_the_plan_and_outputs_on_the_next_run(tmp_path, monkeypatch, capsys, incremental):
    from pack_assets.cli import main

    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=9)
    text_shard(inp / "part-002.tar")  # text only: the image packs hold none of its samples
    work, out = tmp_path / "work", tmp_path / "out"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    (tmp_path / "config.json").write_text(json.dumps({"max_packs_per_shard": 1}))
    args = ["run", "--input", str(inp), "--max-len", str(MAX_LEN), "--work", str(work), "--output", str(out),
            "--dagster-home", str(tmp_path / "dh"), "--jobs", "1", "--json", "--config", str(tmp_path / "config.json"),
            *(["--incremental"] * incremental)]
    assert main(args) == 0
    before = json.loads(capsys.readouterr().out)
    with store.connect(work, read_only=True) as con:
        rows = con.execute("SELECT output_shard, sample_ids FROM pack_plan").fetchall()
    touched = {shard for shard, ids in rows if any(i.startswith("part-002/") for i in ids)}
    stamps = {n: (out / n).stat().st_mtime_ns for n in {shard for shard, _ in rows} - touched}
    assert touched and stamps
    (inp / "part-002.tar").unlink()
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["verdict"] == "PASS" and s["shards"] == 2 and s["shards_removed"] == ["part-002"]
    assert s["samples"] == before["samples"] - 4 and s["packed"] + s["dropped"] + s["rejected"] == s["samples"]
    assert_no_trace_of(work, out, "part-002")
    with store.connect(work, read_only=True) as con:
        stats = PlanInfo.load(con).stats
    if incremental:
        assert stats["planning"].startswith("incremental: kept")
        assert "removed 4 gone and 0 recounted" in stats["planning"]
        assert stats["samples_gone"] == 4 and stats["new_packs"] == 0
        # output shards that held none of its samples are kept as they were
        assert all((out / n).stat().st_mtime_ns == t for n, t in stamps.items())
    else:
        assert stats["planning"] == "full plan"
        # a full run equals a from-scratch run on the current input
        fresh = tmp_path / "fresh"
        scan(inp, fresh / "work", ["part-000", "part-001"])
        run_plan(fresh / "work", ["part-000", "part-001"], PlanConfig(max_len=MAX_LEN, max_packs_per_shard=1),
                          PROFILE)
        assert (fresh / "work" / "pack_plan.jsonl").read_bytes() == (work / "pack_plan.jsonl").read_bytes()


def test_an_incremental_plan_keeps_packs_minus_gone_and_recounted_samples(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=3, per_shard=9)
    work, out = tmp_path / "work", tmp_path / "out"
    shards = ["part-000", "part-001", "part-002"]
    scan(inp, work, shards)
    cfg = PlanConfig(max_len=MAX_LEN, max_packs_per_shard=2, incremental=True)
    first = run_plan(work, shards, cfg, PROFILE)
    run_write(work, inp, out, workers=1)
    with store.connect(work, read_only=True) as con:
        old = {r[0]: list(r[1]) for r in con.execute("SELECT pack_id, sample_ids FROM pack_plan").fetchall()}
    # part-002 replaced: one sample gone, one longer, one new
    small_dataset(tmp_path / "in2", n_shards=3, per_shard=9)
    with __import__("tarfile").open(tmp_path / "in2" / "part-002.tar") as tf:
        members = [(ti.name, tf.extractfile(ti).read()) for ti in tf.getmembers()]
    members = [(n, d) for n, d in members if not n.startswith("s2_000.")]
    members = [(n, json.dumps({"messages": [{"role": "user", "content": "longer " * 300},
                                            {"role": "assistant", "content": "ok"}]}) if n == "s2_003.json" else d)
               for n, d in members]
    members.append(("s2_new.json", json.dumps({"messages": [{"role": "user", "content": "new"},
                                                            {"role": "assistant", "content": "one"}]})))
    write_tar(inp / "part-002.tar", members)
    scan(inp, work, ["part-002"])
    s = run_plan(work, shards, cfg, PROFILE)
    assert s.violations == [] and s.samples_gone == 1 and s.samples_recounted == 1
    assert s.planning.startswith(f"incremental: kept {s.kept_packs} packs, removed 1 gone and 1 recounted")
    with store.connect(work, read_only=True) as con:
        new = {r[0]: list(r[1]) for r in con.execute("SELECT pack_id, sample_ids FROM pack_plan").fetchall()}
    assert len(new) == len(set(new))  # no id reused
    for pid, ids in old.items():  # a kept pack keeps its id and the rest of its samples, in order
        rest = [i for i in ids if i not in ("part-002/s2_000", "part-002/s2_003")]
        assert new.get(pid, []) == rest
    placed = [pid for pid, ids in new.items() if {"part-002/s2_003", "part-002/s2_new"} & set(ids)]
    assert placed and all(pid not in old for pid in placed)
    assert s.fingerprint != first.fingerprint
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).verdict == "PASS"
