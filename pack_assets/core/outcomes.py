"""What became of each source sample, as the audit reads it back: packed, dropped, rejected, or split into
pieces (core/split.py), per source shard; and what the audit expects of the pieces an output shard holds."""

from __future__ import annotations

import duckdb

from . import store

# the pieces an output shard holds and their source's members, in the audit's `samples` / `members` shapes:
# (total tokens, media type, media count, vision tokens, record member, conversation, media members, extra members)
AUDIT_PIECE_ROWS = {
    "pieces": """SELECT p.output_shard, sp.piece_id, sp.total_tokens, s.media_type, sp.n_media, sp.vision_tokens,
                        s.json_member, sp.conversation, sp.media_members, sp.extra_members
                 FROM pack_plan p JOIN pack_members pm USING (pack_id)
                 JOIN split_pieces sp ON sp.piece_id = pm.sample_id JOIN samples s ON s.sample_id = sp.sample_id
                 WHERE {shards}""",
    "piece_members": """SELECT p.output_shard, sp.piece_id, m.name, m.sha256, m.size
                        FROM pack_plan p JOIN pack_members pm USING (pack_id)
                        JOIN split_pieces sp ON sp.piece_id = pm.sample_id JOIN members m ON m.sample_id = sp.sample_id
                        WHERE {shards}""",
}


def piece_expectations(con, name: str, rows: store.Staged | None = None) -> tuple[dict, dict]:
    """The pieces of one output shard as the audit's ``samples`` rows (keyed by piece id), and their source's
    members keyed by (piece id, member name)."""
    samples = {r[0]: tuple(r[1:]) for r in store.shard_rows(con, AUDIT_PIECE_ROWS, "pieces", name, rows)}
    members = {(r[0], r[1]): (r[2], r[3]) for r in store.shard_rows(con, AUDIT_PIECE_ROWS, "piece_members", name, rows)}
    return samples, members


def per_shard(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Per source shard, from what was read back (audit_seen): samples read, packed, dropped, rejected, split
    (every piece read back in a pack) and the pieces those became."""
    return {r[0]: {"read": r[1], "packed": r[2], "dropped": r[3], "rejected": r[4], "split": r[5], "pieces": r[6]}
            for r in con.execute(
        """WITH pieces AS (SELECT sp.sample_id, count(*) AS n,
                                  count(*) FILTER (WHERE pm.pack_id IN (SELECT pack_id FROM audit_seen)) AS seen
                           FROM split_pieces sp LEFT JOIN pack_members pm ON pm.sample_id = sp.piece_id GROUP BY 1)
           SELECT s.shard, count(*),
                  count(*) FILTER (WHERE pm.sample_id IS NOT NULL AND pm.pack_id IN (SELECT pack_id FROM audit_seen)),
                  count(*) FILTER (WHERE d.sample_id IS NOT NULL),
                  count(*) FILTER (WHERE s.status = 'rejected'),
                  count(*) FILTER (WHERE pc.n = pc.seen), coalesce(sum(pc.seen) FILTER (WHERE pc.n = pc.seen), 0)
           FROM samples s LEFT JOIN pack_members pm USING (sample_id) LEFT JOIN dropped d USING (sample_id)
           LEFT JOIN pieces pc USING (sample_id)
           GROUP BY 1 ORDER BY 1""").fetchall()}
