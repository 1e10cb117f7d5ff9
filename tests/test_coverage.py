"""Nothing silently left out (issue 37): the audit compares the plan with the shards in the INPUT, not only
the partitions registered in Dagster, and a plan names the shards that left the input since the last one
even when the sensor already deleted their partition."""

from __future__ import annotations

import dagster as dg
from conftest import small_dataset, write_tar

from pack_assets.core import blend, epochs, store
from pack_assets.core import recipe as rc
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig
from pack_assets.core.scan import run_manifest
from pack_assets.defs.assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
from pack_assets.defs.partitions import source_shards
from pack_assets.defs.resources import PackSettings
from pack_assets.defs.sensors import new_shard_sensor

PACK = [pack_plan, packed_shards, audit_report]


def _settings(tmp_path) -> PackSettings:
    return PackSettings(input_dir=str(tmp_path / "in"), work_dir=str(tmp_path / "work"),
                        output_dir=str(tmp_path / "out"), max_len=1500)


def _shards(instance, settings, keys) -> None:
    for key in keys:
        assert dg.materialize([manifest, token_lengths], partition_key=key, instance=instance,
                              resources={"settings": settings}).success


def _nothing_lost(result: dg.ExecuteInProcessResult):
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "nothing_lost"]
    return check


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    return {k: v.value for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset
            for k, v in e.event_specific_data.materialization.metadata.items()}


def test_a_shard_dropped_into_the_input_and_never_registered_makes_the_audit_incomplete(tmp_path):
    small_dataset(tmp_path / "in", n_shards=2, per_shard=4)
    instance, settings = dg.DagsterInstance.ephemeral(), _settings(tmp_path)
    instance.add_dynamic_partitions(source_shards.name, ["part-000", "part-001"])
    _shards(instance, settings, ["part-000", "part-001"])
    write_tar(tmp_path / "in" / "part-005.tar", [("k.json", '{"messages": [{"role": "user", "content": "hi"}]}')])
    res = dg.materialize(PACK, instance=instance, resources={"settings": settings}, raise_on_error=False)
    check = _nothing_lost(res)
    assert not check.passed and check.metadata["verdict"].value == "INCOMPLETE"
    assert check.metadata["shards_waiting"].value == ["part-005"]
    audit = _metadata(res, "audit_report")
    assert audit["verdict"] == "INCOMPLETE" and audit["shards_waiting"] == ["part-005"]
    report = (tmp_path / "work" / "audit_report.md").read_text()
    assert "**Verdict: INCOMPLETE**" in report and "part-005" in report.split("##")[0]
    # counted and planned, it passes
    instance.add_dynamic_partitions(source_shards.name, ["part-005"])
    _shards(instance, settings, ["part-005"])
    res = dg.materialize(PACK, instance=instance, resources={"settings": settings})
    assert _nothing_lost(res).passed and _metadata(res, "audit_report")["samples_read"] == 2 * 5 + 1


def test_a_recipe_audit_names_the_dataset_shards_its_plan_did_not_count(tmp_path):
    roots = {n: small_dataset(tmp_path / "in" / n, n_shards=2, per_shard=3) for n in ("a", "b")}
    recipe = rc.Recipe(tuple(rc.Dataset(n, str(p), 1.0) for n, p in roots.items()), epochs=2, seed=1)
    profile, work, out = load_profile("qwen3-vl"), tmp_path / "work", tmp_path / "out"
    keys = list(store.find_sources(recipe.roots))
    for k in keys:
        run_manifest(recipe.roots, work, k)
        run_token_lengths(work, k, profile)
    counted = [k for k in keys if k != "b/part-001"]  # registered and counted; b/part-001 never was
    blend.run_blend_plan(work, counted, PlanConfig(max_len=1500, seed=1), profile, recipe)
    epochs.run_blend_write(work, recipe, out, workers=1)
    result = epochs.run_blend_audit(work, recipe, out)
    assert result.ok and result.verdict == "INCOMPLETE" and result.waiting == ["b/part-001"]
    blend.run_blend_plan(work, keys, PlanConfig(max_len=1500, seed=1), profile, recipe)
    epochs.run_blend_write(work, recipe, out, workers=1)
    assert epochs.run_blend_audit(work, recipe, out).verdict == "PASS"


def test_the_plan_names_a_shard_that_left_after_the_sensor_deleted_its_partition(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=4)
    instance, settings = dg.DagsterInstance.ephemeral(), _settings(tmp_path)

    def tick() -> None:  # what the daemon does with the sensor's result
        result = new_shard_sensor(dg.build_sensor_context(instance=instance, resources={"settings": settings}))
        for req in getattr(result, "dynamic_partitions_requests", None) or []:
            if isinstance(req, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(source_shards.name, list(req.partition_keys))
            else:
                for key in req.partition_keys:
                    instance.delete_dynamic_partition(source_shards.name, key)

    tick()
    _shards(instance, settings, ["part-000", "part-001"])
    planned = dg.materialize([pack_plan], instance=instance, resources={"settings": settings})
    assert _metadata(planned, "pack_plan")["shards_removed"] == []
    (inp / "part-001.tar").unlink()
    tick()
    assert instance.get_dynamic_partitions(source_shards.name) == ["part-000"]  # gone before the plan runs
    planned = _metadata(dg.materialize([pack_plan], instance=instance, resources={"settings": settings}), "pack_plan")
    assert planned["shards_removed"] == ["part-001"] and planned["shards"] == 1
    again = _metadata(dg.materialize([pack_plan], instance=instance, resources={"settings": settings}), "pack_plan")
    assert again["shards_removed"] == []  # named once: by the first plan after it left
