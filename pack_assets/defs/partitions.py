"""Partitions definitions shared by the assets, the sensors and the orchestration."""

import dagster as dg

# one partition per source shard: the shard path under the input root, without ".tar"
source_shards = dg.DynamicPartitionsDefinition(name="source_shards")
