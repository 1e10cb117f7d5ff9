"""The five software-defined assets. Each calls one core stage and returns its typed summary, shown as
metadata."""


import hashlib
import json
import warnings
from concurrent.futures import Executor
from pathlib import Path

import dagster as dg
import pyarrow as pa

from .. import events
from ..core import audit, blend, epochs, filedigest, plan, report, scan, write
from ..core.counting.token_lengths import run_token_counts
from ..core.results import FilePath, Markdown
from ..core.settings import Settings
from ..events import Progress
from .partitions import source_shards
from .resources import PackSettings

INGEST, PACK = "ingest", "pack"
# an asset's value is its stage's typed summary (an asset with checks would otherwise be typed Nothing)
SUMMARY = dg.Any
BACKFILL_BATCH = 16  # shards per run when a backfill covers many partitions (fewer, longer runs)
# on a shard run of `pack-assets run`: the shards its helper processes scanned and counted just before
# (runner/shardwork.py), comma-separated; the steps find them current and say whose they are
SHARD_WORKERS_TAG = "pack_assets/shard_workers"


def _by_helpers(context: dg.AssetExecutionContext) -> frozenset[str]:
    return frozenset(filter(None, context.run.tags.get(SHARD_WORKERS_TAG, "").split(",")))
# backfill_policy is relied on knowingly (tests/test_dagster.py); its beta notice, raised at every import in
# every process, is noise to users. Only that notice is silenced.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset` is currently in beta",
                        category=dg.BetaWarning)


# what the assets share: every value is the stage's typed summary; the two shard stages run per partition,
# in backfill batches, under the shard_scan pool; the three pack stages run once over every shard
SHARD_STAGE = {"partitions_def": source_shards, "group_name": INGEST, "kinds": {"python", "parquet"},
               "code_version": "1", "dagster_type": SUMMARY, "pool": "shard_scan",
               "backfill_policy": dg.BackfillPolicy.multi_run(max_partitions_per_run=BACKFILL_BATCH)}
PACK_STAGE = {"group_name": PACK, "code_version": "1", "dagster_type": SUMMARY}


def _each_shard(stage: str, total: int, count_unit: str = ""):
    """An `on_shard` callback of a shard stage: a progress event per shard (its samples, for the scan)."""
    done = iter(range(1, total + 1))
    return lambda r: events.emit(Progress(stage, next(done), total, "shard", getattr(r, "samples", 0), count_unit,
                                          r.shard))


def shards_digest(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in schema])


def metadata(values: dict) -> dict:
    """A summary's plain values as Dagster metadata: markers say markdown or path; dicts and lists are JSON;
    an Arrow schema is the table's column schema."""
    out = {}
    for key, v in values.items():
        if isinstance(v, pa.Schema):
            out[key] = dg.MetadataValue.table_schema(column_schema(v))
        elif isinstance(v, Markdown):
            out[key] = dg.MetadataValue.md(str(v))
        elif isinstance(v, (FilePath, Path)):
            out[key] = dg.MetadataValue.path(str(v))
        elif isinstance(v, (dict, list)):
            out[key] = dg.MetadataValue.json(v)
        elif isinstance(v, float):
            out[key] = dg.MetadataValue.float(v)
        else:
            out[key] = v
    return out


@dg.asset(
    **SHARD_STAGE,
    check_specs=[dg.AssetCheckSpec("every_sample_accounted", asset="manifest",
                                   description="Samples read = ok + rejected, and every rejected sample has a "
                                               "reason row.")],
)
def manifest(context: dg.AssetExecutionContext, settings: PackSettings) -> dg.MaterializeResult:
    """Scan source shards in place: every member's payload offset, size and sha256; every sample's
    conversation and media metadata; a reason row for everything rejected. One partition per shard;
    a backfill run may carry several (BackfillPolicy.multi_run)."""
    s = settings.to_settings()
    s.check_paths()
    keys = context.partition_keys
    summary = scan.run_manifests(s.sources, s.work, keys, s.scan, log=context.log.info, by_helpers=_by_helpers(context),
                                 on_shard=_each_shard(events.SCAN, len(keys), "samples"))
    return dg.MaterializeResult(
        metadata=metadata(summary.as_metadata()),
        check_results=[dg.AssetCheckResult(
            check_name="every_sample_accounted", passed=summary.accounted,
            metadata={"samples": summary.total("samples"), "ok": summary.total("ok"),
                      "rejected": summary.total("rejected"),
                      "shards_failing": [r.shard for r in summary.shards if not r.accounted]})],
        value=summary,
    )


@dg.asset(**SHARD_STAGE, deps=[manifest])
def token_lengths(context: dg.AssetExecutionContext, settings: PackSettings) -> dg.MaterializeResult:
    """Exact token counts of a shard's samples for the target model (chat template + vision rules)."""
    s = settings.to_settings()
    s.check_paths()
    profile = s.model_profile()
    keys = context.partition_keys
    summary = run_token_counts(s.work, keys, profile, log=context.log.info, by_helpers=_by_helpers(context),
                                      on_shard=_each_shard(events.COUNT, len(keys)))
    return dg.MaterializeResult(metadata=metadata(summary.as_metadata()),
                                data_version=dg.DataVersion(profile.fingerprint), value=summary)


def _planned(s: Settings, shards: list[str], pool: Executor | None):
    """The plan (a blend: one per epoch under <work>/epoch-<k>/, core/blend.py), and beside a plain plan the
    what-if sweep, started by ``pool`` from the lengths the plan reads."""
    if s.recipe:
        return blend.run_blend_plan(s.work, shards, s.plan, s.model_profile(), s.blend(), allow_missing=True,
                                    recursive=s.recursive), None
    what_if = report.WhatIfBeside(s.work, s.plan, pool)
    summary = plan.run_plan(s.work, shards, s.plan, s.model_profile(), allow_missing=True, input_root=s.input_root,
                            recursive=s.recursive, on_lengths=what_if.start)
    return summary, what_if.finish(summary.fingerprint)


def _pack_plan(pool: Executor | None, early: filedigest.EarlyDigests | None = None) -> dg.AssetsDefinition:
    @dg.asset(
        **PACK_STAGE,
        deps=[token_lengths],
        kinds={"python", "duckdb"},
        check_specs=[dg.AssetCheckSpec("every_sample_once", asset="pack_plan", blocking=True,
                                       description="Every ok sample in exactly one pack or dropped; capacity, caps "
                                                   "and one media type per pack. Blocks writing when it fails.")],
    )
    def pack_plan(context: dg.AssetExecutionContext, settings: PackSettings) -> dg.MaterializeResult:
        """Bin packing per media type near the lower bound, over every registered shard; writes
        pack_plan.jsonl and the pack_plan / pack_members / dropped tables."""
        s = settings.to_settings()
        s.check_paths()
        shards = sorted(context.instance.get_dynamic_partitions(source_shards.name))
        events.emit(Progress(events.PLAN, 0, 1, "step", len(shards), "shards"))
        with settings.work_lock(context, "pack_plan"):
            if early is not None:  # the kept output shards hashed for the audit meanwhile (more readers, if begun)
                early.start_for(s)
            summary, what_if = _planned(s, shards, pool)
        events.emit(Progress(events.PLAN, 1, 1, "step", summary.packs, "packs"))
        if summary.shards_removed:
            context.log.warning(f"{len(summary.shards_removed)} shard(s) no longer in the input since the last plan, "
                                f"not planned: {summary.shards_removed[:10]}")
        if summary.shards_waiting:
            context.log.warning(f"{len(summary.shards_waiting)} registered shard(s) not counted yet, left for the "
                                f"next plan: {summary.shards_waiting[:10]}")
        return dg.MaterializeResult(
            # replan_sensor compares the digest with the partitions now registered (a removed shard needs a replan)
            metadata=metadata({**summary.as_metadata(), **(what_if.as_metadata() if what_if else {}),
                               "registered_shards_digest": shards_digest(shards)}),
            check_results=[dg.AssetCheckResult(check_name="every_sample_once", passed=not summary.violations,
                                               metadata={"violations": dg.MetadataValue.json(summary.violations)})],
            value=summary,
        )

    return pack_plan


pack_plan = _pack_plan(None)


@dg.asset(**PACK_STAGE, deps=[pack_plan], kinds={"python", "webdataset"})
def packed_shards(context: dg.AssetExecutionContext, settings: PackSettings) -> dg.MaterializeResult:
    """One output sample per pack: full conversations, media copied by byte range (or, `output_mode: index`,
    a byte-range index into the source shards instead), `_meta` provenance, Energon metadata in .nv-meta/.
    Atomic and deterministic; a rerun skips finished shards."""

    written, kept = [0], [0]  # packs written so far (not those of output shards found current); those shards

    def progress(r, done, total):
        # a log line is an event Dagster stores (a transaction each): one per shard written, the shards found
        # current told in one line after, not one each (a rerun that adds one shard finds nearly all of them)
        if r.skipped:
            kept[0] += 1
        else:
            context.log.info(f"[{done}/{total}] {r.shard}: {r.packs} packs, {r.bytes} bytes")
        written[0] += 0 if r.skipped else r.packs
        events.emit(Progress(events.WRITE, done, total, "output shards", written[0], "packs written"))

    events.emit(Progress(events.WRITE, 0, 0, "output shards", 0, "packs written"))
    s = settings.to_settings()
    s.check_paths()
    with settings.work_lock(context, "packed_shards"):
        if s.recipe:
            summary = epochs.run_blend_write(s.work, s.blend(), s.out, s.write_workers, progress, s.output_mode)
        else:
            summary = write.writer(s.output_mode)(s.work, s.input_root, s.out, s.write_workers, progress)
    if kept[0]:
        context.log.info(f"{kept[0]} output shard(s) already there as planned, kept")
    if summary.foreign_files:
        context.log.info(f"{len(summary.foreign_files)} file(s) in {s.out} not written by pack_assets, left "
                         f"alone: {summary.foreign_files[:10]}")
    return dg.MaterializeResult(metadata=metadata(summary.as_metadata()), value=summary)


def _audit_report(pool: Executor | None, early: filedigest.EarlyDigests | None = None) -> dg.AssetsDefinition:
    @dg.asset(
        **PACK_STAGE,
        deps=[packed_shards],
        kinds={"python", "markdown"},
        check_specs=[dg.AssetCheckSpec("nothing_lost", asset="audit_report", blocking=True,
                                       description="Outputs read back: every sample once, bytes equal, caps held.")],
    )
    def audit_report(context: dg.AssetExecutionContext, settings: PackSettings) -> dg.MaterializeResult:
        """Reads the packed shards back and proves nothing was lost: counts per shard, capacity, media types,
        sha256 of every media member against its source. Writes audit_report.md with plots."""
        def progress(done: int, total: int, members: int) -> None:
            events.emit(Progress(events.AUDIT, done, total, "output shards", members, "members re-hashed"))

        events.emit(Progress(events.AUDIT, 0, 0, "output shards", 0, "members re-hashed"))
        s = settings.to_settings()
        options = {"scope": s.audit_scope, "check_samples": s.check_samples, "progress": progress, "pool": pool}
        try:
            with settings.work_lock(context, "audit_report"):
                result = (epochs.run_blend_audit(s.work, s.blend(), s.out, **options) if s.recipe
                          else audit.run_audit(s.work, s.out, **options, early=early))
        finally:
            if early is not None:
                early.close()
        return dg.MaterializeResult(
            metadata=metadata(result.as_metadata()),
            check_results=[dg.AssetCheckResult(
                check_name="nothing_lost",
                # shards of the input not counted (waiting, never registered, changed): nothing is proven about them
                passed=result.verdict == "PASS",
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"verdict": result.verdict, "violations": len(result.violations),
                          "shards_waiting": dg.MetadataValue.json(result.waiting),
                          "first_violations": dg.MetadataValue.json(
                              json.loads(json.dumps(result.violations[:20], default=str)))})],
            value=result,
        )

    return audit_report


audit_report = _audit_report(None)


def pack_stage_assets(pool: Executor | None = None,
                      early: filedigest.EarlyDigests | None = None) -> list[dg.AssetsDefinition]:
    """The three pack stages' assets. ``pool``: where their side work runs (the what-if sweep beside the plan;
    the audit's recount and figures): the command's helper processes when `pack-assets run` builds them
    (runner/orchestrate.py); none, in line, for the code location's own (above: `dagster dev`, `dg`). The three
    run in one process here, so with ``early`` an incremental plan hashes the output shards it keeps for the
    audit (`filedigest.EarlyDigests.start_for`: begun by the command before Dagster's import, joined by the plan's
    readers; closed by the caller whether or not the audit runs); the
    code location's, which may each run in a process of its own, do not."""
    return [_pack_plan(pool, early), packed_shards, _audit_report(pool, early)]
