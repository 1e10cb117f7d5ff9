"""new_shard_sensor: registers new source shards as partitions and requests their runs."""


import os

import dagster as dg

from ..core import store
from .jobs import pack_job, shard_job
from .partitions import source_shards
from .resources import PackSettings

BATCH = 5000  # partitions added per tick (Dagster advises small batches)
# seconds between new-shard checks; replanning waits twice as long (small deployments and tests lower it)
INTERVAL = int(os.environ.get("PACK_ASSETS_SENSOR_INTERVAL", "30"))


@dg.sensor(job=shard_job, minimum_interval_seconds=INTERVAL, default_status=dg.DefaultSensorStatus.RUNNING)
def new_shard_sensor(context: dg.SensorEvaluationContext, settings: PackSettings) -> dg.SensorResult | dg.SkipReason:
    """Finds new `*.tar` shards under the input directory, adds them to `source_shards` (sorted, in
    batches) and requests a `shard_job` run for each, keyed by shard, size and mtime."""
    root = settings.input_root
    if not root.is_dir():
        return dg.SkipReason(f"input directory {root} does not exist")
    found = store.find_shards(root, settings.recursive)
    known = set(context.instance.get_dynamic_partitions(source_shards.name))
    new = [k for k in found if k not in known][:BATCH]
    if not new:
        return dg.SkipReason(f"no new shards among {len(found)} under {root}")
    requests = []
    for key in new:
        st = found[key].stat()
        requests.append(dg.RunRequest(partition_key=key, run_key=f"{key}:{st.st_size}:{st.st_mtime_ns}"))
    context.log.info(f"adding {len(new)} new shard(s): {new[:5]}{' ...' if len(new) > 5 else ''}")
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=[source_shards.build_add_request(new)])


@dg.sensor(job=pack_job, minimum_interval_seconds=2 * INTERVAL, default_status=dg.DefaultSensorStatus.RUNNING)
def replan_sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    """Requests plan → write → audit once new token counts exist and no shard run is still queued or
    running. A failed or missing shard does not hold the rest back: `pack_plan` plans the shards that have
    counts and lists the others as waiting (unlike `AutomationCondition.eager()`, which waits for all)."""
    instance = context.instance
    counted = instance.get_latest_materialization_event(dg.AssetKey("token_lengths"))
    if counted is None:
        return dg.SkipReason("no token_lengths materialized yet")
    planned = instance.get_latest_materialization_event(dg.AssetKey("pack_plan"))
    if planned is not None and planned.timestamp >= counted.timestamp:
        return dg.SkipReason("the plan is newer than every token count")
    busy = instance.get_runs(dg.RunsFilter(job_name=shard_job.name, statuses=[
        dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED]), limit=1)
    if busy:
        return dg.SkipReason("shard runs are still in progress")
    return dg.RunRequest(run_key=f"replan-after-{counted.timestamp}")
