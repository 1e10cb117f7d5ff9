"""Where a copy-mode shard's bytes come from, decided for all its samples at once (numpy): a sample's record
and members under the cut (`syscalls.SMALL`) are sliced out of one ``pread`` of their span when they lie
together (`syscalls.SPAN_GAP`), else read one by one; members of the cut or more are copied in kernel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import syscalls

CAPTION, JSON, EXACT = 0, 1, 2  # a record: a caption (a JSON string), a .json parsed and dumped again, or as it is


@dataclass(slots=True)
class Places:
    """``reads``: (source path, offset, size, what, is a sample's span), one pread each, sample after sample;
    ``first``: each sample's first read (one more at the end); per sample its record's (read, start, end,
    CAPTION, JSON or EXACT) or None, per member (read, start, end) or (-1, source path, offset, size, source
    name) for one copied in kernel; their reads counted from their pack's first (``packs``)."""
    reads: list[tuple]
    first: list[int]
    records: list[tuple | None]
    members: list[tuple]


def _column(values: list, at: int, default: int = 0) -> np.ndarray:
    return np.fromiter((default if v is None else v[at] for v in values), dtype=np.int64, count=len(values))


def places(records: list, members: list[tuple], paths: list[str], keys: list[str], starts: list[int],
           packs: list[int], exact: list, cut: int | None = None) -> Places:
    """``records`` per sample (name, offset, size, sha256) or None, ``members`` (name, offset, size, sha256),
    sample s's being those from ``starts[s]``; ``packs``: each pack's first sample (one more at the end)."""
    cut = syscalls.SMALL if cut is None else cut
    n = len(records)
    has_rec = np.fromiter((r is not None for r in records), dtype=bool, count=n)
    rec_off, rec_size = _column(records, 1), _column(records, 2)
    m_off, m_size = _column(members, 1), _column(members, 2)
    owner = np.repeat(np.arange(n), np.diff(np.asarray(starts, dtype=np.int64)))
    small = m_size < cut
    lo = np.where(has_rec, rec_off, np.iinfo(np.int64).max)
    np.minimum.at(lo, owner[small], m_off[small])
    hi = np.where(has_rec, rec_off + rec_size, -1)
    np.maximum.at(hi, owner[small], (m_off + m_size)[small])
    count = has_rec + np.bincount(owner[small], minlength=n)
    total = np.where(has_rec, rec_size, 0) + np.bincount(owner[small], weights=m_size[small], minlength=n).astype(
        np.int64)
    span = (count > 1) & (hi - lo <= total + min(syscalls.SPAN_GAP, cut - 1))
    first = np.concatenate(([0], np.cumsum(np.where(span, 1, count))))
    # a small member's read: its sample's span, else its own (after the record's, in member order)
    before = np.concatenate(([0], np.cumsum(small)))  # small members before each member, over the shard
    rank = before[:-1] - before[np.asarray(starts[:-1], dtype=np.int64)][owner]
    in_span = span[owner]
    read = np.where(in_span, first[:-1][owner], first[:-1][owner] + has_rec[owner] + rank)
    start = np.where(in_span, m_off - lo[owner], 0)
    pack_of = np.repeat(np.arange(len(packs) - 1), np.diff(np.asarray(packs, dtype=np.int64)))
    base = first[np.asarray(packs[:-1], dtype=np.int64)][pack_of]  # each sample's pack's first read
    read -= base[owner]
    got = list(zip(read.tolist(), start.tolist(), (start + m_size).tolist()))
    for k in np.flatnonzero(~small).tolist():
        got[k] = (-1, paths[owner[k]], *members[k][1:3], members[k][0])
    rec_start = np.where(span, rec_off - lo, 0)
    rec_read = first[:-1] - base
    how = [None if r is None else (EXACT if x else JSON) if r[0].endswith(".json") else CAPTION
           for r, x in zip(records, exact or [None] * n)]
    return Places(_reads(records, members, paths, keys, starts, span, lo, hi, small), first.tolist(),
                  [None if h is None else (r, a, a + z, h) for h, r, a, z in zip(
                      how, rec_read.tolist(), rec_start.tolist(), rec_size.tolist())], got)


def _reads(records: list, members: list[tuple], paths: list[str], keys: list[str], starts: list[int],
           span: np.ndarray, lo: np.ndarray, hi: np.ndarray, small: np.ndarray) -> list[tuple]:
    """The reads, sample after sample: a span's one, else its record's and its small members' own."""
    reads = []
    small = small.tolist()
    for s, (whole, a, b) in enumerate(zip(span.tolist(), lo.tolist(), hi.tolist())):
        if whole:
            reads.append((paths[s], a, b - a, keys[s], True))
            continue
        rec = records[s]
        mine = ([rec] if rec is not None else []) + [members[k] for k in range(starts[s], starts[s + 1]) if small[k]]
        reads += [(paths[s], m[1], m[2], m[0], False) for m in mine]
    return reads
