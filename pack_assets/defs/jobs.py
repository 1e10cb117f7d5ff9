"""The jobs: `shard_job` and `pack_job` select assets; `lookup_job` is a plain op job that answers a
provenance question from the Launchpad and materializes nothing."""

import dagster as dg

from ..core import store
from ..core.lookup import lookup
from .assets import audit_report, manifest, pack_plan, packed_shards, token_lengths
from .resources import PackSettings

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


class LookupConfig(dg.Config):
    id: str  # a sample id (`part-00012/000345`) or a pack id (`p00000042`)


def _sources_table(found: dict) -> dg.MetadataValue:
    return dg.MetadataValue.md("| position | sample | shard | key | member | offset | size | sha256 |\n"
                               "|---:|---|---|---|---|---:|---:|---|\n" + "\n".join(
        f"| {s['position']} | {s['sample_id']} | {s['shard']} | {s['key']} | {m['name']} | {m['offset']} | "
        f"{m['size']} | `{(m['sha256'] or '')[:16]}` |" for s in found["sources"] for m in s["members"]))


@dg.op(out=dg.Out(dg.Nothing))
def lookup_provenance(context: dg.OpExecutionContext, config: LookupConfig, settings: PackSettings):
    """Where a sample went, or where a pack came from. The output metadata holds the same answer as
    `pack-assets lookup`: pack, output shard, sources, offsets and hashes."""
    with store.connect(settings.to_settings().work, read_only=True) as con:
        try:
            found = lookup(con, config.id)
        except KeyError as e:
            raise dg.Failure(description=str(e.args[0])) from None
    md = {"kind": found["kind"], "answer": dg.MetadataValue.json(found)}
    for key in ("outcome", "pack_id", "output_shard", "shard", "key", "position", "media_type", "total_token_len"):
        if key in found:
            md[key] = found[key]
    if found["kind"] == "pack":
        md["sources"] = _sources_table(found)
    context.log.info(f"{config.id}: {found.get('outcome', found['kind'])}")
    context.add_output_metadata(md)


@dg.job(description="Provenance for one sample id or pack id (set `id` in the Launchpad).")
def lookup_job():
    lookup_provenance()
