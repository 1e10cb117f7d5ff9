"""Partitions definitions shared by the assets, the sensors and the orchestration, and the registration of
the input's shards when the code location loads.

Dagster's CLI cannot add a dynamic partition (dagster-io/dagster#15499), and `dagster asset materialize
--partition <shard>` refuses a key the instance does not hold. So when the code location loads (in `dagster
asset materialize`, `dg launch` or `dagster dev`; not when a run or a step rebuilds it), the shards under
the `settings` resource's input (`PACK_ASSETS_INPUT`) that are not registered yet are added: any shard in
the input can be materialized from a fresh `DAGSTER_HOME`. Only additions: the removal of a shard whose tar
is gone stays with `new_shard_sensor` and `pack-assets run`; the sensor requests the runs of registered
shards never scanned as it does for new ones."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from ..core import store
from ..core.settings import Settings

# one partition per source shard: the shard path under the input root, without ".tar"
source_shards = dg.DynamicPartitionsDefinition(name="source_shards")

BATCH = 5000  # partitions added, and shard runs requested, at once (Dagster advises small batches)


def input_exists(settings: Settings) -> bool:
    """The input folder, or every folder of a recipe's datasets, exists."""
    roots = settings.sources
    return all(Path(r).is_dir() for r in (roots.values() if isinstance(roots, dict) else [roots]))


def register_input_shards(instance: dg.DagsterInstance, settings: Settings) -> list[str]:
    """Add the input's shards that are not partitions yet (sorted, in batches); returns them. Nothing when
    the input (or a recipe's dataset folder) does not exist."""
    if not input_exists(settings):
        return []
    roots = settings.sources
    known = set(instance.get_dynamic_partitions(source_shards.name))
    new = [k for k in store.find_sources(roots, settings.recursive) if k not in known]
    for i in range(0, len(new), BATCH):
        instance.add_dynamic_partitions(source_shards.name, new[i:i + BATCH])
    return new


def register_on_load(settings: Settings) -> None:
    """`register_input_shards` into the instance of DAGSTER_HOME when the code location is loaded to serve or
    launch (Dagster's INITIALIZATION load); a run or step process rebuilding it (RECONSTRUCTION) skips it.
    Never fails the load: the partitions are then registered by the sensor or `pack-assets run`."""
    if not os.environ.get("DAGSTER_HOME") or _rebuilt_by_a_run():
        return
    try:
        register_input_shards(dg.DagsterInstance.get(), settings)
    except Exception as e:  # noqa: BLE001 - an unreadable input or instance must not break the code location
        dg.get_dagster_logger().warning(f"pack_assets: the input's shards were not registered as partitions: {e}")


def _rebuilt_by_a_run() -> bool:
    """Whether Dagster is rebuilding the definitions in a run or step process (its RECONSTRUCTION load). Its
    load context is not public API (pinned Dagster 1.13): where it moved, every load registers (idempotent)."""
    try:
        from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
    except ImportError:
        return False
    return DefinitionsLoadContext.get().load_type == DefinitionsLoadType.RECONSTRUCTION
