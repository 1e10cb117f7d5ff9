"""A copy-mode output shard prepared and written a batch of packs at a time, not all at once: its rows stay in
the catalog's Arrow tables (compact columns) and become Python objects (`bulk.Columns`, then `bulk.BulkPack`)
for at most BATCH_SAMPLES samples at once. Every pack's `_meta` carries the shard's fingerprint, which covers
all its samples, so the batches are gone through twice: once for the fingerprint's lines (fed batch after batch
to one hash: the same digest), once for the packs. The bytes are `bulk.build_shard`'s (a test compares them)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .bulk import _MEMBER_COLUMNS, _SAMPLE_COLUMNS, BulkPack, _columns, _lists, build_packs, fingerprint_text
from .fingerprints import ShardFingerprint
from .layout import Layout, merged

BATCH_SAMPLES = 8192  # samples made Python objects at once (a larger pack alone)


def pack_firsts(pack_id: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Each pack's first sample (one more at the end: the samples' count), from ``pack_id`` per sample in pack
    order."""
    n = len(pack_id)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    changed = pc.not_equal(pack_id.slice(1), pack_id.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return np.concatenate(([0], np.flatnonzero(changed) + 1, [n])).astype(np.int64)


def _counts(col: pa.ChunkedArray) -> np.ndarray:
    """A count column as int64, null as 0 (numpy: `pc.fill_null`'s first call in a process costs a writer more
    than the rest of a small shard's preparation)."""
    return np.nan_to_num(col.to_numpy(), nan=0).astype(np.int64)


def pack_cuts(firsts: np.ndarray, batch: int) -> list[int]:
    """Where the batches start (one more at the end), each of whole packs (``firsts``: `pack_firsts`) and of at
    most ``batch`` samples unless one pack holds more."""
    firsts = firsts.tolist()
    cuts = [0]
    for k in range(1, len(firsts)):
        if firsts[k] - cuts[-1] > batch and firsts[k - 1] > cuts[-1]:  # this pack would overfill the batch
            cuts.append(firsts[k - 1])
    if firsts[-1] > 0:
        cuts.append(firsts[-1])
    return cuts


class Gather:
    """Rows of an Arrow table picked by their row numbers, chunk by chunk: ``take`` on a table of several chunks
    concatenates them first (all of it copied, each call), and one concatenation kept would be a second copy of
    the table beside the one read (`StreamShard`'s conversations: ~150 MiB at a 313k-sample shard)."""

    def __init__(self, table: pa.Table) -> None:
        self.batches = table.to_batches()
        self.starts = np.cumsum([0] + [b.num_rows for b in self.batches]).astype(np.int64)

    def rows(self, at: np.ndarray, columns: list[int]) -> list[pa.Array]:
        """Columns ``columns`` of rows ``at`` (row numbers in the table), in the order of ``at``."""
        order = np.argsort(at, kind="stable")
        wanted = at[order]
        cuts = np.searchsorted(wanted, self.starts)
        parts = [self.batches[k].select(columns).take(pa.array(wanted[cuts[k]:cuts[k + 1]] - self.starts[k]))
                 for k in range(len(self.batches)) if cuts[k + 1] > cuts[k]]
        back = pa.array(np.argsort(order, kind="stable"))  # each row of ``at``: where it is in ``wanted``
        return pa.Table.from_batches(parts).combine_chunks().take(back).columns  # (``at``: one row at least)


class StreamShard:
    """One output shard from its rows (`bulk.group_tables`' Arrow slices: output_shard first): its fingerprint
    now, its packs batch by batch (`batches`); after them, its members' layout and part names for its index."""

    def __init__(self, name: str, input_root, samples: pa.Table | None, members: pa.Table | None,
                 conversations: pa.Table | None, context: dict, batch: int | None = None) -> None:
        self.name, self.input_root = name, input_root
        self._samples, self._members = samples, members
        n = 0 if samples is None else samples.num_rows
        self.samples = n
        if n:
            counts = _counts(samples.column("n_media")) + _counts(samples.column("n_extra"))
            firsts = pack_firsts(samples.column("pack_id"))
            self._cuts, self.n_packs = pack_cuts(firsts, batch or BATCH_SAMPLES), len(firsts) - 1
            self._member_at = np.concatenate(([0], np.cumsum(counts)))
            order = pc.index_in(samples.column("sample_id"), value_set=conversations.column("sample_id")) \
                if conversations is not None else pa.nulls(n, pa.int32())
            if order.null_count:
                raise KeyError(f"{name}: a sample of this shard has no conversation in the catalog")
            # their rows for each batch gathered chunk by chunk (`Gather`): not made one chunk first, a copy of all
            # of them beside the table read (a take from several chunks would concatenate them, each batch again)
            self._order, self._conversations = order.to_numpy(zero_copy_only=False), Gather(conversations)
        else:
            self._cuts, self._member_at, self.n_packs = [0], np.zeros(1, dtype=np.int64), 0
        fp = ShardFingerprint(context)
        for cols in self._each(with_text=False):
            fp.text(fingerprint_text(cols))
        self.fingerprint = fp.hexdigest()
        self.context = {**context, "shard_fingerprint": self.fingerprint}
        # the first batch's packs built here, in the loader, as a whole shard's were: beside the fsync of the shard
        # before, and its reads prefetched as soon as its writing starts
        self._rest = self._each(with_text=True)
        first = next(self._rest, None)
        self._first = None if first is None else build_packs(first, self.context)
        self.layout: Layout | None = None
        self.parts: list[str] = []

    def _each(self, with_text: bool) -> Iterator:
        """Each batch's `bulk.Columns`; without ``with_text``, without the conversations (the fingerprint takes
        their sha256, which the catalog gives)."""
        for a, b in zip(self._cuts, self._cuts[1:]):
            m0, m1 = int(self._member_at[a]), int(self._member_at[b])
            conv = self._conversations.rows(self._order[a:b], [1, 2, 3] if with_text else [1, 3])
            sid, sha = conv[0].to_pylist(), conv[-1].to_pylist()
            text = conv[1].to_pylist() if with_text else [None] * len(sid)
            members = self._members.slice(m0, m1 - m0) if self._members is not None and m1 > m0 else None
            yield _columns(self.input_root, self.name, _lists(self._samples.slice(a, b - a), _SAMPLE_COLUMNS),
                           _lists(members, _MEMBER_COLUMNS), dict(zip(sid, zip(text, sha))))

    def batches(self) -> Iterator[list[BulkPack]]:
        """The shard's packs, a batch at a time; once they are all given, ``layout`` and ``parts`` are set."""
        layouts, parts = [], []
        first, self._first = self._first, None
        for packs, lay, names in chain([first] if first else [], (build_packs(c, self.context) for c in self._rest)):
            layouts.append(lay)
            parts += names
            yield packs
        self.layout, self.parts = merged(layouts), parts
        self._samples = self._members = self._conversations = None  # written: its rows are not needed again
