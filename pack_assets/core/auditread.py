"""What the audit expects of one output shard's samples and members, held as Arrow columns and turned into Python
rows one pack at a time.

An output shard of tiny samples holds ~313k of them: as Python tuples, strings and dicts (a sample id copied in
four of them) its expectations held about 2 KB a sample, most of an audit worker's memory; as columns they hold
their bytes, and a pack's rows are built when the pack is checked (`ShardExpectations.pack`). The rows are the
ones the audit's per-shard queries give (`core/audit.py`'s ``AUDIT_ROWS``), with the same values and the same
lookups: a sample id's row, a (sample id, member name)'s (sha256, size).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import store

_MISSING = object()


def shard_table(con, queries: Mapping[str, str], query: str, shard: str, rows: store.Staged | None) -> pa.Table | None:
    """One output shard's rows of ``queries[query]`` as an Arrow table without ``output_shard`` (`store.shard_rows`'
    rows as columns); None for no rows."""
    if rows is not None:
        return rows.table(con, query, shard)
    found = con.sql(queries[query].replace("{shards}", "p.output_shard = ?"), params=[shard]).to_arrow_table()
    return found.drop_columns(["output_shard"]) if found.num_rows else None


class Lookup:
    """A pack's rows by key (``found``), any other key looked up in the whole shard (``other``): `dict.get`'s
    answers for the shard's rows, built for one pack."""

    def __init__(self, found: dict, other) -> None:
        self.found, self.other = found, other

    def get(self, key, default=None):
        row = self.found.get(key, _MISSING)
        if row is _MISSING:
            row = self.other(key)
        return default if row is None else row


class ShardExpectations:
    """One output shard's ``samples`` rows (sample id -> (total_tokens, media_type, media count, vision_tokens,
    json_member, conversation, media_members, extra_members)), its ``conversations`` and ``members`` ((sample id,
    member name) -> (sha256, size)), and its split samples' pieces (``pieces``, ``piece_members``: dicts, as
    `outcomes.piece_expectations` gives them; a piece id is never a sample id)."""

    def __init__(self, samples: pa.Table | None, conversations: pa.Table | None, members: pa.Table | None,
                 pieces: dict, piece_members: dict) -> None:
        self.pieces, self.piece_members = pieces, piece_members
        ids = samples.column(0).to_pylist() if samples is not None else []
        self.index = {sid: i for i, sid in enumerate(ids)}  # a repeated id (a blend's copies): its last row
        self.columns = samples.columns[1:] if samples is not None else []  # chunked: taken from, never copied
        self.conversation, self.conversation_at = _aligned(self.index, len(ids), conversations)
        self.member_columns, self.member_runs, self.orphans = _member_runs(self.index, len(ids), members)

    def _rows(self, at: list[int]) -> list[tuple]:
        if not at:
            return []
        ix = pa.array(at, pa.int64())
        cols = [c.take(ix).to_pylist() for c in self.columns]
        where = self.conversation_at[at]
        conv = (self.conversation.take(pa.array(where, pa.int64(), mask=where < 0)).to_pylist()
                if self.conversation is not None else [None] * len(at))
        return [(*r[:5], c, *r[5:]) for r, c in zip(zip(*cols), conv)]

    def _members(self, at: list[int]) -> dict:
        spans = [(self.member_runs[i, 0], self.member_runs[i, 1]) for i in at]
        picked = np.concatenate([np.arange(a, b) for a, b in spans]) if spans else np.zeros(0, np.int64)
        if not len(picked):
            return {}
        sid, name, sha, size = (c.take(pa.array(picked, pa.int64())).to_pylist() for c in self.member_columns)
        return {(s, n): (h, z) for s, n, h, z in zip(sid, name, sha, size)}

    def sample(self, sid):
        if sid in self.pieces:
            return self.pieces[sid]
        i = self.index.get(sid)
        return None if i is None else self._rows([i])[0]

    def member(self, key):
        if key in self.piece_members:
            return self.piece_members[key]
        if key in self.orphans:
            return self.orphans[key]
        i = self.index.get(key[0]) if isinstance(key, tuple) and key else None
        return None if i is None else self._members([i]).get(key)

    def pack(self, sample_ids: list) -> tuple[Lookup, Lookup]:
        """The rows of a pack's planned samples and of their members, any other key looked up when asked."""
        pairs = sorted({(i, sid) for sid in sample_ids if (i := self.index.get(sid)) is not None})
        at = [i for i, _ in pairs]
        # pieces, members of ids without a samples row: looked up when asked (`sample`, `member`)
        samples, members = dict(zip((sid for _, sid in pairs), self._rows(at))), self._members(at)
        return Lookup(samples, self.sample), Lookup(members, self.member)

    def as_dicts(self) -> tuple[dict, dict]:
        """Every row, as the dicts the audit held before (for tests)."""
        samples, members = self.pack(list(self.index))
        return {**samples.found, **self.pieces}, {**members.found, **self.orphans, **self.piece_members}


def _aligned(index: dict, n: int, conversations: pa.Table | None) -> tuple[pa.ChunkedArray | None, np.ndarray]:
    """The conversations column and, per samples row (``n``), its row there (-1: none; a repeated id: its last)."""
    at = np.full(n, -1, np.int64)
    if conversations is None:
        return None, at
    for j, sid in enumerate(conversations.column(0).to_pylist()):
        i = index.get(sid)
        if i is not None:
            at[i] = j
    return conversations.column(1), at


def _member_runs(index: dict, n: int, members: pa.Table | None) -> tuple[list, np.ndarray, dict]:
    """The members' columns sorted by sample id, each samples row's [start, end) in them, and the members of
    sample ids without a samples row, as a dict."""
    runs = np.zeros((n, 2), np.int64)
    if members is None:
        return [], runs, {}
    members = members.take(pc.sort_indices(members.column(0)))
    cols = members.columns[:4]
    ids, orphans, start = cols[0].to_pylist(), {}, 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[start]:
            i = index.get(ids[start])
            if i is not None:
                runs[i] = start, k
            else:
                for j in range(start, k):
                    orphans[(ids[j], cols[1][j].as_py())] = (cols[2][j].as_py(), cols[3][j].as_py())
            start = k
    return cols, runs, orphans
