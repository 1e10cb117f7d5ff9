"""How `pack-assets run` (and `demo`) runs the pipeline: one path, in the order a run takes it.

1. `command.run`: takes the work folder's lock, finds the shards that need scanning and counting
   (`shardwork.find`) and forks the command's scanners (`procs.Helpers`) before Dagster is imported; they
   scan and count those shards with the stages' own core calls (`shardwork.start`) while this process
   imports Dagster and loads the instance (`runenv`), and end once the shards are done.
2. `orchestrate.run_pipeline`: registers the shards as partitions, then one Dagster run per range of
   partitions records what the helpers wrote (each shard step finds its files current), and the last such run
   goes on with the pack assets (plan, write, audit), built with the side helpers (`defs.assets.
   pack_stage_assets(pool)`: one process per task, from a fork server) so the what-if sweep, the audit's
   recount and its figures run beside them.
3. Progress: the assets emit typed events (`pack_assets.events`); `progress.StageBars` shows them on a
   terminal. The summary comes from the stages' own results.

Nothing here is needed under `dagster dev`: there the same assets run in Dagster's own processes, their
side work in line. docs/architecture.md tells why this path is faster than plain Dagster execution.
"""
