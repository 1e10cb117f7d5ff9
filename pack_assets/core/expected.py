"""What the audit expects of one output shard: its plan rows, and the manifest's rows of its samples and members
(`AUDIT_ROWS`, gathered for every shard the audit reads at once by `store.staged`), each conversation known by its
digest (`packdoc.Digest`); the texts themselves are read only for a shard where a packed conversation is not the
manifest's very text (`ShardTexts`)."""

from __future__ import annotations

from . import packdoc, store
from .catalogview import source_folders, within
from .outcomes import AUDIT_PIECE_ROWS, piece_expectations

# what the audit reads per output shard besides its plan rows, gathered for every shard it reads at once
# (store.staged), so the manifest is scanned once for the whole audit (by the query per shard, it was scanned once
# per output shard)
AUDIT_ROWS = {
    # the planned samples joined to their counts first, then to the manifest's rows: each join's hash table is
    # built on the planned side (narrow), the manifest's members lists stream through; the `samples` view (its
    # status, which this does not read, from a second join of every count) and the manifest's rows as the build
    # side held 1.5x this query's memory (docs/benchmarks.md, session 51). Each conversation as its digest, not its
    # text (`packdoc.Digest`: an output shard's texts were most of what an audit worker held), in the same rows (a
    # query of its own scanned and joined the manifest a second time)
    "samples": """WITH planned AS (SELECT p.output_shard, pm.sample_id FROM pack_plan p
                                   JOIN pack_members pm USING (pack_id) WHERE {shards})
                  SELECT p.output_shard, s.sample_id, t.total_tokens, s.media_type, t.n_images + t.n_videos,
                         t.vision_tokens, s.json_member, s.media_members, s.extra_members,
                         unhex(sha256(s.conversation)), length(s.conversation)
                  FROM planned p LEFT JOIN token_lengths t USING (sample_id)
                  JOIN manifest_samples s USING (sample_id)""",
    "members": """SELECT p.output_shard, m.sample_id, m.name, m.sha256, m.size FROM pack_plan p
                  JOIN pack_members pm USING (pack_id) JOIN members m USING (sample_id) WHERE {shards}""",
    **AUDIT_PIECE_ROWS,
}
# the texts themselves, read for an output shard only where a packed conversation is not the manifest's text
_TEXT_ROWS = {"texts": """SELECT p.output_shard, s.sample_id, s.conversation FROM pack_plan p
                          JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
                          WHERE {shards}"""}
_TEXT_BATCH = 2048  # rows of texts streamed at once


class ShardTexts:
    """The manifest's conversation texts of one output shard, read the first time one is needed: a packed
    conversation that is not the manifest's very text (stale, or in another layout) is compared parsed."""

    def __init__(self, con, name: str, held_to: str | None = None) -> None:
        self.con, self.name, self.held_to, self._texts = con, name, held_to, None

    def __call__(self, sid: str, held: packdoc.Expected) -> str | None:
        if held is None or isinstance(held, str):  # no text, or a split piece's own text
            return held
        if self._texts is None:
            self._texts = self._load()
        return self._texts.get(sid)

    def _load(self) -> dict[str, str | None]:
        """Streamed, at the catalog's limit: a query of the whole manifest, which an audit worker's DuckDB (its
        own, held to ``held_to`` for its staged rows) may not fit under that."""
        texts: dict[str, str | None] = {}
        sql = _TEXT_ROWS["texts"].replace("{shards}", "p.output_shard = ?")
        if self.held_to:
            self.con.execute(f"SET memory_limit = '{store.memory_limit()}'")
        try:
            for batch in self.con.sql(sql, params=[self.name]).to_arrow_reader(_TEXT_BATCH):
                texts.update(zip(batch.column(1).to_pylist(), batch.column(2).to_pylist()))
        finally:
            if self.held_to:
                self.con.execute(f"SET memory_limit = '{store.memory_limit(self.held_to)}'")
        return texts


def _columns(con, query: str, name: str, rows: store.Staged | None, folders: set[str] | None = None) -> list:
    """One output shard's rows of ``AUDIT_ROWS[query]`` (`store.shard_rows`) as columns, each a sequence (none
    where it has no row): the staged ones read as Arrow columns made Python lists, a column at a time (cheaper
    than DuckDB's tuples made row by row, and the values built from them by C loops, not a Python frame a row).
    Not staged: the catalog's files in ``folders`` read only (`catalogview.source_folders`), where known."""
    if rows is None:
        return list(zip(*store.shard_rows(con, {query: within(con, AUDIT_ROWS[query], folders)}, query, name)))
    table = rows.table(con, query, name)
    return [] if table is None else [column.to_pylist() for column in table.columns]


_new = tuple.__new__  # a named tuple made as its own __new__ makes it, without that Python frame


def shard_expectations(con, name: str, rows: store.Staged | None = None):
    """The plan rows of one output shard and what the manifest says about their samples and members: held by an
    audit worker while it reads the shard, so each sample id is one string (the plan's) and no empty list is
    one of its own."""
    ids: dict[str, str] = {}
    plan = {
        r[0]: {"media_type": r[1], "sample_ids": [ids.setdefault(s, s) for s in r[2]], "lens": list(r[3]),
               "total": r[4], "overlong": r[5]}
        for r in con.execute("SELECT pack_id, media_type, sample_ids, sample_token_lens, total_token_len, overlong "
                             "FROM pack_plan WHERE output_shard = ?", [name]).fetchall()
    }
    # (total_tokens, media_type, media count, vision_tokens, json_member, conversation (`packdoc.Expected`),
    # media_members, extra_members); each media type one string, not one per sample
    types: dict = {}
    # not staged (one output shard read, as after an append): the manifest's and counts' files of its sources only
    folders = source_folders(con, name) if rows is None else None
    samples, members, json_names = {}, {}, {}
    if cols := _columns(con, "samples", name, rows, folders):
        sid, total, media_type, n_media, vision, json_member, media, extra, sha, chars = cols
        sid = list(map(ids.get, sid, sid))
        digests = [None if h is None else _new(packdoc.Digest, (h, n)) for h, n in zip(sha, chars)]
        samples = dict(zip(sid, zip(total, map(types.setdefault, media_type, media_type), n_media, vision,
                                    json_member, digests, [m or () for m in media], [m or () for m in extra])))
        json_names = dict(zip(zip(sid, json_member), json_member))  # (sample, its record member) -> that name
    if cols := _columns(con, "members", name, rows, folders):
        sid, member, sha, size = cols
        sid = list(map(ids.get, sid, sid))
        # a sample's record member named by its row's string (one string for both)
        member = map(json_names.get, zip(sid, member), member)
        members = dict(zip(zip(sid, member), zip(sha, size)))
    pieces, piece_members = piece_expectations(con, name, rows)  # split samples' pieces (core/split.py)
    samples.update(pieces)
    members.update(piece_members)
    return plan, samples, members
