import dagster as dg

from .assets import audit_report, manifest, pack_plan, packed_shards, token_lengths

# per-shard runs in one process: the step-per-process overhead dominates small shards
shard_job = dg.define_asset_job(
    "shard_job",
    selection=[manifest, token_lengths],
    executor_def=dg.in_process_executor,
)
pack_job = dg.define_asset_job(
    "pack_job",
    selection=[pack_plan, packed_shards, audit_report],
    executor_def=dg.in_process_executor,
)
