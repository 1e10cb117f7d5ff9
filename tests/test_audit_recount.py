"""The audit's sampled recount (core/recount.py) reads only the picked samples' rows, the rows its one query read
before, in sample id order by construction."""

from __future__ import annotations

import json

import duckdb

from pack_assets.core import recount

N = 4_000
TEXT = "a tiny sample of words " * 40  # ~900 bytes of conversation, as the 10M set's


def _catalog(con: duckdb.DuckDBPyConnection) -> None:
    """The tables the recount reads: N text samples of one member each, in packs of 50 in one output shard."""
    conv = json.dumps([{"role": "user", "content": TEXT}, {"role": "assistant", "content": "ok"}])
    con.execute(f"""CREATE TABLE manifest_samples AS SELECT 'src-' || lpad(i::VARCHAR, 6, '0') || '/k' || i
                    AS sample_id, 'text' AS media_type, 'k' || i || '.json' AS json_member,
                    []::VARCHAR[] AS media_members, []::VARCHAR[] AS extra_members, NULL::INTEGER[][] AS image_sizes,
                    CASE WHEN i % 7 = 0 THEN '[]' END AS videos, '{conv}' || i AS conversation FROM range({N}) t(i)""")
    con.execute("CREATE VIEW samples AS SELECT * FROM manifest_samples")
    con.execute("CREATE TABLE token_lengths AS SELECT sample_id, 40 + hash(sample_id) % 90 AS total_tokens, "
                "0 AS n_images, 0 AS n_videos, 0 AS vision_tokens, 'ok' AS status FROM manifest_samples")
    con.execute("CREATE TABLE members AS SELECT sample_id, json_member AS name, sha256(conversation) AS sha256, "
                "len(conversation) AS size FROM manifest_samples")
    con.execute("CREATE TABLE pack_members AS SELECT 'p' || lpad((row_number() OVER (ORDER BY sample_id) // 50)"
                "::VARCHAR, 5, '0') AS pack_id, sample_id FROM manifest_samples")
    con.execute("CREATE TABLE pack_plan AS SELECT pack_id, 'o-0.tar' AS output_shard, 'text' AS media_type, "
                "list(sample_id ORDER BY sample_id) AS sample_ids, list(total_tokens ORDER BY sample_id) AS "
                "sample_token_lens, sum(total_tokens) AS total_token_len, false AS overlong FROM pack_members "
                "JOIN token_lengths USING (sample_id) GROUP BY pack_id")
    con.execute("CREATE TABLE split_pieces (piece_id VARCHAR, sample_id VARCHAR, total_tokens BIGINT, n_media INTEGER, "
                "vision_tokens BIGINT, conversation VARCHAR, media_members VARCHAR[], extra_members VARCHAR[])")


# the recount's one query before (core/recount.py): every sample's conversation read to pick a few of them
_ONE_QUERY = """SELECT s.sample_id, s.conversation, s.image_sizes, s.videos, t.total_tokens FROM samples s
    JOIN token_lengths t USING (sample_id) WHERE t.status = 'ok' AND (hash(s.sample_id) % 4294967296) < ?
    AND s.sample_id NOT IN (SELECT pm.sample_id FROM pack_members pm JOIN pack_plan p USING (pack_id)
    WHERE p.output_shard IN (SELECT unnest(?::VARCHAR[])))"""


def test_the_recount_reads_the_rows_the_one_query_read_in_sample_id_order():
    """Ids first, then only their rows: the rows the one query gave, now in sample id order by construction
    (ORDER BY in both reads), so its violations come in that order whatever DuckDB's plan."""
    con = duckdb.connect()
    _catalog(con)
    for fraction, trusted in ((0.05, frozenset()), (0.5, frozenset()), (1.0, frozenset({"o-0.tar"}))):
        stored = recount.picked(con, fraction, trusted)
        ids = [sid for sid, _ in stored]
        picked = recount.picked_rows(con, ids)
        rows = [(*r.values(), total) for (_, total), r in zip(stored, picked.to_pylist())]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert rows == sorted(con.execute(_ONE_QUERY, [int(fraction * 2**32), sorted(trusted)]).fetchall())
        assert (len(rows) == 0) == (fraction == 1.0)
