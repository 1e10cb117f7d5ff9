"""new_shard_sensor: registers new source shards as partitions, requests the runs of new and changed ones
and removes the partitions of shards that are gone; replan_sensor: plan → write → audit after them."""

import hashlib
import json
import os

import dagster as dg
import duckdb

from ..core import store
from .assets import shards_digest
from .jobs import pack_job, shard_job
from .partitions import BATCH, input_exists, source_shards
from .resources import PackSettings

# seconds between new-shard checks; replanning waits twice as long (small deployments and tests lower it)
INTERVAL = int(os.environ.get("PACK_ASSETS_SENSOR_INTERVAL", "30"))


def _stamp(found: dict[str, tuple[int, int]], key: str) -> str:
    """size:mtime of a shard, the part of its run key that changes when the tar is rewritten in place."""
    return f"{found[key][0]}:{found[key][1]}"


def _few(keys: list[str]) -> str:
    return f"{keys[:5]}{' ...' if len(keys) > 5 else ''}"


def _listing_digest(stats: dict[str, tuple[int, int]]) -> str:
    h = hashlib.sha256()
    for key, (size, mtime) in sorted(stats.items()):
        h.update(f"{key}\t{size}\t{mtime}\n".encode())
    return h.hexdigest()[:16]


@dg.sensor(job=shard_job, minimum_interval_seconds=INTERVAL, default_status=dg.DefaultSensorStatus.RUNNING)
def new_shard_sensor(context: dg.SensorEvaluationContext, settings: PackSettings) -> dg.SensorResult | dg.SkipReason:
    """Finds new `*.tar` shards under the input directory, adds them to `source_shards` (sorted, in
    batches) and requests a `shard_job` run for each, keyed by shard, size and mtime; requests the run of a
    known shard never scanned (registered when the code location loaded: `defs/partitions.py`) or whose
    size or mtime differs from what its manifest recorded (changed in place); deletes the partitions of
    shards whose tar is gone.

    The cursor keeps a digest of the listing (names, sizes, mtimes): while it is unchanged a tick reads no
    manifest. When it changed, the recorded stats of all known shards are read in one query. The cursor
    also keeps the changed shards already requested (until their manifest catches up), so a batch limit
    never requests the same ones again instead of the rest; a run key already used is never run twice."""
    s = settings.to_settings()
    root = s.sources  # a recipe: every dataset's folder, shard keys `<dataset>/<shard>`
    if not input_exists(s):
        return dg.SkipReason(f"input directory {root} does not exist")
    found = store.stat_shards(root, s.recursive)
    known = set(context.instance.get_dynamic_partitions(source_shards.name))
    cursor = json.loads(context.cursor) if context.cursor else {}
    listing = _listing_digest(found)
    new = [k for k in found if k not in known]
    removed = sorted(known - set(found))
    pending: list[str] = []  # known, and never scanned or changed since their scan
    requested = {k: v for k, v in cursor.get("requested", {}).items() if k in found}
    if cursor.get("listing") != listing:
        try:
            recorded = store.recorded_stats(s.work, [k for k in found if k in known])
        except duckdb.Error as e:  # a shard run swapping its manifest directory in right now
            return dg.SkipReason(f"manifests changing while read, trying again next tick: {e}")
        requested = {k: v for k, v in requested.items() if recorded.get(k) != found[k]}
        pending = [k for k in found
                   if k in known and recorded.get(k) != found[k] and requested.get(k) != _stamp(found, k)]
    add, rerun = new[:BATCH], pending[:max(0, BATCH - len(new))]
    complete = len(add) == len(new) and len(rerun) == len(pending)
    if not (add or rerun or removed):
        context.update_cursor(json.dumps({"listing": listing, "requested": requested}))
        return dg.SkipReason(f"no new, changed or removed shards among {len(found)} under {root}")
    requests = [dg.RunRequest(partition_key=k, run_key=f"{k}:{_stamp(found, k)}") for k in add + rerun]
    requested.update({k: _stamp(found, k) for k in rerun})
    partitions = []
    if add:
        partitions.append(source_shards.build_add_request(add))
        context.log.info(f"adding {len(add)} new shard(s): {_few(add)}")
    if rerun:
        context.log.info(f"scanning {len(rerun)} registered shard(s) never scanned or changed in place: {_few(rerun)}")
    if removed:
        partitions.append(source_shards.build_delete_request(removed))
        context.log.info(f"removing {len(removed)} shard(s) no longer under {root}: {_few(removed)}")
    # a truncated batch leaves the listing unrecorded, so the next tick looks again
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partitions,
                           cursor=json.dumps({"listing": listing if complete else None, "requested": requested}))


@dg.sensor(job=pack_job, minimum_interval_seconds=2 * INTERVAL, default_status=dg.DefaultSensorStatus.RUNNING)
def replan_sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    """Requests plan → write → audit once new token counts exist, or the registered shards differ from
    those of the last plan (a shard removed), and no shard run is still queued or running. A failed or
    missing shard does not hold the rest back: `pack_plan` plans the shards that have counts and lists the
    others as waiting (unlike `AutomationCondition.eager()`, which waits for all)."""
    instance = context.instance
    counted = instance.get_latest_materialization_event(dg.AssetKey("token_lengths"))
    if counted is None:
        return dg.SkipReason("no token_lengths materialized yet")
    planned = instance.get_latest_materialization_event(dg.AssetKey("pack_plan"))
    digest = shards_digest(instance.get_dynamic_partitions(source_shards.name))
    planned_digest = None
    if planned is not None and planned.asset_materialization is not None:
        value = planned.asset_materialization.metadata.get("registered_shards_digest")
        planned_digest = value.value if value is not None else None
    shards_changed = planned_digest is not None and planned_digest != digest
    if planned is not None and planned.timestamp >= counted.timestamp and not shards_changed:
        return dg.SkipReason("the plan is newer than every token count and covers the registered shards")
    busy = instance.get_runs(dg.RunsFilter(job_name=shard_job.name, statuses=[
        dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED]), limit=1)
    if busy:
        return dg.SkipReason("shard runs are still in progress")
    return dg.RunRequest(run_key=f"replan-after-{counted.timestamp}" + (f"-shards-{digest}" if shards_changed else ""))
