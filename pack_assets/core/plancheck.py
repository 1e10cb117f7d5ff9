"""The stored plan's own invariants, checked before anything is written (`check_plan`) and shared with a
blend's check (`pack_checks`): every ok sample in exactly one pack, dropped or split; each pack's capacity,
media type, caps, context-parallel padding and groups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import store
from .cpad import check_padded
from .groups import check_groups
from .incremental import related
from .settings import PlanConfig
from .split import plan_checks


@contextlib.contextmanager
def _samples_snapshot(con, name: str = "plan_check_samples") -> Iterator[str]:
    """The samples view's status and media type per sample as a temporary table for the block (the view joins
    manifest and token_lengths over every Parquet file: a check reading it often reads this once), then dropped."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT sample_id, status, media_type FROM samples")
    try:
        yield name
    finally:
        con.execute(f"DROP TABLE IF EXISTS {name}")


def check_plan(con, config: PlanConfig, since: int | None = None, changed: list[str] | None = None) -> list[dict]:
    """Invariants of the stored plan itself, before anything is written: every ok sample in exactly one pack
    or in ``dropped``, one media type per pack, capacity (after padding) and caps held. (A blend's plan holds
    each sample as many times as its draw says: `blend.check_blend` checks it instead.) ``since``: the first
    pack number an append added to a stored plan that passed this check (core/incremental.py), none of whose
    samples changed since: only the new packs' own limits and samples are checked, with the whole plan's counts;
    ``changed`` (given ``since``): the shards whose rows are not those the stored plan's check read
    (`incremental.changed_shards`; None: unknown, every shard), the only ones where an ok sample may be lost."""
    if since is not None:
        return _found(_appended_checks(con, config, since, changed))
    # the samples view read once, not three times (it was half of the check's time at 1M samples)
    with _samples_snapshot(con) as samples:
        ok, members, distinct, dropped, both, lost = con.execute(
            f"""SELECT
                 (SELECT count(*) FROM {samples} WHERE status = 'ok'),
                 (SELECT count(*) FROM pack_members),
                 (SELECT count(DISTINCT sample_id) FROM pack_members),
                 (SELECT count(*) FROM dropped),
                 (SELECT count(*) FROM (SELECT sample_id FROM pack_members INTERSECT SELECT sample_id FROM dropped)),
                 (SELECT count(*) FROM {samples} WHERE status = 'ok'
                    AND sample_id NOT IN (SELECT sample_id FROM pack_members)
                    AND sample_id NOT IN (SELECT sample_id FROM dropped)
                    AND sample_id NOT IN (SELECT sample_id FROM split_pieces))""").fetchone()
        found = [("duplicate_sample", members != distinct, f"{members - distinct} sample(s) in more than one pack"),
                 ("packed_and_dropped", both, f"{both} sample(s) both packed and dropped"),
                 ("lost_sample", lost, f"{lost} ok sample(s) neither packed nor dropped nor split")]
        found += pack_checks(con, config, samples=samples) + plan_checks(con)
    return _found(found)


def _found(found: list[tuple[str, int, str]]) -> list[dict]:
    return [{"check": check, "detail": detail} for check, bad, detail in found if bad]


_NEW = "CAST(substr({of}pack_id, 2) AS BIGINT) >= {since}"  # an appended pack's (pack ids p<number>)
# the samples view's rows of the given shards ($1): each sample's manifest row joined with its token_lengths rows,
# which are in the files of the shards that may hold its id ($2: `incremental.related`)
_SAMPLES_IN = f"""(SELECT sample_id, {store.SAMPLE_STATUS} AS status
    FROM (SELECT sample_id, status FROM manifest_samples WHERE list_contains($1::VARCHAR[], shard)) s
    LEFT JOIN (SELECT sample_id, status FROM token_lengths WHERE list_contains($2::VARCHAR[], shard)) t
    USING (sample_id))"""


def _of(table: str, changed: list[str] | None) -> str:
    """``table``'s rows, or with ``changed`` only those whose sample id is of those shards' (<shard>/<key>: the
    only rows a sample of theirs can match)."""
    return table if changed is None else (f"(SELECT x.* FROM {table} x JOIN (SELECT unnest($1::VARCHAR[]) || '/' "
                                          "AS prefix) ON starts_with(x.sample_id, prefix))")


def _appended_checks(con, config: PlanConfig, since: int, changed: list[str] | None = None
                     ) -> list[tuple[str, int, str]]:
    """`check_plan` after an append: the stored packs passed it and none of their samples changed, so a sample
    in two packs or packed and dropped is one of the new packs'. An ok sample lost is looked for in the
    ``changed`` shards (every shard when None): each ok sample of another shard is one the stored plan's check
    found packed or dropped (its manifest and token_lengths files are those that check read: sample ids are
    ``<shard>/<key>``, so its rows are in its own shard's files or in those of `incremental.related` shards),
    and the stored rows stay."""
    new = _NEW.format(of="", since=int(since))
    twice, both, lost = con.execute(
        f"""SELECT
             (SELECT count(*) FROM pack_members n JOIN pack_members o USING (sample_id)
                WHERE {_NEW.format(of="n.", since=int(since))}
                  AND (o.pack_id <> n.pack_id OR o.position <> n.position)),
             (SELECT count(*) FROM (SELECT sample_id FROM pack_members INTERSECT SELECT sample_id FROM dropped)),
             (SELECT count(*) FROM {"samples" if changed is None else _SAMPLES_IN} WHERE status = 'ok'
                AND sample_id NOT IN (SELECT sample_id FROM {_of("pack_members", changed)})
                AND sample_id NOT IN (SELECT sample_id FROM {_of("dropped", changed)})
                AND sample_id NOT IN (SELECT sample_id FROM {_of("split_pieces", changed)}))""",
        [] if changed is None else [changed, related(changed, [r[0] for r in con.execute(
            "SELECT shard FROM catalog_shards").fetchall()])]).fetchone()
    found = [("duplicate_sample", twice, f"{twice} new pack member(s) also in another pack or place"),
             ("packed_and_dropped", both, f"{both} sample(s) both packed and dropped"),
             ("lost_sample", lost, f"{lost} ok sample(s) neither packed nor dropped nor split")]
    return found + pack_checks(con, config, samples="manifest_samples", where=new) + plan_checks(con)


def pack_checks(con, config: PlanConfig, samples: str = "samples", where: str = "true") -> list[tuple[str, int, str]]:
    """(check, how many bad, detail) of every pack's own limits: capacity after padding, one media type (with
    pack_per_media_type), caps.
    ``samples``: a table or view with each sample's media type (the catalog's view by default). ``where``: the
    packs looked at (SQL of ``pack_id``; every pack by default)."""
    pad = config.pad_multiple
    over, mixed = con.execute(
        f"""SELECT
             (SELECT count(*) FROM pack_plan
                WHERE {where} AND ceil(total_token_len / ?) * ? > ? AND NOT (overlong AND len(sample_ids) = 1)),
             (SELECT count(*) FROM (SELECT pm.pack_id FROM pack_members pm JOIN {samples} s USING (sample_id)
                WHERE {where} GROUP BY pm.pack_id HAVING count(DISTINCT s.media_type) > 1))""",
        [pad, pad, config.max_len],
    ).fetchone()
    found = [("over_capacity", over, f"{over} pack(s) over {config.max_len} tokens")]
    if config.pack_per_media_type:  # mixing is what pack_per_media_type: false asks for
        found.append(("mixed_media", mixed, f"{mixed} pack(s) mix media types"))
    found += check_padded(con, config) + check_groups(con, config.group_size, samples)
    cap = config.max_samples_per_pack
    if cap:
        over_cap = con.execute(f"SELECT count(*) FROM pack_plan WHERE {where} AND len(sample_ids) > ?",
                               [cap]).fetchone()[0]
        found.append(("over_cap", over_cap, f"packs over {cap} samples"))
    return found
