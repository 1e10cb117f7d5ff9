"""A copy-mode output shard prepared in bulk: from three catalog queries (a row per sample, a row per media or
extra member, both in pack order, and each sample's conversation) straight to what the writer writes, without
a job object per sample or a dict per member. Per pack: the document's text around each sample's source record
(everything of ``jobs.pack_document``'s bytes but the records, which only the source tar holds), the reads (one
``pread`` per sample's span of small members) and the members in output order; the shard's content fingerprint
from one hash over every line ``ShardFingerprint`` takes. The bytes are ``pack_document``'s and
``shard_fingerprint``'s (tests compare them); index mode keeps the job objects (its cost is the records)."""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import store
from ..packs import arrow_ints
from .fingerprints import ShardFingerprint
from .jobs import WRITE_CONVERSATIONS, ShardJob, dumps, encode_str, meta_closer
from .layout import Layout, layout
from .places import places

# the rows one output shard is written from, gathered for every shard to write at once (store.staged)
BULK_ROWS = {
    "samples": """SELECT p.output_shard, p.pack_id, p.media_type, p.total_token_len, pm.position, s.sample_id, s.shard,
                         s.key, t.total_tokens, sh.size || ':' || sh.mtime_ns AS stamp, j.name, j."offset", j.size,
                         j.sha256, len(s.media_members) AS n_media, len(s.extra_members) AS n_extra, s.record_exact
                  FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
                  JOIN token_lengths t USING (sample_id) LEFT JOIN shards sh ON sh.shard = s.shard
                  LEFT JOIN members j ON j.sample_id = s.sample_id AND j.name = s.json_member WHERE {shards}""",
    # media then extra members, each in the manifest's order
    "members": """SELECT p.output_shard, pm.pack_id, pm.position, x.kind, x.i, m.name, m."offset", m.size, m.sha256
                  FROM pack_plan p JOIN pack_members pm USING (pack_id)
                  JOIN (SELECT sample_id, 0 AS kind, unnest(media_members) AS name,
                               generate_subscripts(media_members, 1) AS i FROM manifest_samples
                        UNION ALL SELECT sample_id, 1, unnest(extra_members), generate_subscripts(extra_members, 1)
                        FROM manifest_samples) x USING (sample_id)
                  JOIN members m USING (sample_id, name) WHERE {shards}""",
    # staged with the rest: read per writer job, the join scanned every manifest file once per job and held its
    # rows in the writer's DuckDB beside the job's (docs/benchmarks.md, issue 41)
    **WRITE_CONVERSATIONS,
}
# rows streamed at once by the staging of the conversations: kilobytes each with real text, so a quarter of
# store.staged's batch, as the audit's texts had before it staged digests
STAGED_BATCHES = {"conversations": 8192}


@dataclass(slots=True)
class Columns:
    """A shard's samples in pack order, column by column, and their members: each sample's media, then its
    extra members, in the manifest's order; a member is (name, offset, size, sha256)."""
    pack_id: list
    media_type: list
    total: list
    sample_id: list
    shard: list
    key: list
    tokens: list
    stamp: list
    conversation: list
    conversation_sha256: list
    path: list  # the source tar's
    record: list  # the record member or None
    n_media: list
    n_extra: list
    members: list = field(default_factory=list)
    split: list = field(default_factory=list)  # per sample: a piece's `_meta` split (core/split.py) or None; [] none
    exact: list = field(default_factory=list)  # per sample: `Sample.record_exact` (None: not known); [] none
    # the members' and records' JSON texts, made once for both the fingerprint's lines and the documents
    texts: tuple | None = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class BulkPack:
    pack_id: str
    heads: list[bytes]  # the document before each sample's source record (UTF-8)
    tail: bytes  # after the last one: the last sample's end and `_meta`
    reads: list[tuple]  # (source path, offset, size, what, is a sample's span): one pread each
    records: list[tuple | None]  # per sample: (read, start, end, CAPTION, JSON or EXACT) of its record, or None
    # its members in output order: (read, start, end) of a member read, or (-1, source path, offset, size, source
    # name) of one copied in kernel; with their output names, tar headers and paddings (`layout.layout`)
    members: list[tuple]
    names: list[str]
    headers: list
    pads: list[bytes]
    span: int  # the members' bytes, headers and padding included: from the document's end to the pack's
    copied: bool  # whether a member is copied in kernel


@dataclass(slots=True)
class BulkShard:
    name: str
    packs: list[BulkPack]
    samples: int
    fingerprint: str
    layout: Layout | None = None  # its members' (`layout.shard_index`)
    parts: list[str] = field(default_factory=list)  # each member's output name after its pack id and the dot

    @property
    def n_packs(self) -> int:
        return len(self.packs)

    def batches(self) -> Iterator[list[BulkPack]]:
        """Its packs as one batch (as `batches.StreamShard` gives a shard's)."""
        yield self.packs


_SAMPLE_COLUMNS, _MEMBER_COLUMNS = 16, 8  # BULK_ROWS' columns after output_shard
_ORDER_ONLY = frozenset({"kind", "i"})  # members' columns that only order them


def bulk_rows(con) -> dict[str, str]:
    """BULK_ROWS for this catalog: without `record_exact` where its manifests predate it (every record is then
    parsed and dumped again, as before it)."""
    if "record_exact" in con.sql("SELECT * FROM manifest_samples LIMIT 0").columns:
        return BULK_ROWS
    return {**BULK_ROWS, "samples": BULK_ROWS["samples"].replace("s.record_exact", "NULL::BOOLEAN AS record_exact")}


def catalog_columns(con, input_root, name: str, rows: store.Staged | None = None) -> Columns:
    """The shard's samples and members from BULK_ROWS (staged per shard, or queried) and its conversations."""
    queries = bulk_rows(con)
    samples = store.shard_rows(con, queries, "samples", name, rows, order_by="pack_id, position")
    members = store.shard_rows(con, queries, "members", name, rows, order_by="pack_id, position, kind, i")
    conversations = {r[0]: r[1:] for r in store.shard_rows(con, queries, "conversations", name, rows)}
    return _columns(input_root, name, _transposed(samples, _SAMPLE_COLUMNS), _transposed(members, _MEMBER_COLUMNS),
                    conversations)


def _transposed(rows: list[tuple], width: int) -> list[list]:
    return list(map(list, zip(*rows))) if rows else [[] for _ in range(width)]


def _by_shard(table, group: list[str]) -> dict:
    """An Arrow table's rows (output_shard first, ordered by it) per output shard of ``group``: slices of it,
    made Python lists shard by shard (`_lists`) as each is prepared, not all of a job's at once. A group of one
    shard: the table as it is (in any order, `group_table`'s ``ordered``)."""
    if len(group) == 1:
        return {group[0]: table} if table.num_rows else {}
    runs, at = {}, 0
    counts = pc.value_counts(table.column(0))  # each shard's rows, in the order first seen: the table's
    for k, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
        runs[k], at = table.slice(at, n), at + n
    return runs


def _lists(part, width: int) -> list[list]:
    """A shard's slice (`_by_shard`) as Python lists, column by column, without output_shard; a members slice's
    ``kind`` and ``i`` (its order only, `in_sample_order`) as None, not made lists."""
    if part is None:
        return [[] for _ in range(width)]
    return [None if k in _ORDER_ONLY else part.column(k).to_pylist() for k in part.column_names[1:]]


def group_table(con, queries: dict[str, str], query: str, group: list[str], rows: store.Staged | None = None,
                order_by: str | None = "", ordered: bool = True):
    """A group of output shards' rows of ``queries[query]``, ``output_shard`` first, ordered by it then by
    ``order_by``, as an Arrow table (its columns become Python lists one call each, not a tuple per row): from
    the group's staged file (`store.staged(..., groups=)`), or by one query for the group. Not ``ordered``, a
    group of one shard's rows come in any order, as read: no sort, whose rows DuckDB would hold beside the
    table (a 313k-sample shard's conversations: ~60 MiB more at the job's peak, docs/benchmarks.md)."""
    order = "" if order_by is None or not ordered and len(group) == 1 else \
        "output_shard" + (f", {order_by}" if order_by else "")
    if rows is not None:
        found = rows.table(con, query, group[0], order)
        if found is not None:
            return found
        sql, group = queries[query].replace("{shards}", "false"), []  # the query had no row for this group
    else:
        sql = queries[query].replace("{shards}", f"p.output_shard IN ({', '.join('?' * len(group))})")
    return con.sql(f"{sql} ORDER BY {order}" if order else sql, params=group).to_arrow_table()


def group_tables(con, group: list[str], rows: store.Staged | None = None) -> Iterator[tuple]:
    """Each shard of ``group`` with its rows as Arrow slices (samples, members, conversations; each None where
    it has none), from one read of each query for the whole group (its staged file, `store.staged(...,
    groups=)`, or one query): a writer's job reads the catalog once, not once per output shard. Staged, a
    job reads no manifest file: a sample whose conversation the staging did not find is a KeyError."""
    queries = bulk_rows(con)
    samples = group_table(con, queries, "samples", group, rows, order_by="pack_id, position")
    members = _by_shard(in_sample_order(samples, group_table(con, queries, "members", group, rows, order_by=None)),
                        group)
    samples = _by_shard(samples, group)
    # looked up by sample id (`_columns`, `batches.StreamShard`): a shard's in any order
    conversations = _by_shard(group_table(con, queries, "conversations", group, rows, ordered=False), group)
    for name in group:
        yield name, samples.pop(name, None), members.pop(name, None), conversations.pop(name, None)


def in_sample_order(samples, members):
    """``members`` (BULK_ROWS' members rows, in any order) in the order of ``samples`` (its samples rows, ordered by
    output shard, pack and position): each sample's media then extra members, each in the manifest's order. What
    DuckDB's sort by (output_shard, pack_id, position, kind, i) gives, by integer keys in numpy: the strings are
    compared once per pack, not per member (that sort was a third of the members' query, docs/benchmarks.md)."""
    if members is None or members.num_rows <= 1 or samples is None:
        return members
    packs = pc.unique(samples.column("pack_id"))  # in the samples' order (first seen first)
    rank = pc.index_in(members.column("pack_id"), value_set=packs)
    if rank.null_count:  # none: both come from one plan
        raise KeyError("a member's pack is not among its shard's samples in the catalog")
    order = np.lexsort((*(_ints(members.column(k)) for k in ("i", "kind", "position")), _ints(rank)))
    return members.take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order.astype(np.int64))]))


def _ints(col) -> np.ndarray:
    """`packs.arrow_ints` of an integer column, chunked or not (Arrow's ``to_numpy`` and ``take`` of a numpy array
    import pandas on their first call in a process, ~0.4 s of a fresh writer's first shard); refused with nulls."""
    chunks = [c for c in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]) if len(c)]
    for c in chunks:
        if not pa.types.is_integer(c.type) or c.null_count:
            raise TypeError(f"not an integer column without nulls: {c.type}, {c.null_count} nulls")
    return np.concatenate([arrow_ints(c) for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)


def table_columns(input_root, name: str, samples, members, conversations) -> Columns:
    """One shard's `group_tables` rows as Columns (Python lists)."""
    sid, conv, sha = _lists(conversations, 3)
    return _columns(input_root, name, _lists(samples, _SAMPLE_COLUMNS), _lists(members, _MEMBER_COLUMNS),
                    dict(zip(sid, zip(conv, sha))))


def _columns(input_root, name: str, samples: list[list], members: list[list], conversations: dict) -> Columns:
    """Columns from BULK_ROWS' columns (without output_shard)."""
    (pack_id, media_type, total, position, sid, shard, key, tokens, stamp, rec_name, rec_offset, rec_size, rec_sha,
     n_media, n_extra, exact) = samples
    n_media, n_extra = [n or 0 for n in n_media], [n or 0 for n in n_extra]
    # each member's (pack, position) is its sample's, sample after sample: compared column by column
    counts = np.add(n_media, n_extra, dtype=np.int64) if n_media else np.zeros(0, dtype=np.int64)
    if (len(members[0]) != int(counts.sum()) or members[1] != np.repeat(np.asarray(position), counts).tolist()
            or members[0] != np.repeat(np.asarray(pack_id, dtype=object), counts).tolist()):
        raise KeyError(f"{name}: the catalog lacks a member some sample of this shard lists")
    paths = {s: str(store.source_tar(input_root, s)) for s in set(shard)}  # per source shard, not per sample
    conv = [conversations[s] for s in sid]
    return Columns(pack_id, media_type, total, sid, shard, key, tokens, stamp, [c[0] for c in conv],
                   [c[1] for c in conv], [paths[s] for s in shard],
                   [None if n is None else (n, o, z, h) for n, o, z, h in zip(rec_name, rec_offset, rec_size, rec_sha)],
                   n_media, n_extra, list(zip(*members[4:])), exact=exact)


def job_columns(job: ShardJob) -> Columns:
    """A ShardJob's samples as columns (callers and tests that hold jobs)."""
    def member(m: dict | None) -> tuple | None:
        if m is not None and list(m) != ["name", "offset", "size", "sha256"]:
            raise ValueError(f"a member as the catalog holds one (name, offset, size, sha256), not {sorted(m)}")
        return None if m is None else (m["name"], m["offset"], m["size"], m["sha256"])

    subs = [(p, s) for p in job.packs for s in p.subs]
    return Columns([p.pack_id for p, _ in subs], [p.media_type for p, _ in subs], [p.total_token_len for p, _ in subs],
                   [s.sample_id for _, s in subs], [s.shard for _, s in subs], [s.key for _, s in subs],
                   [s.token_len for _, s in subs], [s.source_stamp for _, s in subs],
                   [s.messages_text() for _, s in subs], [s.conversation_sha256 for _, s in subs],
                   [s.source_path for _, s in subs], [member(s.json_member) for _, s in subs],
                   [len(s.media) for _, s in subs], [len(s.extra) for _, s in subs],
                   [member(m) for _, s in subs for m in s.media + s.extra], [s.split for _, s in subs])


def build_shard(name: str, cols: Columns, context: dict) -> BulkShard:
    """The shard's packs, column by column; ``context``: `_meta`'s without the shard fingerprint, which is
    computed here (one hash over the lines ShardFingerprint takes) and carried by every pack's `_meta`."""
    fp = ShardFingerprint(context)
    fp.text(fingerprint_text(cols))
    context = {**context, "shard_fingerprint": fp.hexdigest()}
    built, lay, parts = build_packs(cols, context)
    return BulkShard(name, built, len(cols.pack_id), context["shard_fingerprint"], lay, parts)


def _starts(cols: Columns) -> tuple[list[int], list[int]]:
    """Each sample's first member (one more at the end) and each pack's first sample (one more at the end)."""
    starts = list(accumulate((a + b for a, b in zip(cols.n_media, cols.n_extra)), initial=0))
    packs = [i for i, p in enumerate(cols.pack_id) if i == 0 or p != cols.pack_id[i - 1]] + [len(cols.pack_id)]
    return starts, packs


def fingerprint_text(cols: Columns) -> str:
    """The lines `ShardFingerprint` takes for these whole packs (`pack`'s, then `sub`'s per sample): fed batch
    after batch of a shard's packs, the same hash as fed at once."""
    starts, packs = _starts(cols)
    lines = _lines(cols, starts)
    return "".join(f"{cols.pack_id[a]}|{cols.media_type[a]}|{cols.total[a]}\n" + "".join(lines[a:b])
                   for a, b in zip(packs, packs[1:]))


def build_packs(cols: Columns, context: dict) -> tuple[list[BulkPack], Layout, list[str]]:
    """These whole packs as the writer writes them, their members' layout and part names; ``context``: `_meta`'s,
    the shard fingerprint included."""
    starts, packs = _starts(cols)
    where = [k - packs[g] for g in range(len(packs) - 1) for k in range(packs[g], packs[g + 1])]  # in its pack
    out_names, parts = _output_names(cols, starts, where)
    heads, closes, sources = _documents(cols, starts, out_names, parts)
    got = places(cols.record, cols.members, cols.path, cols.key, starts, packs, cols.exact)
    firsts = [starts[a] for a in packs]
    lay = layout(out_names, [m[2] for m in cols.members], firsts)
    sample_ids = list(map(encode_str, cols.sample_id))
    meta_text = meta_closer(context)
    built = []
    for g, (a, b) in enumerate(zip(packs, packs[1:])):
        pid, kind = encode_str(cols.pack_id[a]), _text(cols.media_type[a])
        meta = (f'{{"pack_id": {pid}, "media_type": {kind}, "sample_ids": [{", ".join(sample_ids[a:b])}], '
                f'"sample_token_lens": [{", ".join(map(_num, cols.tokens[a:b]))}], '
                f'"total_token_len": {_num(cols.total[a])}, "sources": [{", ".join(sources[a:b])}]')
        m0, m1 = starts[a], starts[b]
        built.append(BulkPack(
            cols.pack_id[a],
            [f'{{"pack_id": {pid}, "media_type": {kind}, "samples": [{heads[a]}'.encode(),
             *(f"{closes[k - 1]}, {heads[k]}".encode() for k in range(a + 1, b))],
            f'{closes[b - 1]}], "_meta": {meta_text(meta)}}}'.encode(),
            got.reads[got.first[a]:got.first[b]], got.records[a:b], got.members[m0:m1], out_names[m0:m1],
            lay.headers[m0:m1], lay.pads[m0:m1], lay.spans[g], any(p[0] < 0 for p in got.members[m0:m1])))
    return built, lay, parts


def _num(v) -> str:
    return str(v) if type(v) is int else dumps(v)


def _text(v) -> str:
    return encode_str(v) if type(v) is str else dumps(v)


def _output_names(cols: Columns, starts: list[int], where: list[int]) -> tuple[list[str], list[str]]:
    """Each member's output name (`tario.media_name`, `tario.extra_name`, built here for all members at once:
    a test checks them against those) and its part, the name after the pack id and the dot."""
    counts = np.diff(np.asarray(starts, dtype=np.int64))
    owner = np.repeat(np.arange(len(counts)), counts)
    j = np.arange(len(owner)) - np.asarray(starts[:-1], dtype=np.int64)[owner]
    n_media = np.asarray(cols.n_media, dtype=np.int64)[owner]
    extra = j >= n_media
    # each name's extension: after its base name's last dot, else the whole base name (as rsplit gives it)
    names = [m[0] for m in cols.members]
    exts = [n[max(n.rfind("."), n.rfind("/")) + 1:].lower() for n in names]
    at, k = np.asarray(where, dtype=np.int64)[owner].tolist(), np.where(extra, j - n_media, j).tolist()
    # "s{i:03d}_" and "{k:02d}" made once per value, not formatted per member
    stems = [f"s{i:03d}_" for i in range(max(at, default=0) + 1)]
    ks = [f"{n:02d}" for n in range(max(k, default=0) + 1)]
    if not extra.any():
        parts = [stems[i] + ks[n] + "." + e for i, n, e in zip(at, k, exts)]
    else:
        parts = [stems[i] + "x" + ks[n] + (f".{e}" if e and "." in b else "") if x else stems[i] + ks[n] + "." + e
                 for i, n, x, e, b in zip(at, k, extra.tolist(), exts, (n[n.rfind("/") + 1:] for n in names))]
    pack_ids = [cols.pack_id[s] for s in owner.tolist()]
    return [f"{p}.{part}" for p, part in zip(pack_ids, parts)], parts


def _texts(cols: Columns) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Each member's name and sha256 as JSON (the catalog's types: names and digests str, offsets and sizes int,
    so f-strings write what json.dumps does), and each sample's `_record_texts`; made once per columns."""
    if cols.texts is None:
        members = cols.members
        cols.texts = ([encode_str(m[0]) for m in members], ["null" if m[3] is None else encode_str(m[3])
                                                             for m in members], list(map(_record_texts, cols.record)))
    return cols.texts


def _record_texts(rec: tuple | None) -> tuple[str, str]:
    """A sample's record member as `_meta` lists it and as its fingerprint line keys it."""
    if rec is None:
        return "null", "-"
    name, sha = encode_str(rec[0]), "null" if rec[3] is None else encode_str(rec[3])
    return (f'{{"name": {name}, "offset": {rec[1]}, "size": {rec[2]}, "sha256": {sha}}}',
            f"[{name}, {rec[1]}, {rec[2]}, {sha}]")


def _lines(cols: Columns, starts: list[int]) -> list[str]:
    """Per sample its fingerprint line (`ShardFingerprint.sub`'s)."""
    members = cols.members
    names, shas, records = _texts(cols)
    keys = [f"[{n}, {m[1]}, {m[2]}, {h}]" for n, m, h in zip(names, members, shas)]
    # the samples with a member of no digest: each found from its member's place (most shards have none)
    unhashed = {bisect_right(starts, k) - 1 for k, m in enumerate(members) if m[3] is None}
    lines = []
    for s, (sid, tokens, stamp, conv, conv_sha, rec, n_media, rec_texts) in enumerate(zip(
            cols.sample_id, cols.tokens, cols.stamp, cols.conversation, cols.conversation_sha256, cols.record,
            cols.n_media, records)):
        a, b, c = starts[s], starts[s] + n_media, starts[s + 1]
        stamp = stamp if s in unhashed or (rec is not None and rec[3] is None) else ""
        if not conv_sha:
            conv_sha = hashlib.sha256(("null" if conv is None else conv).encode()).hexdigest()
        keyed = "|".join([rec_texts[1], *keys[a:b], "+", *keys[b:c]])
        lines.append(f"{sid}|{tokens}|{conv_sha}|{stamp}|{keyed}\n")
    return lines


def _documents(cols: Columns, starts: list[int], out_names: list[str], parts: list[str]) -> tuple[list, list, list]:
    """Per sample: its document text up to its source record, after it, and its `_meta` source."""
    members = cols.members
    names, shas, records = _texts(cols)
    listed = [f'{{"name": {n}, "offset": {m[1]}, "size": {m[2]}, "sha256": {h}, "output_name": {encode_str(o)}}}'
              for n, m, h, o in zip(names, members, shas, out_names)]
    # the document's media: each output name after its first dot (the part, unless a pack id holds a dot)
    parts = [encode_str(o.split(".", 1)[1]) for o in out_names] if any("." in p for p in set(cols.pack_id)) \
        else list(map(encode_str, parts))
    heads, closes, sources = [], [], []
    splits = cols.split or [None] * len(cols.sample_id)
    for s, (sid, shard, key, tokens, conv, rec_texts, n_media, split) in enumerate(zip(
            cols.sample_id, cols.shard, cols.key, cols.tokens, cols.conversation, records, cols.n_media, splits)):
        a, b, c = starts[s], starts[s] + n_media, starts[s + 1]
        sid_text = encode_str(sid)
        heads.append(f'{{"sample_id": {sid_text}, "token_len": {_num(tokens)}, '
                     f'"messages": {"null" if conv is None else conv}, '
                     f'"media": [{", ".join(parts[a:b])}], "source": ')
        closes.append(f', "extra": [{", ".join(parts[b:c])}]}}' if c > b else "}")
        sources.append(f'{{"sample_id": {sid_text}, "shard": {_text(shard)}, "key": {_text(key)}, '
                       f'"json_member": {rec_texts[0]}, "media": [{", ".join(listed[a:b])}]'
                       + (f', "extra": [{", ".join(listed[b:c])}]' if c > b else "")
                       + (f', "split": {dumps(split)}}}' if split else "}"))
    return heads, closes, sources
