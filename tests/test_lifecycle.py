"""Day two: add, change and remove source shards, then run again (plain, incremental, through Dagster)."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from conftest import small_dataset, write_tar

from pack_assets.core import pipeline, store
from pack_assets.core.plan import PlanConfig
from pack_assets.core.profiles import load_profile
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
        pipeline.run_manifest(inp, work, s)
        pipeline.run_token_lengths(work, s, PROFILE)


def dropped_ids(work: Path) -> set[str]:
    with store.connect(work, read_only=True) as con:
        return {r[0] for r in con.execute("SELECT sample_id FROM dropped").fetchall()}


def test_a_plain_rerun_after_adding_a_shard_with_overlong_samples_replaces_dropped(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=2)
    work, out = tmp_path / "work", tmp_path / "out"
    scan(inp, work, ["part-000", "part-001"])
    first = pipeline.run_plan(work, ["part-000", "part-001"], PlanConfig(max_len=MAX_LEN), PROFILE)
    assert first["plan_violations"] == []
    before = dropped_ids(work)
    overlong_shard(inp / "part-002.tar")
    scan(inp, work, ["part-002"])
    s = pipeline.run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE)
    assert s["plan_violations"] == []
    after = dropped_ids(work)
    assert after - before == {"part-002/long0", "part-002/long1", "part-002/long2"}
    assert len(after) == s["dropped"]
    pipeline.run_write(work, inp, out, workers=1)
    assert pipeline.run_audit(work, out)[0].verdict == "PASS"


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
    pipeline.run_manifest(inp, work, "part-002")  # scanned, never counted
    s = pipeline.run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE,
                          allow_missing=True)
    assert s["shards_waiting"] == ["part-002"]
    pipeline.run_write(work, inp, out, workers=1)
    result, report = pipeline.run_audit(work, out)
    assert result.ok and result.verdict == "INCOMPLETE" and result.waiting == ["part-002"]
    assert "**Verdict: INCOMPLETE**" in report["markdown"] and "part-002" in report["markdown"].split("##")[0]
    assert main(["verify", "--work", str(work), "--output", str(out)]) == 3
    assert capsys.readouterr().out.startswith("INCOMPLETE") 
    # once it is counted and planned, the verdict is PASS
    scan(inp, work, ["part-002"])
    pipeline.run_plan(work, ["part-000", "part-001", "part-002"], PlanConfig(max_len=MAX_LEN), PROFILE)
    pipeline.run_write(work, inp, out, workers=1)
    assert pipeline.run_audit(work, out)[0].verdict == "PASS"
    assert main(["verify", "--work", str(work), "--output", str(out)]) == 0


def test_the_nothing_lost_check_fails_and_run_exits_non_zero_while_a_shard_waits(tmp_path, monkeypatch, capsys):
    from pack_assets import orchestrate
    from pack_assets.cli import main

    inp = small_dataset(tmp_path / "in", n_shards=2)
    real = orchestrate._shard_run

    def shard_run(key, fields):  # part-001's counting never finishes: scanned only
        if key != "part-001":
            return real(key, fields)
        dg.materialize([manifest], partition_key=key, instance=dg.DagsterInstance.get(),
                       resources={"settings": PackSettings(**fields)})

    monkeypatch.setattr(orchestrate, "_shard_run", shard_run)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    args = ["run", "--input", str(inp), "--max-len", str(MAX_LEN), "--work", str(tmp_path / "work"),
            "--output", str(tmp_path / "out"), "--dagster-home", str(tmp_path / "dh"), "--jobs", "1"]
    assert main(args) == 3
    text = capsys.readouterr().out
    assert "audit     INCOMPLETE: 1 shard(s) waiting, not counted yet: part-001" in text
    assert main([*args, "--json"]) == 3
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "INCOMPLETE" and summary["shards_waiting"] == ["part-001"]
    instance = dg.DagsterInstance.get()
    (check,) = [e for e in instance.get_records_for_run(instance.get_runs(limit=1)[0].run_id).records
                if e.event_log_entry.dagster_event and e.event_log_entry.dagster_event.event_type_value
                == "ASSET_CHECK_EVALUATION" and "nothing_lost" in str(e.event_log_entry.dagster_event.event_specific_data)]
    data = check.event_log_entry.dagster_event.event_specific_data
    assert not data.passed and data.metadata["shards_waiting"].value == ["part-001"]
