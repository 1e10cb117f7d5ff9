"""The shard stages' work (scan, then count) for the shards that need it, handed to the command's helper
processes (runner/procs.py) before Dagster is imported.

`pack-assets run` spends its first seconds importing Dagster and loading the instance, on one core. The
helpers (no Dagster in them; forked from a process that has not imported it either) scan and count
meanwhile, writing exactly the files the `manifest` and `token_lengths` assets write, under the same shard
lock. The Dagster shard runs that follow find each shard current and record its materialization and checks
from those files. A shard a helper failed on is left to its Dagster step, which meets the same error and
reports it where the UI shows it: the helpers only ever save time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field

from ..core.counting.profiles import ModelProfile
from ..core.counting.token_lengths import run_token_lengths, token_lengths_are_current
from ..core.handback import hand_back
from ..core.nogc import no_cyclic_gc
from ..core.preflight import listing
from ..core.records import Scanned
from ..core.scan import manifest_is_current, run_manifest
from ..core.settings import Settings
from .procs import Helpers


def shards_to_run(settings: Settings, shards: list[str], profile: ModelProfile, force: bool = False) -> list[str]:
    """The shards whose manifest or token counts are not current (all of them with `force`)."""
    return [k for k in shards if force or manifest_is_current(settings.sources, settings.work, k) is None
            or not token_lengths_are_current(settings.work, k, profile)]


def work_shard(flat: dict, shard: str, force: bool) -> int:
    """Scan and count one shard as the two assets do (their own core calls); returns its sample count. An
    error comes back as a RuntimeError naming it: any exception crosses the process boundary (one that
    does not pickle would break every worker's result)."""
    try:
        s = Settings.from_flat(flat)
        kept = Scanned()  # the count takes the scan from memory: no read back, no second parse of the messages
        # the scan keeps the shard's samples for the count: the collector's passes would walk a heap growing with
        # the shard, again and again (the work makes no cycle: tests/test_shardwork_gc.py)
        with no_cyclic_gc():
            scanned = run_manifest(s.sources, s.work, shard, s.scan, force=force, keep=kept)
            run_token_lengths(s.work, shard, s.model_profile(), force=force, scanned=kept if kept.info else None)
            # freed while the collector is still off: once back on, its first pass would walk every object the
            # scan kept (all still in its youngest generation), for nothing
            kept.samples.clear()
        # what the shard's work freed, back to the system: a helper that has taken its last shard then waits
        # through the pack stages (the write's above all) holding ~50 MB less (docs/benchmarks.md, issue 41)
        hand_back()
        return scanned.samples
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e}") from None


@dataclass
class ShardWork:
    """Shards found, those that need work, and the helpers' futures for them (`start`)."""

    shards: list[str]
    todo: list[str]
    jobs: int = 1
    running: bool = False  # helpers were given the shards: the Dagster runs record what they wrote
    started_at: float | None = None  # time.perf_counter() when the helpers were given them
    ended_at: float | None = None  # when the last of them was done (ended or failed)
    _futures: dict[str, Future] = field(default_factory=dict)
    _end: Callable[[], None] | None = None  # ends the helpers once every shard is done (`start`)

    def _ended(self, _: Future) -> None:  # (in the pool's thread, as each ends)
        self.ended_at = time.perf_counter()

    def wait(self, keys: list[str], on_done: Callable[[str, int | None, BaseException | None], None]) -> None:
        """Block until the helpers are done with `keys`, calling on_done(key, samples, error) as each ends."""
        pending = {self._futures[k]: k for k in keys if k in self._futures}
        for fut in as_completed(pending):
            key = pending[fut]
            del self._futures[key]
            err = fut.exception()
            on_done(key, None if err else fut.result(), err)
        if not self._futures and self._end is not None:  # the last shard: its scanners are done
            self._end, end = None, self._end
            end()


def find(settings: Settings, force: bool = False, shards: list[str] | None = None) -> ShardWork:
    """The shards (`listing`, unless given) and those that need work, no helper given any: their Dagster
    steps do it."""
    shards = listing(settings) if shards is None else shards
    return ShardWork(shards, shards_to_run(settings, shards, settings.model_profile(), force))


def helpers_for(work: ShardWork, jobs: int = 0) -> int:
    """How many helper processes: `jobs`, or one per core (0), at most one per shard that needs work."""
    return max(1, min(jobs or os.cpu_count() or 1, len(work.todo) or 1))


def start(work: ShardWork, settings: Settings, helpers: Helpers, force: bool = False) -> ShardWork:
    """Hand the shards that need work to the helpers' scanners, in shard order; they end once `wait` has seen
    the last shard done (the side helpers, `helpers.pool`, then take the pack stages' side work)."""
    if work.todo:
        flat = settings.flat()
        work.started_at = time.perf_counter()
        work._futures = {k: helpers.scan.submit(work_shard, flat, k, force) for k in work.todo}
        work.jobs, work.running, work._end = helpers.n, True, helpers.end_scan
        for fut in work._futures.values():
            fut.add_done_callback(work._ended)
    return work
