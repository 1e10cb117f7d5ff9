"""packed_shards in copy mode (the default): every planned output shard written with its media (`shard.py`),
in a process pool when there are several (in each job a thread fsyncs a shard while the next is prepared), or
found current and left as it is (the writer's record, else the fingerprint query); then the folder's Energon and
wids metadata and the writer's record."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from .. import faults, owned, store
from ..handback import hand_back
from ..nogc import no_cyclic_gc
from ..plan import PlanInfo
from . import batches
from .bulk import STAGED_BATCHES, BulkShard, build_shard, bulk_rows, group_tables, table_columns
from .energon import IndexRows, LastIndex
from .fingerprints import current_shards
from .jobs import WRITE_ROWS, ShardJob, ShardResult, piece_shards, shard_job
from .record import (
    last_index,
    left_as_written,
    load_record,
    record_written,
    shard_digests,
    vouchable,
    vouched_shards,
    written_key,
)
from .shard import begin_shard, end_shard, write_shard
from .shared import OutputFolder, Progress, WriteSummary, check_roots, check_sources, planned_shards, write_context
from .space import OUTPUT, refuse_if_full, still_needed

GROUP_SAMPLES = 16384  # samples a writer's job prepares from one read of the catalog (their rows held at once)


def writer_workers(workers: int, shards: int) -> int:
    """The writer processes: ``workers``, else one per core, at most one per shard."""
    return workers or min(os.cpu_count() or 1, max(1, shards))


def writer_groups(names: list, workers: int, samples: Mapping[str, int] | None = None) -> list[list]:
    """The writer's jobs: runs of consecutive shards (in order), each prepared with one catalog connection and one
    read of each query, of at most GROUP_SAMPLES samples (a larger shard alone) and, with a pool, of at most a
    share of the samples that gives each process two jobs, so the processes finish together. Without
    ``samples`` (per shard, of those of names: jobs already gathered), one shard a job."""
    if not samples:
        return [[n] for n in names]
    total = sum(samples[n] for n in names)
    cap = GROUP_SAMPLES if workers <= 1 else min(GROUP_SAMPLES, -(-total // (2 * workers)))
    groups: list[list] = []
    held = 0
    for n in names:
        if groups and held + samples[n] <= cap:
            groups[-1].append(n)
            held += samples[n]
        else:
            groups.append([n])
            held = samples[n]
    return groups


def shard_samples(con) -> dict[str, int]:
    """The plan's samples (and pieces) per output shard."""
    return dict(con.execute("SELECT p.output_shard, count(*) FROM pack_plan p JOIN pack_members pm USING (pack_id) "
                            "GROUP BY 1").fetchall())


def _write_group(args) -> list[ShardResult]:
    """write_shard of each shard of one job; ``loader`` (names -> the shards prepared, one by one, from one
    connection) where the job holds names. Without the cyclic garbage collector meanwhile: a job makes a few
    objects per member and no cycle, and the collector's passes over them cost time for nothing
    (docs/benchmarks.md)."""
    out_dir, group, context, loader = args
    with no_cyclic_gc(), contextlib.closing(loader(group) if loader else (j for j in group)) as prepared:
        if len(group) <= 1:
            return [write_shard(out_dir, job, context) for job in prepared]
        return _overlapped(out_dir, prepared, context)


def _overlapped(out_dir: str, prepared: Iterator, context: dict) -> list[ShardResult]:
    """Each prepared shard written in this thread, in order, its fsync and rename in a thread while this one
    prepares the next: the fsync releases the GIL for as long as the disk takes. (A thread that wrote the whole
    shard would wait for the GIL after each of its reads and writes while this one prepared: no faster, more
    CPU.) A shard's first byte is written once the one before is in place: nothing is written after a shard
    fails, and one shard is prepared ahead at most."""
    results: list[ShardResult] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-sync") as thread:
        pending = None
        for job in prepared:
            if pending is not None:
                results.append(pending.result())
            pending = thread.submit(end_shard, begin_shard(out_dir, job, context))
        if pending is not None:
            results.append(pending.result())
    return results


def _each_written(args: list[tuple], workers: int) -> Iterator[ShardResult]:
    """The results of each job, in order: in this process, or in a pool of ``workers`` processes."""
    if workers <= 1 or len(args) <= 1:
        for a in args:
            yield from _write_group(a)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for results in pool.map(_write_group, args):
            yield from results


def _load(work: str, root, rows, piece_rows, context: dict, split: frozenset,
          group: list[str]) -> Iterator[BulkShard | batches.StreamShard | ShardJob]:
    """Picklable loader: a job's shards, from one read-only connection: those of whole samples prepared in bulk
    from one read of the catalog for all of them, and written a batch of packs at a time (`batches.py`); one
    holding a piece of a split sample as a job (its pieces' conversations and `_meta` come from split_pieces,
    which the bulk queries do not read)."""
    root = root if isinstance(root, dict) else Path(root)
    # the last job's freed memory back to the system (Arrow's pool and glibc keep it for reuse, but this job's
    # DuckDB and Python objects do not all come from them, so it stayed on top of them; docs/benchmarks.md, issue 41)
    hand_back()
    with store.connect(Path(work), read_only=True) as con:
        bulk = _job_tables(con, [n for n in group if n not in split], rows)
        for name in group:
            if name in split:
                yield shard_job(con, root, name, piece_rows)
            else:  # (its tables not held here while it is written: the shard frees them as it goes)
                yield _prepared(next(bulk), root, context)


def _prepared(tables: tuple, root, context: dict) -> BulkShard | batches.StreamShard:
    """`bulk.group_tables`' (name, samples, members, conversations) of one shard: prepared whole when it is one
    batch (no Arrow slicing per batch: the same bytes, as test_write_batches checks), else streamed."""
    name, samples, members, conversations = tables
    if samples is None or samples.num_rows <= batches.BATCH_SAMPLES:
        return build_shard(name, table_columns(root, name, samples, members, conversations), context)
    return batches.StreamShard(name, root, samples, members, conversations, context)


def write_all(out_dir: Path, jobs: list[ShardJob] | list[str], context: dict, workers: int = 0,
              progress: Progress | None = None, loader=None, done: list[ShardResult] | None = None,
              plan_fingerprint: str = "", last: LastIndex | None = None,
              samples: Mapping[str, int] | None = None,
              unchanged: Callable[[str], bool] = lambda name: False) -> list[ShardResult]:
    """Write every shard (a process pool when there are several), remove stale ones, write Energon metadata
    (its index uuid named after ``plan_fingerprint``). ``done``: results of shards the caller already found
    current; they are kept, not rewritten. ``last``: the index the last write left, whose rows of those
    still hold. ``samples``: per shard name, its samples (`writer_groups`). ``unchanged``: whether a shard on
    disk is as the writer left it (`record.left_as_written`: not read to tell whose it is)."""
    names = sorted({r.shard for r in done or []} | {j if isinstance(j, str) else j.name for j in jobs})
    folder = OutputFolder(out_dir, owned.planned_files(names), unchanged)
    workers = writer_workers(workers, len(jobs))
    args = [(str(out_dir), g, context, loader) for g in writer_groups(jobs, workers, samples)]
    results: list[ShardResult] = list(done or [])
    total = len(results) + len(jobs)
    for i, r in enumerate(results, 1):
        if progress:
            progress(r, i, total)
    # the Energon index's rows made as the shards come (from a pool, while it writes the next ones), not all after
    with IndexRows(out_dir, names, last) as rows, contextlib.closing(_each_written(args, workers)) as written:
        for r in written:
            if r.index is not None:
                rows.add(r.shard, r.index)
            results.append(replace(r, index=None))  # the index is in: not kept past here
            if progress:
                progress(r, len(results), total)
        meta = folder.metadata(sorted(r.shard for r in results), plan_fingerprint or context["config_fingerprint"],
                               built=rows)
    folder.finish(meta, results)
    return results


@contextlib.contextmanager
def _digests(con, record: dict | None, aside: bool) -> Iterator[Future | None]:
    """With ``aside``: `shard_digests` in a thread, on a cursor of ``con`` (DuckDB runs it without the GIL, on
    the core the write leaves to the disk), joined when the block ends; else None."""
    if not aside:
        yield None
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="digests") as thread:
        yield thread.submit(shard_digests, con.cursor(), record)


def _found(con, work: Path, out_dir: Path, names: list[str], context: dict,
           digests: dict) -> tuple[list[ShardResult], set[str], dict[str, int]]:
    """The planned shards found current on disk (vouched for by the writer's record, else by their fingerprint),
    those holding a piece of a split sample, and each shard's samples (`shard_samples`)."""
    done, refuted = vouched_shards(work, out_dir, context, digests)
    # neither the catalog digest nor the fingerprint query covers the pieces of split samples: a shard
    # that holds one is not vouched for, recorded or found current here (current_shards leaves it out);
    # write_shard compares its fingerprint, built from the pieces, with the one on disk
    pieces = piece_shards(con)
    samples = shard_samples(con)
    done = [r for r in done if r.shard not in pieces]
    # the rest of what is on disk (not as the writer left it, or no record of it) by its fingerprint
    done += current_shards(con, out_dir, context, only=set(names) - {r.shard for r in done} - refuted)
    return done, pieces, samples


@dataclass(frozen=True)
class _Ahead:
    """One job's catalog rows, read in a thread (`_read_ahead`): `bulk.group_tables`' tuples for ``group``."""
    group: list[str]
    tables: Future


def _read_ahead(stack: contextlib.ExitStack, keep, whole: list[list[str]]) -> _Ahead | None:
    """Where this process writes one job of whole samples (unstaged, ``keep`` open): its catalog rows read in a
    thread, on a cursor of ``keep``, while the stage's checks and the output folder's claim run in this one
    (DuckDB reads them without the GIL, and on one core at a time: docs/benchmarks.md, issue 41); else None.
    The thread is joined when ``stack`` closes."""
    if keep is None or len(whole) != 1:
        return None
    thread = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog-rows"))

    def read() -> list[tuple]:
        with keep.cursor() as cur:
            return list(group_tables(cur, whole[0]))
    return _Ahead(whole[0], thread.submit(read))


def _job_tables(con, names: list[str], rows) -> Iterator[tuple]:
    """`bulk.group_tables` of a job's shards of whole samples: read ahead (``rows`` an _Ahead of them: each
    shard's tables let go of as it is given), else read now, from the staged rows or by the queries."""
    if isinstance(rows, _Ahead) and rows.group == names:
        tables = rows.tables.result()
        while tables:
            yield tables.pop(0)
        return
    yield from group_tables(con, names, None if isinstance(rows, _Ahead) else rows)


@faults.names_full_disk({"out_dir": OUTPUT, **faults.WORK}, still_needed)
def run_write(work: Path, input_root: Path, out_dir: Path, workers: int = 0,
              progress: Progress | None = None) -> WriteSummary:
    """The stage in copy mode: every planned output shard written or found current. ``input_root``: the
    input folder, or a recipe's roots (dataset name -> folder) for one of its epochs."""
    t0 = time.perf_counter()
    check_roots(input_root, work, out_dir)
    with contextlib.ExitStack() as stack:
        with store.connect(work, read_only=True) as con:
            info = PlanInfo.load(con)
            names = planned_shards(con)
            context = write_context(info)
            record = load_record(work)
            # the catalog digests decide now only where the record could vouch for a shard on disk; else (a first
            # write, an emptied folder) they are needed only for the record written at the end: computed beside
            # the write when nothing is forked from this process (`_digests`)
            now = vouchable(record, out_dir, names)
            digests, keys = shard_digests(con, record) if now else ({}, {})
            done, pieces, samples = _found(con, work, out_dir, names, context, digests)
            skip = {r.shard for r in done}
            todo = [n for n in names if n not in skip]
            split = [n for n in todo if n in pieces]
            workers = writer_workers(workers, len(todo))
            # each job's shards of whole samples in one staged file (none when one job holds them all: it queries)
            whole = [g for g in ([n for n in group if n not in pieces]
                                 for group in writer_groups(todo, workers, samples)) if g]
            # no pool (nothing forked from this process): a connection kept open across the write, so that the
            # job's own shares its DuckDB instance instead of opening the catalog again
            keep = stack.enter_context(store.connect(work, read_only=True)) if workers <= 1 else None
            ahead = _read_ahead(stack, keep, whole)  # the checks below (nothing written yet) beside the reads
            check_sources(con, input_root)
            key = written_key(con, info, context)
            last = last_index(work, out_dir, skip)
            refuse_if_full(work, out_dir, todo, con)  # before the first byte, when the plan's bytes clearly do not fit
            queries = bulk_rows(con)
            if not now and workers > 1:
                digests, keys = shard_digests(con, record)
        aside = stack.enter_context(_digests(keep, record, not now and workers <= 1))
        rows = stack.enter_context(store.staged(work, queries, sum(whole, []), groups=whole,
                                                batch_rows=STAGED_BATCHES) if len(whole) > 1
                                   else contextlib.nullcontext(ahead))
        piece_rows = stack.enter_context(store.staged(work, WRITE_ROWS, split) if len(split) > 1
                                         else contextlib.nullcontext())
        root = input_root if isinstance(input_root, dict) else str(input_root)
        loader = functools.partial(_load, str(work), root, rows, piece_rows, context, frozenset(split))
        if workers > 1:  # what the staging freed, not forked into the writers (they would share it, then copy it)
            hand_back()
        results = write_all(out_dir, todo, context, workers=workers, progress=progress, loader=loader, done=done,
                            plan_fingerprint=info.fingerprint, last=last, samples=samples,
                            unchanged=left_as_written(work, out_dir))
        if aside is not None:
            digests, keys = aside.result()
    digests = {n: d for n, d in digests.items() if n not in pieces}
    record_written(work, key, out_dir, results, context, digests, keys)
    return WriteSummary.of(out_dir, owned.planned_files(names), names, results, time.perf_counter() - t0,
                           info.fingerprint)
