"""What an audit worker holds per output shard: at 10M tiny samples an output shard holds ~313k of them, and their
expectations held as Python rows (~2 KB a sample, each sample id copied four times) made each audit worker ~1 GB.
Held as Arrow columns (`auditread.ShardExpectations`), a shard's expectations are near their bytes, and a pack's
rows are the very rows the per-shard queries give."""

from __future__ import annotations

import gc
import json
import tracemalloc

import duckdb
import numpy as np
import pyarrow as pa

from pack_assets.core import audit as audit_mod
from pack_assets.core import recount, store
from pack_assets.core.audit import AUDIT_ROWS

N = 10_000
TEXT = "a tiny sample of words " * 40  # ~900 bytes of conversation, as the 10M set's


def _catalog(con: duckdb.DuckDBPyConnection) -> None:
    """The tables the audit's per-shard queries read: N text samples of one member each, in packs of 50 in one
    output shard (and none in another)."""
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


def _columns_bytes(obj) -> int:
    """Bytes of the Arrow and numpy columns ``obj`` holds in its attributes (outside tracemalloc's sight)."""
    found = 0
    for v in vars(obj).values() if hasattr(obj, "__dict__") else ():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, (pa.Array, pa.ChunkedArray, pa.Table)):
                found += x.get_total_buffer_size()
            elif isinstance(x, np.ndarray):
                found += x.nbytes
    return found


def test_a_shard_s_expectations_hold_near_their_bytes_and_give_the_query_s_rows():
    con = duckdb.connect()
    _catalog(con)
    raw = con.execute("SELECT sum(len(conversation) + 2 * len(json_member) + 3 * len(sample_id) + 64 + 40) "
                      "FROM manifest_samples").fetchone()[0]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        plan, *held = audit_mod._shard_expectations(con, "o-0.tar")
        gc.collect()
        python = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    total = python + sum(_columns_bytes(h) for h in held)
    # Python rows held ~2.3x these bytes (each id four times, a tuple, a dict entry and a list per sample)
    print(f"held {total / N:.0f} bytes a sample for {raw / N:.0f} of data")
    assert total < 1.5 * raw, f"{total / N:.0f} bytes a sample held for {raw / N:.0f} of data"

    (expected,) = held
    samples = {r[0]: r for r in store.shard_rows(con, AUDIT_ROWS, "samples", "o-0.tar")}
    conversations = dict(store.shard_rows(con, AUDIT_ROWS, "conversations", "o-0.tar"))
    members = {(r[0], r[1]): (r[2], r[3]) for r in store.shard_rows(con, AUDIT_ROWS, "members", "o-0.tar")}
    for key in sorted(plan)[::37]:  # a pack's rows: the query's, each sample id's and each member's
        ids = plan[key]["sample_ids"]
        got_samples, got_members = expected.pack(ids)
        for sid in ids:
            r = samples[sid]
            assert got_samples.get(sid) == (*r[1:6], conversations[sid], *r[6:])
            assert got_members.get((sid, r[5])) == members[(sid, r[5])]
        other = sorted(plan)[0] if key != sorted(plan)[0] else sorted(plan)[1]
        stray = plan[other]["sample_ids"][0]  # a sample of another pack (a misplaced one): still found
        assert got_samples.get(stray)[5] == conversations[stray]
        assert got_samples.get("nowhere", (None, None, 0, 0)) == (None, None, 0, 0)
        assert got_members.get(("nowhere", "x")) is None


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
        rows = [(sid, *r, total) for (sid, total), r in zip(stored, recount.picked_rows(con, ids))]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert rows == sorted(con.execute(_ONE_QUERY, [int(fraction * 2**32), sorted(trusted)]).fetchall())
        assert (len(rows) == 0) == (fraction == 1.0)
