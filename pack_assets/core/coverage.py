"""Which shards of the input a plan covers, read from the input itself, not from the shards registered in
Dagster: a shard dropped into the input and never registered, one still waiting for its counts, or one
changed since it was scanned is not counted, so the audit's verdict is INCOMPLETE and names it; and a plan
names the shards that left the input since the previous plan even when their partition is already gone.

The plan records where its input is (`input_stats`), so the audit, `pack-assets verify` included, lists the
same folders the run did."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from . import store

Sources = Path | Mapping[str, Path]  # an input folder, or a recipe's roots (dataset name -> folder)


def tar_exists(sources: Sources, shard: str) -> bool:
    try:
        return store.source_tar(sources, shard).is_file()
    except KeyError:  # a key of no dataset of the recipe (switched on, or a dataset dropped): gone
        return False


def input_stats(sources: Sources | None, recursive: bool) -> dict:
    """What a plan records of its input (in its stats, `input`): the folder or the recipe's folders, and
    whether shards in subfolders count. Nothing without an input (a plan made from a library call)."""
    if sources is None:
        return {}
    roots = ({name: str(Path(p).resolve()) for name, p in sorted(sources.items())} if isinstance(sources, Mapping)
             else str(Path(sources).resolve()))
    return {"input": {"roots": roots, "recursive": recursive}}


def not_counted(con, plan_stats: dict, planned: Iterable[str]) -> list[str]:
    """The shards in the plan's input now that the plan (its catalog: `con`) did not count as they are: not
    planned (never registered, or waiting for counts), or changed (size or mtime) since the scan it planned.
    Without a recorded input, the plan's own waiting shards."""
    waiting = set(plan_stats.get("shards_waiting") or [])
    where = plan_stats.get("input")
    if not where:
        return sorted(waiting)
    roots = where["roots"]
    found = store.stat_shards(roots if isinstance(roots, Mapping) else Path(roots), where["recursive"])
    planned = set(planned)
    scanned = {r[0]: (r[1], r[2]) for r in con.execute("SELECT shard, size, mtime_ns FROM shards").fetchall()}
    return sorted(waiting | {k for k, stat in found.items() if k not in planned or scanned.get(k) != stat})


def left_since(con, removed: list[str], sources: Sources | None) -> list[str]:
    """`removed` (registered shards whose tar is gone) and the previous plan's shards whose tar is gone: a
    shard that left is named by the next plan even when its partition was deleted before it ran."""
    if sources is None or not store.has_plan(con):
        return removed
    before = store.read_plan_info(con).get("shards") or []
    return sorted(set(removed) | {s for s in before if not tar_exists(sources, s)})
