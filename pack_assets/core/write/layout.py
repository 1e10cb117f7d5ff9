"""A copy-mode shard's tar layout, built for all its members at once (numpy) instead of member by member while
writing: each member's tar header (`tario.header_rows`), its padding, and where its data lies relative to the
end of its pack's document (the one member whose size is known only when the pack is written: its records are
read then). Once the shard is written, its Energon index follows from the packs' places and these offsets
(`shard_index`), the same rows as reading its tar headers back (a test checks them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tario import BLOCK, Entry, header_rows, member_header
from .energon import Index, index_of, plain_key

_PADS = [bytes(n) for n in range(BLOCK)]  # the padding after a payload, by its length


@dataclass(slots=True)
class Layout:
    """Per member (in output order): its tar header, its padding, its data's offset from the end of its pack's
    document; per pack: its first member (``firsts``, one more at the end) and its members' bytes in all."""
    headers: list
    pads: list[bytes]
    header_len: np.ndarray
    sizes: np.ndarray
    rel: np.ndarray
    firsts: list[int]
    spans: list[int]


def layout(names: list[str], sizes: list[int], firsts: list[int]) -> Layout:
    """The layout of members ``names`` (output names) of ``sizes`` bytes, pack p's being those from
    ``firsts[p]`` to ``firsts[p + 1]``."""
    size = np.asarray(sizes, dtype=np.int64).reshape(-1)
    rows = header_rows(names, size) if names else None
    if rows is not None:
        blob = memoryview(rows).cast("B")  # the rows' own bytes, not a copy
        headers = [blob[i:i + BLOCK] for i in range(0, len(names) * BLOCK, BLOCK)]
        header_len = np.full(len(names), BLOCK, dtype=np.int64)
    else:  # long or non-ASCII names (PAX headers), or an empty shard
        headers = list(map(member_header, names, sizes))
        header_len = np.fromiter(map(len, headers), dtype=np.int64, count=len(headers))
    pad = -size % BLOCK
    step = header_len + size + pad
    before = np.concatenate(([0], np.cumsum(step)))  # the members' bytes before each one, over the whole shard
    first = np.asarray(firsts, dtype=np.int64)
    pack_of = np.repeat(np.arange(len(firsts) - 1), np.diff(first))
    rel = before[:-1] - before[first[:-1]][pack_of] + header_len
    return Layout(headers, [_PADS[p] for p in pad.tolist()], header_len, size, rel, list(firsts),
                  np.diff(before[first]).tolist())


def merged(layouts: list[Layout]) -> Layout:
    """One layout of a shard's batches of packs, in order, as far as `shard_index` reads it (without the
    headers and paddings, written by then): each member's place is relative to its own pack's document."""
    if not layouts:
        return layout([], [], [0])
    shift = np.cumsum([0] + [len(lay.sizes) for lay in layouts[:-1]]).tolist()
    firsts = [0] + [f + s for lay, s in zip(layouts, shift) for f in lay.firsts[1:]]
    columns = (np.concatenate([getattr(lay, k) for lay in layouts]) for k in ("header_len", "sizes", "rel"))
    return Layout([], [], *columns, firsts, [x for lay in layouts for x in lay.spans])


def shard_index(pack_ids: list[str], lay: Layout, parts: list[str], docs: list[tuple[int, int, int]],
                end: int) -> Index:
    """The shard's Energon index from its layout and each pack's document as written: ``docs`` per pack (where
    the pack starts, its document's header length, the document's size); ``parts``: each member's part name
    (its output name after the pack id and the dot); ``end``: where the last member ends."""
    n_packs, n = len(pack_ids), len(lay.sizes)
    start, doc_header, doc_size = (np.asarray(c, dtype=np.int64).reshape(-1) for c in zip(*docs)) if docs \
        else (np.zeros(0, dtype=np.int64),) * 3
    after_doc = start + doc_header + doc_size + (-doc_size % BLOCK)
    first = np.asarray(lay.firsts, dtype=np.int64)
    pack_of = np.repeat(np.arange(n_packs), np.diff(first))
    data_at = after_doc[pack_of] + lay.rel
    # each pack's document first, then its members: the document of pack p at place firsts[p] + p
    doc_at = first[:-1] + np.arange(n_packs)
    member_at = np.arange(n) + pack_of + 1
    offsets, sizes, owner = (np.empty(n + n_packs, dtype=np.int64) for _ in range(3))
    offsets[doc_at], offsets[member_at] = start + doc_header, data_at
    sizes[doc_at], sizes[member_at] = doc_size, lay.sizes
    owner[doc_at], owner[member_at] = np.arange(n_packs), pack_of
    names = np.empty(n + n_packs, dtype=object)
    names[doc_at], names[member_at] = "json", parts
    stops = [*start[1:].tolist(), end]
    if all(map(plain_key, pack_ids)):
        return (list(zip(pack_ids, start.tolist(), (np.asarray(stops, dtype=np.int64) - start).tolist())),
                list(zip(owner.tolist(), names.tolist(), offsets.tolist(), sizes.tolist())), end)
    headers = np.empty(n + n_packs, dtype=np.int64)
    headers[doc_at], headers[member_at] = start, data_at - lay.header_len
    return index_of([Entry(f"{pack_ids[p]}.{part}", at, size, "file", header=h) for p, part, at, size, h in zip(
        owner.tolist(), names.tolist(), offsets.tolist(), sizes.tolist(), headers.tolist())], end)
