"""The code location: `pack_assets.definitions:defs` (dagster dev -m, workspace.yaml, [tool.dagster], [tool.dg]).

An explicit list, not `dg.load_from_defs_folder`: that one finds the defs folder through pyproject.toml's
[tool.dg], which an installed (non-editable) package has no copy of, and it would pick up whatever a defs
module happens to import at module level."""

import dagster as dg

from .defs.assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
from .defs.jobs import lookup_job, pack_job, shard_job
from .defs.partitions import register_on_load
from .defs.resources import settings_from_env, summary_io_manager
from .defs.sensors import new_shard_sensor, replan_sensor

settings = settings_from_env()
register_on_load(settings.to_settings())  # any shard in the input: a partition from the first command on

defs = dg.Definitions(
    assets=[manifest, token_lengths, pack_plan, packed_shards, audit_report],
    jobs=[shard_job, pack_job, lookup_job],
    sensors=[new_shard_sensor, replan_sensor],
    resources={"settings": settings, "io_manager": summary_io_manager},
    # every job's steps in its run's process, as shard_job's and pack_job's are: a process per step pays
    # Dagster's imports each time (`dagster asset materialize`: docs/benchmarks.md, bench_materialize.py)
    executor=dg.in_process_executor,
)
