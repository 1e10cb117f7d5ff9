"""`pack-assets run` and `demo` after their settings are built and checked: the one path a run takes
(runner/__init__.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..core.filedigest import BESIDE_IMPORT, EarlyDigests
from ..core.safety import work_lock
from ..core.settings import Settings
from ..events import listening
from . import shardwork
from .procs import Helpers
from .progress import StageBars
from .runenv import ensure_dagster_yaml


def run(settings: Settings, shards: list[str], home: Path, command: str = "run", force: bool = False, jobs: int = 0,
        started: float | None = None) -> dict:
    """The whole pipeline over ``shards`` (the input's, as `core.preflight` found them) with the Dagster
    instance at ``home``; returns `orchestrate.run_pipeline`'s summary. ``started``: when the command's wall
    time counts from. Progress on stderr when it is a terminal."""
    bars = StageBars()
    with work_lock(settings.work, f"pack-assets {command}"):  # a second run on this work folder refuses
        work = shardwork.find(settings, force=force, shards=shards)
        # helper processes: scanners forked now, which scan and count the shards while Dagster is imported
        # below and then end; side helpers (from a fork server), which simulate the what-if sweep, recount the
        # audit's samples and draw the report's figures
        with (Helpers(shardwork.helpers_for(work, jobs), scan=bool(work.todo)) as helpers,
              EarlyDigests() as early):
            shardwork.start(work, settings, helpers, force=force)
            # the output shards an incremental plan keeps, read for the audit's digests from now on: the disk's
            # part of a rerun, beside Dagster's import and the plan's and the writer's CPU
            early.start_for(settings, *BESIDE_IMPORT)
            if ensure_dagster_yaml(home):
                print(f"new Dagster home {home}: wrote dagster.yaml (telemetry off, concurrency pools)",
                      file=sys.stderr)
            bars.line(f"start-up: {len(work.shards)} shard(s), {len(work.todo)} to scan and count"
                      f"{f', {work.jobs} helper process(es) started' if work.running else ''}; loading Dagster")
            from .orchestrate import instance_for, run_pipeline  # Dagster's import: the helpers work meanwhile

            instance = instance_for(home)
            try:
                with listening(bars):
                    return run_pipeline(settings, instance, force=force, started=started, work=work,
                                        pool=helpers.pool, early=early)
            finally:
                bars.close()
