import dagster as dg

# one partition per source shard: the shard path under the input root, without ".tar"
source_shards = dg.DynamicPartitionsDefinition(name="source_shards")
