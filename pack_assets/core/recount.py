"""The audit's sampled recount: the samples whose id hashes below a fraction counted again from their manifest rows.

The samples are picked by their ids and stored counts alone, then only the picked rows' conversations are read:
picking them from rows that carried every sample's conversation read the whole manifest's text for a small
fraction of it. Both reads are ordered by sample id, so the recount's violations come in that order whatever
DuckDB's plan (the query before had no order of its own). The picked rows go to the counting process as one
Arrow table: the command holds them until the count comes back, all through the outputs' read-back, and as
Python tuples they were about twice their text's size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Executor

import pyarrow as pa

from . import jsonform
from .aside import run_aside
from .counting.counters import counter_for
from .counting.profiles import ModelProfile, ProfileError
from .plan import PlanInfo
from .results import AuditResult

MISMATCHES_LISTED = 100  # recount mismatches listed one by one; all are counted

# the samples to recount: counted ok, id hash below the fraction, not packed in a trusted output shard
_PICKED = """SELECT s.sample_id, t.total_tokens FROM samples s JOIN token_lengths t USING (sample_id)
             WHERE t.status = 'ok' AND (hash(s.sample_id) % 4294967296) < ?
             AND s.sample_id NOT IN (SELECT pm.sample_id FROM pack_members pm JOIN pack_plan p USING (pack_id)
                                     WHERE p.output_shard IN (SELECT unnest(?::VARCHAR[])))
             ORDER BY s.sample_id"""
# what a recount reads of those samples, and of no other
_ROWS = """SELECT s.sample_id, s.conversation, s.image_sizes, s.videos FROM samples s
           WHERE s.sample_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY s.sample_id"""


def picked(con, fraction: float, trusted: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """(sample id, stored total tokens) of each sample to recount, in sample id order."""
    return con.execute(_PICKED, [int(fraction * 2**32), sorted(trusted)]).fetchall()


def picked_rows(con, ids: list[str]) -> pa.Table:
    """(sample_id, conversation, image_sizes, videos) of each of ``ids`` (sample ids in order, as `picked` gives
    them), as an Arrow table in that order."""
    table = con.sql(_ROWS, params=[ids]).to_arrow_table()
    if table.column(0).to_pylist() != ids:
        raise KeyError("the recount's picked samples are not all in the manifest: the catalog changed while it read")
    return table


def _recounted(profile: ModelProfile, rows: pa.Table) -> list[int | None]:
    """Each picked row's (`picked_rows`) total tokens, None where it cannot be counted."""
    conversations, sizes, videos = (rows.column(i).to_pylist() for i in (1, 2, 3))
    counts = counter_for(profile).count_many((jsonform.loads(c), s or [], json.loads(v or "[]"))
                                             for c, s, v in zip(conversations, sizes, videos))
    return [None if isinstance(c, Exception) else c["total_tokens"] for c in counts]


def recount(con, info: PlanInfo, fraction: float, trusted: frozenset[str] = frozenset(),
            pool: Executor | None = None) -> Callable[[AuditResult], None]:
    """Count again, from the manifest rows, the samples whose id hashes below ``fraction``, except those
    packed in the ``trusted`` output shards (same content and profile as at a clean audit whose recount
    covered at least this fraction: counting them again would give what it gave). Counted by ``pool`` (the
    command's side helpers: one that loads the tokenizer for it and then ends), else now, while the caller
    reads the outputs back; returns what records the outcome in the audit's result."""
    if fraction <= 0:
        return lambda result: None
    try:
        profile = info.model_profile()
    except ProfileError as e:
        unavailable = str(e)
        return lambda result: result.add("recount_unavailable", unavailable)
    if profile.fingerprint != info.profile_fingerprint:
        return lambda result: result.add("profile_changed",
                                         f"profile {profile.name} files changed since the plan: recount the shards")
    stored = picked(con, fraction, trusted)
    counted = run_aside(pool, _recounted, profile, picked_rows(con, [sid for sid, _ in stored]))

    def record(result: AuditResult) -> None:
        bad = 0
        for (sid, total), got in zip(stored, counted.result()):
            if got != total:
                bad += 1
                if bad <= MISMATCHES_LISTED:
                    result.add("recount_mismatch", f"{sid}: stored {total} tokens, recounted {got}", sample_id=sid)
        result.stats["recounted"] = len(stored)
        result.stats["recount_fraction"] = fraction
        result.stats["recount_skipped_shards"] = len(trusted)

    return record
