import dagster as dg

from .defs.assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
from .defs.jobs import pack_job, shard_job
from .defs.lookup import lookup_job
from .defs.resources import settings_from_env, summary_io_manager
from .defs.sensors import new_shard_sensor, replan_sensor

defs = dg.Definitions(
    assets=[manifest, token_lengths, pack_plan, packed_shards, audit_report],
    jobs=[shard_job, pack_job, lookup_job],
    sensors=[new_shard_sensor, replan_sensor],
    resources={"settings": settings_from_env(), "io_manager": summary_io_manager},
)
