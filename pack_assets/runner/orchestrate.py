"""Drive the assets through Dagster: register shard partitions, run each shard that needs work, then plan /
write / audit (as steps of the last shard run when the command's helpers did its shards, else in a run of
their own). Every run is recorded in the instance under DAGSTER_HOME. The pack assets are built with the
command's helper pool (`defs.assets.pack_stage_assets`): it is a parameter of `run_pipeline`, not a global."""

import contextlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path

import dagster as dg

from .. import events
from ..core import filedigest, store
from ..core.plan import PlanSummary
from ..core.results import AuditResult
from ..core.settings import Settings
from ..core.write import WriteSummary
from ..defs.assets import BACKFILL_BATCH as BATCH_MAX
from ..defs.assets import SHARD_WORKERS_TAG, manifest, pack_stage_assets, token_lengths
from ..defs.partitions import source_shards
from ..defs.resources import PackSettings, summary_io_manager
from . import shardwork
from .progress import ShardProgress, on_terminal
from .runenv import default_jobs, ensure_dagster_yaml, prepare_dagster_process
from .shardwork import ShardWork


def instance_for(dagster_home: Path) -> dg.DagsterInstance:
    prepare_dagster_process()
    home = dagster_home.resolve()
    ensure_dagster_yaml(home)  # without one Dagster warns on every instance load and shows its telemetry banner
    os.environ["DAGSTER_HOME"] = str(home)  # dagster requires an absolute DAGSTER_HOME
    return dg.DagsterInstance.get()


class PipelineError(RuntimeError):
    """A step failed; the message is the step's own error, not Dagster's wrapper."""


# a failed blocking check on the last asset is the audit's verdict (FAIL or INCOMPLETE), which the summary
# reports and the exit code carries, not a broken run
VERDICT_STEPS = {"audit_report"}
FAULTS = {"NoSpace", "FileFault", "NotWritable"}  # core/faults.py's errors


def _materialize(assets, **kwargs) -> dg.ExecuteInProcessResult:
    return _check(dg.materialize(assets, raise_on_error=False, **kwargs))


def _check(result: dg.ExecuteInProcessResult) -> dg.ExecuteInProcessResult:
    if not result.success:
        messages = []
        for ev in result.all_events:
            if ev.is_step_failure:
                err = ev.step_failure_data.error
                if ev.step_key in VERDICT_STEPS and err.cls_name == "DagsterAssetCheckFailedError":
                    continue
                cause = err.cause or err
                message = cause.message.strip()
                if cause.cls_name in FAULTS:  # already one line naming the folder or file: no class path before it
                    message = message.split(": ", 1)[-1]
                messages.append(f"{ev.step_key}: {message}")
        if messages or not any(ev.is_step_failure for ev in result.all_events):
            raise PipelineError("; ".join(messages) or "the run failed (see the Dagster UI)")
    return result


RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _worker_init(dagster_home: str) -> None:
    os.environ["DAGSTER_HOME"] = dagster_home
    prepare_dagster_process(worker=True)


def _resources(settings: Settings) -> dict:
    return {"settings": PackSettings.of(settings), "io_manager": summary_io_manager}


# the job name dg.materialize gives its runs: batched shard runs look like the single-shard runs did
EPHEMERAL_JOB = "__ephemeral_asset_job__"


def _shard_listener(on_shard) -> events.Listener:
    """An events listener calling on_shard(key, samples) as each shard's token counts are done (the two
    shard steps emit an event per shard: defs/assets.py)."""
    samples: dict[str, int] = {}

    def listen(e: events.Progress) -> None:
        if e.stage == events.SCAN:
            samples[e.item] = e.count
        elif e.stage == events.COUNT:
            on_shard(e.item, samples.get(e.item))
    return listen


SHARD_ASSETS = [manifest, token_lengths]


def _shards_run(keys: list[str], flat: dict, instance: dg.DagsterInstance | None = None, tags: dict | None = None,
                on_shard=None, then: list | None = None) -> dg.ExecuteInProcessResult:
    """ONE run of `manifest` + `token_lengths` over consecutive partitions `keys` (a partition range; one
    materialization per shard in the instance, under DAGSTER_HOME), followed in the same run by the
    unpartitioned assets `then` (the pack assets) when given.
    (Settings travel flat: resource objects do not pickle across processes; a worker loads its instance,
    the parent passes its own: loading another is not free.)"""
    instance = instance or dg.DagsterInstance.get()
    tags = {**(tags or {}), **({} if len(keys) == 1 else {RANGE_START: keys[0], RANGE_END: keys[-1]})}
    job = dg.Definitions(jobs=[dg.define_asset_job(EPHEMERAL_JOB)], assets=SHARD_ASSETS + (then or []),
                         resources=_resources(Settings.from_flat(flat))).resolve_job_def(EPHEMERAL_JOB)
    with events.listening(_shard_listener(on_shard) if on_shard is not None else None):
        return _check(job.execute_in_process(run_config=QUIET, instance=instance, raise_on_error=False,
                                             partition_key=keys[0] if len(keys) == 1 else None, tags=tags))


def _samples(result: dg.ExecuteInProcessResult) -> dict[str, int]:
    return {s.shard: s.samples for s in result.asset_value("manifest").shards}


def _batch_run(keys: list[str], flat: dict, on_shard=None, instance: dg.DagsterInstance | None = None,
               tags: dict | None = None) -> dict[str, int]:
    """`_shards_run` of the shard assets alone; returns each shard's sample count."""
    return _samples(_shards_run(keys, flat, instance, tags, on_shard))


def _batches(todo: list[str], order: list[str], size: int) -> list[list[str]]:
    """`todo` as runs of at most `size` shards that are consecutive partitions (a range holds no shard that
    needs no run), in partition order."""
    at = {k: i for i, k in enumerate(order)}
    batches: list[list[str]] = []
    for key in sorted(todo, key=at.__getitem__):
        last = batches[-1] if batches else None
        if last and len(last) < size and at[last[-1]] + 1 == at[key]:
            last.append(key)
        else:
            batches.append([key])
    return batches


def _sync_partitions(instance: dg.DagsterInstance, root: Path, shards: list[str], log) -> list[str]:
    """Register new shards as partitions and delete those whose tar is gone (so the plan drops their
    samples and packs); returns the removed ones."""
    known = set(instance.get_dynamic_partitions(source_shards.name))
    new = [k for k in shards if k not in known]
    if new:
        instance.add_dynamic_partitions(source_shards.name, new)
    removed = sorted(known - set(shards))
    for key in removed:
        instance.delete_dynamic_partition(source_shards.name, key)
    if removed:
        log(f"{len(removed)} shard(s) no longer in {root}, removed from the plan: {removed[:5]}"
            f"{' ...' if len(removed) > 5 else ''}")
    return removed


def _shard_runs(todo: list[str], order: list[str], jobs: int, flat: dict, progress_log,
                instance: dg.DagsterInstance | None = None, work: ShardWork | None = None,
                then_pack=None, pack_assets: list | None = None) -> dg.ExecuteInProcessResult | None:
    """Scan and count the shards of `todo`: one Dagster run per range of consecutive partitions in this
    process (--jobs 1), or ranges of a few shards each spread over `jobs` worker processes, started once.
    With `work` (the shard stages under way in the command's helper processes), each range's run follows as
    soon as the helpers are done with its shards, in this process; when they did every shard of the last
    range, its run goes on with the pack assets (one run fewer: Dagster's run set-up and events), after
    `then_pack()`, and its result is returned (else None). ``pack_assets``: those assets, built for this run."""
    with ShardProgress(len(todo), log=progress_log) as progress:
        if work is not None and work.running and todo:
            batches = _batches(todo, order, BATCH_MAX)
            for i, keys in enumerate(batches):
                by_helpers = _helpers_done(work, keys, progress, progress_log)
                last = i == len(batches) - 1
                # the last run goes on with the pack assets when its steps only record what the helpers wrote
                pack = then_pack is not None and last and len(by_helpers) == len(keys)
                if pack:
                    progress.close()
                    then_pack()
                result = _shards_run(keys, flat, instance, {SHARD_WORKERS_TAG: ",".join(sorted(by_helpers))},
                                     then=pack_assets if pack else None)
                samples = _samples(result)
                for key in keys:  # the rest were done (or, recorded late, found current) by their steps
                    if key not in by_helpers:
                        progress.update(key, samples.get(key))
            return result if pack else None
        if jobs == 1:
            for keys in _batches(todo, order, len(todo) or 1):
                _batch_run(keys, flat, on_shard=progress.update, instance=instance)
            return None
        # shard runs write only their own Parquet files, so they run side by side; a few shards per run keeps
        # the workers evenly loaded and the progress lines coming
        batches = _batches(todo, order, max(1, min(BATCH_MAX, len(todo) // (4 * jobs))))
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                                 initargs=(os.environ["DAGSTER_HOME"],)) as pool:
            futures = [pool.submit(_batch_run, keys, flat) for keys in batches]
            for fut in as_completed(futures):
                for key, samples in fut.result().items():
                    progress.update(key, samples)
        return None


def _helpers_done(work: ShardWork, keys: list[str], progress: ShardProgress, progress_log) -> list[str]:
    """Wait until the helpers are done with `keys`; the shards they did, each told to `progress` as it ends. A
    shard a helper failed on is said so, and left to its Dagster step."""
    by_helpers: list[str] = []

    def done(key: str, samples: int | None, err: BaseException | None) -> None:
        if err is None:
            by_helpers.append(key)
            progress.update(key, samples)
        else:
            (progress_log or _stderr)(f"{key}: its helper process failed ({err}); its Dagster step scans and counts it")

    work.wait(keys, done)
    return by_helpers


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _on_terminal(msg: str) -> None:
    """A progress line of the command: on stderr when it is a terminal, else nothing (progress.py)."""
    if on_terminal():
        _stderr(msg)


def run_pipeline(settings: Settings, instance: dg.DagsterInstance, log=None, force: bool = False,
                 jobs: int = 0, started: float | None = None, work: ShardWork | None = None,
                 pool: Executor | None = None, early: filedigest.EarlyDigests | None = None) -> dict:
    """Register the shards, run each that needs it, then plan → write → audit; the summary comes from the
    stages' own results. `started`: the time.perf_counter() the caller's wall time counts from (the CLI:
    process start), so the stage seconds, with start-up and other, add up to the seconds the user waited.
    `work`: the shards found and those that need work (`shardwork.find`), under way in the command's
    helper processes when `shardwork.start` gave them the shards; the shard runs then record what the
    helpers wrote. `log`: where a library caller wants plain progress lines; without one, the command's own
    progress on a terminal (nothing off one; the caller shows the pack stages: progress.StageBars). `pool`:
    where the pack stages' side work runs (`defs.assets.pack_stage_assets`): the command's side helpers
    (`procs.Helpers.pool`), or none (in line). `early`: the output shards' digests for the audit, which the
    caller may have started already (`pack-assets run`: before Dagster's import) and closes; without one, the
    run's own, started by the plan."""
    progress_log = log
    log = log or _on_terminal
    t0 = time.perf_counter() if started is None else started
    root = settings.sources  # with a recipe: every dataset's folder, shard keys `<dataset>/<shard>`
    work = work or shardwork.find(settings, force)  # no helpers: the Dagster steps scan and count
    shards, todo = work.shards, work.todo
    removed = _sync_partitions(instance, root, shards, log)
    profile = settings.model_profile()
    jobs = work.jobs if work.running else max(1, min(jobs or default_jobs(len(todo)), len(todo)))
    t_shards = time.perf_counter()
    order = list(instance.get_dynamic_partitions(source_shards.name))  # the order a partition range follows
    # a shard whose files are current but that Dagster never recorded (its command stopped between the two)
    # is recorded now: the steps find its files and attach its metadata
    known = set.intersection(*(instance.get_materialized_partitions(a.key) for a in (manifest, token_lengths)))
    known.update(todo)
    late = [k for k in shards if k not in known]
    shard_seconds = []

    def then_pack() -> None:
        shard_seconds.append(time.perf_counter() - t_shards)
        log(f"{len(todo)} shard run(s), {len(shards) - len(todo)} shard(s) unchanged"
            f"{f' ({len(late)} recorded in Dagster now)' if late else ''}; planning, writing and auditing")

    with contextlib.nullcontext(early) if early is not None else filedigest.EarlyDigests() as early:
        pack_assets = pack_stage_assets(pool, early)  # (closed even when the plan or the write fails)
        result = _shard_runs(todo + late, order, jobs, settings.flat(), progress_log, instance, work, then_pack,
                             pack_assets)
        if result is None:  # the shard runs did not go on with the pack assets
            then_pack()
            result = _materialize(pack_assets, instance=instance, resources=_resources(settings), run_config=QUIET)
    steps = _step_seconds(instance, result.run_id)
    # the shard stage: until the pack run (or the run the pack assets are in), and its shard steps
    shard_stage = shard_seconds[0] + sum(steps.pop(a.key.to_user_string(), 0) for a in SHARD_ASSETS)
    stage_seconds = {**_start_seconds(t0, t_shards, work), "manifest+token_lengths": round(shard_stage, 2), **steps}
    seconds = round(time.perf_counter() - t0, 2)
    # the rest: Dagster's run set-up and event log around the steps
    stage_seconds["other"] = round(seconds - sum(stage_seconds.values()), 2)
    helpers = ({"helpers_scan_count_seconds": round(work.ended_at - work.started_at, 2)}
               if work.running and work.ended_at is not None else {})
    plan, written, audit = (result.asset_value(a) for a in ("pack_plan", "packed_shards", "audit_report"))
    return {"input_dir": settings.recipe or str(root), "shards": len(shards), "shard_runs": len(todo),
            "shards_removed": removed,
            "jobs": jobs, **_stage_figures(settings, profile.name, plan, written, audit),
            **({"epochs": len(plan.epochs), "output_folders": [str(e.output_dir) for e in written.epochs]}
               if settings.recipe else {}),
            "dagster_home": os.environ["DAGSTER_HOME"], "seconds": seconds, "stage_seconds": stage_seconds, **helpers}


def _start_seconds(t0: float, t_shards: float, work: ShardWork) -> dict[str, float]:
    """The seconds before the shard stage, named for what they were: the command's own start (imports,
    settings, finding the shards, the helpers forked), then Dagster's import and instance (``dagster-load``)
    while the helpers scan and count. ``manifest+token_lengths`` counts from there to the plan: the rest of
    the helpers' work and the shard runs that record it (their own span: ``helpers_scan_count_seconds``)."""
    if not work.running or work.started_at is None:
        return {"start-up": round(t_shards - t0, 2)}
    forked = max(t0, work.started_at)
    return {"start-up": round(forked - t0, 2), "dagster-load": round(t_shards - forked, 2)}


def _stage_figures(settings: Settings, profile: str, plan: PlanSummary, written: WriteSummary,
                   audit: AuditResult) -> dict:
    return {
        "samples": audit.stats["samples_read"],
        "packed": audit.stats["packed"],
        "dropped": audit.stats["dropped"],
        "rejected": audit.stats["rejected"],
        "split": audit.stats.get("split", 0),
        "split_pieces": audit.stats.get("split_pieces", 0),
        "packs": plan.packs,
        "lower_bound": plan.lower_bound,
        "packs_over_bound": plan.packs_over_bound,
        "fill": plan.fill,
        "max_len": settings.plan.max_len,
        "profile": profile,
        "violations": len(audit.violations),
        "verdict": audit.verdict,
        "shards_waiting": audit.waiting,
        "output_dir": str(settings.out),
        "output_mode": settings.output_mode,
        "output_bytes": written.bytes,
        "output_shards": written.shards,
        "output_shards_written": written.written,
        "output_shards_trusted": audit.stats["output_shards_trusted"],
        "output_shards_hashed": audit.stats.get("output_shards_hashed", 0),
        "work_dir": str(settings.work),
        "plan_file": str(plan.plan_file),
        "audit_report": str(audit.report),
        # a recipe: one catalog per epoch (core/blend.py); the first is named
        "duckdb": str((settings.work / "epoch-000" if settings.recipe else settings.work) / store.DB_NAME),
    }


def _step_seconds(instance: dg.DagsterInstance, run_id: str) -> dict[str, float]:
    """Wall seconds of each step of a run, from its event log (start to success)."""
    started, took = {}, {}
    for entry in instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS}):
        if entry.dagster_event.event_type == dg.DagsterEventType.STEP_START:
            started[entry.step_key] = entry.timestamp
        elif entry.step_key in started:
            took[entry.step_key] = round(entry.timestamp - started[entry.step_key], 2)
    return took
