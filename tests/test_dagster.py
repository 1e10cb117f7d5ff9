"""The Dagster layer: definitions load, the graph is as DESIGN.md fixes it, a full materialization in
process, the sensor, and `dagster asset materialize` from the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from conftest import needs, small_dataset, write_tar

from pack_assets.core import store
from pack_assets.definitions import defs
from pack_assets.defs.assets import SHARD_WORKERS_TAG, audit_report, manifest, pack_plan, packed_shards, token_lengths
from pack_assets.defs.partitions import source_shards
from pack_assets.defs.resources import PackSettings
from pack_assets.defs.sensors import new_shard_sensor

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_load_with_the_contract_asset_keys():
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"manifest", "token_lengths", "pack_plan", "packed_shards", "audit_report"}
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("manifest")).partitions_def == source_shards
    assert graph.get(dg.AssetKey("token_lengths")).partitions_def == source_shards
    assert graph.get(dg.AssetKey("pack_plan")).partitions_def is None
    assert dg.AssetKey("token_lengths") in graph.get(dg.AssetKey("pack_plan")).parent_keys
    assert [s.name for s in defs.sensors] == ["new_shard_sensor", "replan_sensor"]


def _settings(inp: Path, tmp: Path) -> PackSettings:
    return PackSettings(input_dir=str(inp), work_dir=str(tmp / "work"), output_dir=str(tmp / "out"), max_len=1500,
                        max_packs_per_shard=3)


def test_full_materialization_in_process(dataset, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    settings = _settings(dataset, tmp_path)
    shards = ["part-000", "part-001"]
    instance.add_dynamic_partitions(source_shards.name, shards)
    for key in shards:
        res = dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                             resources={"settings": settings})
        assert res.success
        evaluated = [(c.check_name, c.passed) for c in res.get_asset_check_evaluations()]
        assert evaluated == [("every_sample_accounted", True)]
    res = dg.materialize([pack_plan, packed_shards, audit_report], instance=instance, resources={"settings": settings})
    assert res.success
    checks = res.get_asset_check_evaluations()
    assert sorted((c.check_name, c.passed) for c in checks) == [("every_sample_once", True), ("nothing_lost", True)]
    mats = {e.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
            for e in res.get_asset_materialization_events()}
    assert mats["audit_report"]["samples_read"].value == 26
    assert mats["pack_plan"]["packs"].value >= mats["pack_plan"]["lower_bound"].value
    # the table asset's columns are the catalog's: what a user queries in DuckDB is what the UI lists
    columns = [c.name for c in mats["pack_plan"]["dagster/column_schema"].value.columns]
    with store.connect(tmp_path / "work", read_only=True) as con:
        assert columns == [r[0] for r in con.execute("DESCRIBE pack_plan").fetchall()]
    assert mats["audit_report"]["report_markdown"].value.startswith("# pack_assets audit report")
    assert (tmp_path / "work" / "pack_plan.jsonl").exists() and list((tmp_path / "out").glob("*.tar"))
    # written again, every output shard is found current: one log line (an event Dagster stores) for them all
    again = dg.materialize([packed_shards], instance=instance, resources={"settings": settings})
    logs = _materialization_logs(instance, again.run_id)
    n = len(list((tmp_path / "out").glob("*.tar")))
    assert n > 1 and f"{n} output shard(s) already there as planned, kept" in logs
    assert not [line for line in logs if line.startswith("[")], logs


def test_sensor_adds_new_shards_in_sorted_batches_with_run_keys(dataset, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    ctx = dg.build_sensor_context(instance=instance, resources={"settings": _settings(dataset, tmp_path)})
    result = new_shard_sensor(ctx)
    assert [r.partition_key for r in result.run_requests] == ["part-000", "part-001"]
    assert all(r.run_key.startswith(r.partition_key + ":") for r in result.run_requests)
    (req,) = result.dynamic_partitions_requests
    assert list(req.partition_keys) == ["part-000", "part-001"]
    instance.add_dynamic_partitions(source_shards.name, list(req.partition_keys))
    again = new_shard_sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor,
                                                     resources={"settings": _settings(dataset, tmp_path)}))
    assert isinstance(again, dg.SkipReason)


def test_shards_registered_when_the_code_location_loaded_are_run_by_the_sensor(dataset, tmp_path):
    """The code location registers the input's shards as it loads (defs/partitions.py); the sensor then
    requests their runs, with the run keys it gives new shards, though they are no longer new to it."""
    from pack_assets.defs.partitions import register_input_shards

    instance = dg.DagsterInstance.ephemeral()
    settings = _settings(dataset, tmp_path)
    assert register_input_shards(instance, settings.to_settings()) == ["part-000", "part-001"]
    assert register_input_shards(instance, settings.to_settings()) == []
    result = new_shard_sensor(dg.build_sensor_context(instance=instance, resources={"settings": settings}))
    assert not result.dynamic_partitions_requests
    stats = store.stat_shards(dataset)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [
        (k, f"{k}:{stats[k][0]}:{stats[k][1]}") for k in ("part-000", "part-001")]
    dg.materialize([manifest, token_lengths], partition_key="part-000", instance=instance,
                   resources={"settings": settings})
    # without the cursor (a new sensor): only the shard still never scanned
    later = new_shard_sensor(dg.build_sensor_context(instance=instance, resources={"settings": settings}))
    assert [r.partition_key for r in later.run_requests] == ["part-001"]


RECONSTRUCT = """
import sys
import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
# what a run's or a step's process does with the code location (`dagster api execute_run` / `execute_step`)
ReconstructableRepository.for_module("pack_assets.definitions", "defs", None).get_definition()
print(sorted(dg.DagsterInstance.get().get_dynamic_partitions("source_shards")))
"""


def test_the_code_location_registers_the_input_when_loaded_to_serve_not_when_a_run_rebuilds_it(tmp_path):
    """`dagster definitions validate` (the CLI's load, as `dagster dev` and `asset materialize` load) registers
    the input's shards in a fresh home; the same module rebuilt the way a run or step process rebuilds it
    (Dagster's RECONSTRUCTION load, which defs/partitions.py reads from a private context) registers nothing:
    where Dagster moved that context, every step process would scan the input again."""
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=1)
    env = {**os.environ, "PACK_ASSETS_INPUT": str(inp), "PACK_ASSETS_WORK": str(tmp_path / "work"),
           "PACK_ASSETS_OUTPUT": str(tmp_path / "out"), "NO_COLOR": "1"}
    served, rebuilt = tmp_path / "served", tmp_path / "rebuilt"
    served.mkdir(), rebuilt.mkdir()
    procs = [subprocess.Popen([_tool("dagster"), "definitions", "validate", "-m", "pack_assets.definitions"],
                              env={**env, "DAGSTER_HOME": str(served)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True),
             subprocess.Popen([sys.executable, "-c", RECONSTRUCT], env={**env, "DAGSTER_HOME": str(rebuilt)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    (out, err), (listed, err2) = (p.communicate(timeout=300) for p in procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, (err[-2000:], err2[-2000:])
    assert listed.strip().splitlines()[-1] == "[]"
    instance = dg.DagsterInstance.from_config(str(served))
    assert sorted(instance.get_dynamic_partitions(source_shards.name)) == ["part-000", "part-001"]


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


@needs(_tool("dg") is None, "dg is not installed (pip install 'dagster-dg-cli>=1.13,<1.14')")
def test_dagster_asset_materialize_and_dg_launch_on_a_fresh_home_for_any_shard_in_the_input(tmp_path):
    """As the README says, on a DAGSTER_HOME nobody has used, with only PACK_ASSETS_* set: the real
    `dagster asset materialize` and `dg launch` materialize a shard of the input and one added since,
    and the pack assets follow with a PASS. Nothing registers the partitions beforehand: the
    code location does it as it loads (defs/partitions.py)."""
    inp = small_dataset(tmp_path / "in", n_shards=1, per_shard=3)
    home = tmp_path / "fresh_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PACK_ASSETS_INPUT": str(inp), "NO_COLOR": "1",
           "PACK_ASSETS_WORK": str(tmp_path / "work"), "PACK_ASSETS_OUTPUT": str(tmp_path / "out"),
           "PACK_ASSETS_MAX_LEN": "1500"}
    materialize = [_tool("dagster"), "asset", "materialize", "-m", "pack_assets.definitions", "--select"]

    def ok(cmd: list[str], cwd: Path) -> None:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])

    ok([*materialize, "manifest,token_lengths", "--partition", "part-000"], tmp_path)
    assert (tmp_path / "work" / "token_lengths" / "qwen3-vl" / "part-000" / "token_lengths.parquet").exists()
    write_tar(inp / "part-002.tar", [("k.json", '{"messages": [{"role": "user", "content": "hi"}]}')])
    # a shard added since; dg finds the project by pyproject.toml's [tool.dg]
    ok([_tool("dg"), "launch", "--assets", "manifest,token_lengths", "--partition", "part-002"], ROOT)
    ok([*materialize, "pack_plan,packed_shards,audit_report"], tmp_path)
    report = (tmp_path / "work" / "audit_report.md").read_text()
    assert "**Verdict: PASS**" in report and "| part-000 | 4 |" in report and "| part-002 | 1 |" in report


def test_four_shard_runs_side_by_side_no_lock_error_no_lost_rows(tmp_path, monkeypatch):
    from pack_assets.runner.orchestrate import instance_for, run_pipeline

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=4, per_shard=9)
    instance = instance_for(tmp_path / "dh")
    summary = run_pipeline(_settings(inp, tmp_path).to_settings(), instance, log=lambda m: None, jobs=4)
    assert summary["shard_runs"] == 4 and summary["violations"] == 0
    assert summary["samples"] == 4 * 10 and summary["rejected"] == 4
    runs = instance.get_runs()
    # 4 workers, 4 shards: a run per shard, each a partition of its own; every shard's partition materialized
    shard_runs = [r for r in runs if r.tags.get("dagster/partition")]
    assert sorted(r.tags["dagster/partition"] for r in shard_runs) == ["part-000", "part-001", "part-002", "part-003"]
    assert all(r.is_success for r in runs)
    for asset in ("manifest", "token_lengths"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {f"part-00{i}" for i in range(4)}


def test_one_process_scans_every_shard_in_one_run_over_a_partition_range(tmp_path, monkeypatch):
    from pack_assets.runner.orchestrate import instance_for, run_pipeline

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=3, per_shard=9)
    instance = instance_for(tmp_path / "dh")
    lines = []
    summary = run_pipeline(_settings(inp, tmp_path).to_settings(), instance, log=lines.append, jobs=1)
    assert summary["shard_runs"] == 3 and summary["violations"] == 0
    (shard_run,) = [r for r in instance.get_runs() if r.tags.get("dagster/asset_partition_range_start")]
    assert (shard_run.tags["dagster/asset_partition_range_start"],
            shard_run.tags["dagster/asset_partition_range_end"]) == ("part-000", "part-002")
    for asset in ("manifest", "token_lengths"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {"part-000", "part-001", "part-002"}
    # progress still comes shard by shard, as each is counted
    assert [ln for ln in lines if "scanned and counted" in ln] == [
        f"[{i + 1}/3] scanned and counted part-00{i}" for i in range(3)]


def test_shard_batches_are_consecutive_partitions():
    from pack_assets.runner.orchestrate import _batches

    order = ["a", "b", "c", "d", "e"]
    assert _batches(["a", "b", "c", "d", "e"], order, 16) == [["a", "b", "c", "d", "e"]]
    assert _batches(["e", "a", "b", "d"], order, 16) == [["a", "b"], ["d", "e"]]
    assert _batches(["a", "b", "c", "d", "e"], order, 2) == [["a", "b"], ["c", "d"], ["e"]]


def test_lookup_job_answers_like_the_cli(dataset, tmp_path):
    from pack_assets.core import store
    from pack_assets.core.lookup import lookup
    from pack_assets.defs.jobs import lookup_job

    instance = dg.DagsterInstance.ephemeral()
    settings = _settings(dataset, tmp_path)
    instance.add_dynamic_partitions(source_shards.name, ["part-000", "part-001"])
    for key in ("part-000", "part-001"):
        dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                       resources={"settings": settings})
    dg.materialize([pack_plan, packed_shards, audit_report], instance=instance, resources={"settings": settings})
    asked = {"ops": {"lookup_provenance": {"config": {"id": "part-001/s1_002"}}}}
    res = lookup_job.execute_in_process(run_config=asked,
                                        resources={"settings": settings}, instance=instance)
    assert res.success
    (ev,) = [e for e in res.all_events if e.event_type_value == "STEP_OUTPUT"]
    md = ev.event_specific_data.metadata
    with store.connect(tmp_path / "work", read_only=True) as con:
        expected = lookup(con, "part-001/s1_002")
    assert md["answer"].value == json.loads(json.dumps(expected)) and md["outcome"].value == "packed"
    bad = lookup_job.execute_in_process(run_config={"ops": {"lookup_provenance": {"config": {"id": "nope"}}}},
                                        resources={"settings": settings}, instance=instance, raise_on_error=False)
    assert not bad.success


def test_a_backfill_run_covers_a_range_of_shards(dataset, tmp_path):
    from pack_assets.definitions import defs as all_defs

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(source_shards.name, ["part-000", "part-001"])
    assert graph_policy("manifest").max_partitions_per_run == 16
    job = all_defs.resolve_job_def("shard_job")
    res = job.execute_in_process(instance=instance, resources={"settings": _settings(dataset, tmp_path)},
                                 tags={"dagster/asset_partition_range_start": "part-000",
                                       "dagster/asset_partition_range_end": "part-001"})
    assert res.success
    for shard in ("part-000", "part-001"):
        assert (tmp_path / "work" / "token_lengths" / "qwen3-vl" / shard / "token_lengths.parquet").exists()


def graph_policy(key: str):
    return defs.resolve_asset_graph().get(dg.AssetKey(key)).backfill_policy


def test_replan_sensor_fires_after_new_counts_and_plan_skips_a_failed_shard(dataset, tmp_path):
    from pack_assets.defs.sensors import replan_sensor

    instance = dg.DagsterInstance.ephemeral()
    settings = _settings(dataset, tmp_path)
    instance.add_dynamic_partitions(source_shards.name, ["part-000", "part-001", "part-broken"])
    assert isinstance(replan_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)
    for key in ("part-000", "part-001"):
        dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                       resources={"settings": settings})
    # a shard whose counting never finished: scanned, not counted (its tar is there: a removed one is not waiting)
    write_tar(dataset / "part-broken.tar", [("k.json", '{"messages": [{"role": "user", "content": "hi"}]}')])
    dg.materialize([manifest, token_lengths], selection=[manifest], partition_key="part-broken", instance=instance,
                   resources={"settings": settings})
    request = replan_sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(request, dg.RunRequest)
    res = dg.materialize([pack_plan], instance=instance, resources={"settings": settings})
    mat = res.get_asset_materialization_events()[0].event_specific_data.materialization.metadata
    assert mat["shards"].value == 2  # the shard without counts waits; it does not stall the plan
    assert mat["shards_waiting"].value == ["part-broken"]
    assert isinstance(replan_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)


def _materialization_logs(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.dagster_event is None and e.user_message]


def test_shard_workers_scan_before_dagster_and_the_runs_record_every_shard(tmp_path, monkeypatch):
    """`pack-assets run`'s path: helper processes scan and count (runner/shardwork.py), then one Dagster run
    over the partition range records each shard from their files, saying whose they are, and goes on with
    the pack assets; the outcome equals the shards scanned inside the Dagster steps."""
    from pack_assets.runner import shardwork
    from pack_assets.runner.orchestrate import instance_for, run_pipeline
    from pack_assets.runner.procs import Helpers

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=3, per_shard=9)
    settings = _settings(inp, tmp_path).to_settings()
    work = shardwork.find(settings)
    assert work.todo == ["part-000", "part-001", "part-002"] and shardwork.helpers_for(work, 2) == 2
    with Helpers(2) as helpers:
        shardwork.start(work, settings, helpers)
        scanners = list(helpers.scan._processes)
        instance = instance_for(tmp_path / "dh")
        lines = []
        summary = run_pipeline(settings, instance, log=lines.append, work=work, pool=helpers.pool)
        assert scanners and not any(Path(f"/proc/{p}").exists() for p in scanners)  # ended with the shards
    assert summary["shard_runs"] == 3 and summary["jobs"] == 2 and summary["violations"] == 0
    assert summary["samples"] == 30 and summary["rejected"] == 3
    done = [ln for ln in lines if "scanned and counted" in ln]  # as the two helpers finish them
    assert [ln.split()[0] for ln in done] == ["[1/3]", "[2/3]", "[3/3]"]
    assert sorted(ln.split()[-1] for ln in done) == ["part-000", "part-001", "part-002"]
    (shard_run,) = [r for r in instance.get_runs() if r.tags.get("dagster/asset_partition_range_start")]
    assert shard_run.tags[SHARD_WORKERS_TAG] == "part-000,part-001,part-002" and shard_run.is_success
    assert len(instance.get_runs()) == 1  # the plan, the write and the audit were steps of that run
    for asset in ("pack_plan", "packed_shards", "audit_report"):
        assert instance.get_latest_materialization_event(dg.AssetKey(asset)).run_id == shard_run.run_id
    logs = _materialization_logs(instance, shard_run.run_id)
    assert sum("(by the command's helper processes)" in m for m in logs) == 6  # both assets, 3 shards
    for asset in ("manifest", "token_lengths"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {"part-000", "part-001", "part-002"}
    # the same shards scanned inside the Dagster steps give the same plan
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh2"))
    other = tmp_path / "steps"
    in_steps = run_pipeline(_settings(inp, other).to_settings(), instance_for(tmp_path / "dh2"), log=lambda m: None,
                            jobs=1)
    assert ((other / "work" / "pack_plan.jsonl").read_text() == (tmp_path / "work" / "pack_plan.jsonl").read_text())
    assert in_steps["packs"] == summary["packs"]
    # the side work (the what-if sweep, the audit's recount and figures) done by the side helpers: as in line
    audited = [json.loads((w / "audited_shards.json").read_text()) for w in (tmp_path / "work", other / "work")]
    assert in_steps["violations"] == 0 and audited[0]["versions"] == audited[1]["versions"]
    assert audited[0]["recount_fraction"] == audited[1]["recount_fraction"] > 0
    plots = sorted(p.name for p in (tmp_path / "work" / "plots").glob("*.png"))
    assert len(plots) >= 5 and plots == sorted(p.name for p in (other / "work" / "plots").glob("*.png"))
    for name in plots:
        assert (tmp_path / "work" / "plots" / name).read_bytes() == (other / "work" / "plots" / name).read_bytes(), name


def test_a_shard_step_that_fails_in_the_run_with_the_pack_assets_stops_before_the_plan(tmp_path, monkeypatch):
    """The pack assets follow the helpers' shards in one run: a shard step failing there (here: recording
    the counts) is the command's error, named by its step, and nothing is planned from the shards."""
    from pack_assets.defs import assets
    from pack_assets.runner import shardwork
    from pack_assets.runner.orchestrate import PipelineError, instance_for, run_pipeline
    from pack_assets.runner.procs import Helpers

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=9)
    settings = _settings(inp, tmp_path).to_settings()
    work = shardwork.find(settings)

    def broken(*args, **kwargs):
        raise OSError("the catalog disk went away")

    with Helpers(2) as helpers:
        shardwork.start(work, settings, helpers)
        monkeypatch.setattr(assets, "run_token_counts", broken)  # after the fork: the helpers count as usual
        instance = instance_for(tmp_path / "dh")
        with pytest.raises(PipelineError, match=r"token_lengths: .*the catalog disk went away"):
            run_pipeline(settings, instance, log=lambda m: None, work=work)
    assert not (tmp_path / "work" / "pack_plan.jsonl").exists() and not (tmp_path / "out").exists()
    assert instance.get_latest_materialization_event(dg.AssetKey("pack_plan")) is None


def test_a_shard_the_helper_failed_on_is_scanned_by_its_dagster_step(tmp_path, monkeypatch):
    """A helper's error never loses the shard: it is told, and the Dagster step does the work (and would
    raise the error itself where the UI shows it); its log does not claim a helper's scan."""
    from concurrent.futures import Future

    from pack_assets.runner.orchestrate import instance_for, run_pipeline
    from pack_assets.runner.shardwork import ShardWork

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=9)
    failed = Future()
    failed.set_exception(RuntimeError("OSError: disk went away"))
    work = ShardWork(["part-000", "part-001"], ["part-000", "part-001"], running=True, _futures={"part-000": failed})
    lines = []
    instance = instance_for(tmp_path / "dh")
    summary = run_pipeline(_settings(inp, tmp_path).to_settings(), instance, log=lines.append, work=work)
    assert summary["samples"] == 20 and summary["violations"] == 0
    told = lines.index("part-000: its helper process failed (OSError: disk went away); its Dagster step scans "
                       "and counts it")
    assert lines.index("[1/2] scanned and counted part-000") > told  # counted once its step has run
    for asset in ("manifest", "token_lengths"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {"part-000", "part-001"}
    (run,) = [r for r in instance.get_runs() if r.tags.get(SHARD_WORKERS_TAG) is not None]
    assert run.tags[SHARD_WORKERS_TAG] == "" and not any("helper processes" in m for m in
                                                          _materialization_logs(instance, run.run_id))
    # a shard step that does real work has its own run: the pack assets follow in another
    assert instance.get_latest_materialization_event(dg.AssetKey("pack_plan")).run_id != run.run_id


def test_a_shard_scanned_but_never_recorded_in_dagster_is_recorded_by_the_next_run(tmp_path, monkeypatch):
    """A command stopped between a helper's scan and its Dagster run leaves current files and no
    materialization; the next run (nothing left to scan) records the shard instead of skipping it."""
    from pack_assets.runner.orchestrate import instance_for, run_pipeline
    from pack_assets.runner.shardwork import work_shard

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=9)
    settings = _settings(inp, tmp_path).to_settings()
    for key in ("part-000", "part-001"):
        work_shard(settings.flat(), key, False)  # scanned and counted, as a helper would; Dagster never told
    instance = instance_for(tmp_path / "dh")
    lines = []
    summary = run_pipeline(settings, instance, log=lines.append, jobs=1)
    assert summary["shard_runs"] == 0 and summary["samples"] == 20
    assert "0 shard run(s), 2 shard(s) unchanged (2 recorded in Dagster now); planning, writing and auditing" in lines
    for asset in ("manifest", "token_lengths"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {"part-000", "part-001"}
