"""The stored plan read back for an incremental plan, and pruned of the samples that changed since.

`read_plan` reads the stored packs (Arrow batches, into a `PackTable` by `packs.from_batches`); `changed_packs`
names, by a join in DuckDB, the packs holding a sample whose ok length is not the stored one now, so that
`prune_plan` looks up only those packs' samples (`current_lengths`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import store
from .packs import PackTable

_BATCH = 1 << 17  # rows fetched at once


def changed_packs(con) -> set[str]:
    """The stored plan's packs holding a sample whose length is not its ok length in token_lengths now (gone,
    no longer ok, or recounted): found by DuckDB, so an incremental plan looks at these packs' samples only."""
    return {r[0] for r in con.execute(
        "SELECT DISTINCT pm.pack_id FROM pack_members pm JOIN pack_plan p USING (pack_id) "
        "LEFT JOIN (SELECT sample_id, total_tokens FROM token_lengths WHERE status = 'ok') t USING (sample_id) "
        "WHERE t.total_tokens IS DISTINCT FROM p.sample_token_lens[pm.position + 1]").fetchall()}


def read_plan(con) -> tuple[list[dict], pa.RecordBatchReader]:
    """The plan's dropped rows, and its pack rows in pack id order (Arrow batches: read before the next query)."""
    names = store.DROPPED_SCHEMA.names
    dropped = [dict(zip(names, r)) for r in con.execute(f"SELECT {', '.join(names)} FROM dropped ORDER BY sample_id"
                                                        ).fetchall()]
    return dropped, con.sql(f"SELECT {', '.join(store.PACK_PLAN_SCHEMA.names)} FROM pack_plan ORDER BY pack_id"
                            ).to_arrow_reader(_BATCH)


def current_lengths(con, sample_ids: list[str]) -> dict[str, int]:
    """sample id -> ok length now, for these samples (those gone or not ok have none)."""
    with store.columns_relation(con, "_asked", [sample_ids], pa.schema([("sample_id", pa.string())])) as asked:
        return dict(con.execute(f"SELECT sample_id, total_tokens FROM token_lengths WHERE status = 'ok' "
                                f"AND sample_id IN (SELECT sample_id FROM ({asked}))").fetchall())


def prune_plan(old_packs: PackTable, old_dropped: list[dict], current: dict[str, int],
               changed: set[str] | None = None) -> tuple[PackTable, list[dict], dict]:
    """The previous packs and drops without the samples that are gone (their shard removed or the sample no
    longer ok) or whose length changed (``current``: sample id -> length now). A pack keeps its id and output
    shard, its totals recomputed; a pack left empty is removed. The caller plans the changed samples anew.
    ``changed``: the only pack ids that may hold such samples (`changed_packs`; ``current`` then needs only
    their samples and the drops'), the others kept as they are."""
    sizes = old_packs.sizes()
    asked = np.ones(len(old_packs), bool) if changed is None else np.isin(old_packs.numbers, numbers(changed))
    at = np.flatnonzero(np.repeat(asked, sizes))  # the members looked at
    ids = old_packs.ids[old_packs.members[at]].tolist()
    ok = np.fromiter((current.get(sid) == n for sid, n in zip(ids, old_packs.lens[at].tolist())), bool, len(at))
    known = np.fromiter((sid in current for sid in ids), bool, len(at))
    keep = np.ones(len(old_packs.members), bool)
    keep[at] = ok
    lost = np.bincount(np.repeat(np.arange(len(old_packs)), sizes)[~keep], minlength=len(old_packs))
    touched, emptied = int((lost > 0).sum()), int(((lost == sizes) & (sizes > 0)).sum())
    gone, recounted = int((~ok & ~known).sum()), int((~ok & known).sum())
    packs = old_packs.select(keep) if touched else old_packs
    dropped = [d for d in old_dropped if current.get(d["sample_id"]) == d["total_tokens"]]
    gone += sum(d["sample_id"] not in current for d in old_dropped)
    recounted += len(old_dropped) - len(dropped) - sum(d["sample_id"] not in current for d in old_dropped)
    return packs, dropped, {"samples_gone": gone, "samples_recounted": recounted, "packs_changed": touched,
                            "packs_emptied": emptied}


def numbers(pack_ids) -> np.ndarray:
    """Pack ids ``p<number>`` as their numbers."""
    return np.asarray([int(p[1:]) for p in pack_ids], dtype=np.int64)
