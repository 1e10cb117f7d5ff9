"""The plan's packs as index arrays: memory at 10M samples.

A `Pack` object per pack held every member's sample id and length as Python objects (~0.24 KB per sample
with the planner's inputs). A `PackTable` holds the packs as arrays: the members' row indices into one array
of sample ids (NumPy's variable-width ``StringDType``, each id once), their lengths, and per pack its offset,
media type, number, output shard, media bytes and overlong flag. The ids are looked up a batch of packs at a
time, when pack_plan.jsonl is written (`PackTable.jsonl`) and when the catalog's rows are made
(`PackTable.batches`: Arrow built on buffers, never from Python objects, which makes pyarrow import pandas).
Iterating a table gives `Pack` objects one at a time, for the few readers that want them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

IDS = np.dtypes.StringDType()  # a sample id array: ids stored once in NumPy's arena, not as Python str objects
BATCH_MEMBERS = 1 << 16  # ids per Arrow batch of `PackTable.batches` (at 10M samples, 16,384 packs held 5M)


@dataclass
class Pack:
    pack_id: str
    media_type: str
    sample_ids: list[str]
    sample_token_lens: list[int]
    total_token_len: int
    output_shard: str = ""
    media_bytes: int = 0
    overlong: bool = False
    # a blend's plan (core/blend.py): per member its dataset and copy, and the plan's epoch
    datasets: list[str] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)
    epoch: int = 0


def pack_id(number: int) -> str:
    return f"p{number:08d}"


def shard_name(number: int) -> str:
    return f"packed-{number:06d}.tar"


def shard_number(name: str) -> int:
    return int(name[len("packed-"):-len(".tar")])


def shard_numbers(media_bytes: Sequence[int], max_packs: int, target_bytes: int, first: int = 0) -> np.ndarray:
    """Each pack's output shard in order: a new shard once one holds ``max_packs`` packs or the next pack's
    media would take it past ``target_bytes``."""
    out = np.empty(len(media_bytes), np.int64)
    shard, size, count = first, 0, 0
    for k, b in enumerate(media_bytes):
        if count and (count >= max_packs or size + b > target_bytes):
            shard, size, count = shard + 1, 0, 0
        out[k] = shard
        size += b
        count += 1
    return out


def _buffer(a: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.ascontiguousarray(a))


def _strings(values: list[str]) -> pa.Array:
    """A string Array of ``values`` built on its buffers (no pandas import)."""
    parts = [s.encode("utf-8") for s in values]
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), len(parts), [None, _buffer(offsets), pa.py_buffer(b"".join(parts))])


def _ints(a: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), len(a), [None, _buffer(a.astype(np.int64))])


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.Array.from_buffers(pa.large_list(values.type), len(offsets) - 1, [None, _buffer(offsets)],
                                 children=[values])


_SCHEMA = pa.schema([("pack_id", pa.large_string()), ("media_type", pa.large_string()),
                     ("sample_ids", pa.large_list(pa.large_string())), ("sample_token_lens", pa.large_list(pa.int64())),
                     ("total_token_len", pa.int64()), ("output_shard", pa.large_string()), ("overlong", pa.bool_())])


@dataclass
class PackTable:
    """Packs in output order; pack k's members are ``members[offsets[k]:offsets[k + 1]]`` (indices into
    ``ids``) with token lengths ``lens`` at the same positions. Every pack has a member."""

    ids: np.ndarray  # sample ids (IDS dtype)
    members: np.ndarray  # int64
    lens: np.ndarray  # int64, per member
    offsets: np.ndarray  # int64, packs + 1
    media_types: np.ndarray  # object (a few shared str), per pack
    numbers: np.ndarray  # int64: pack ids p<number:08d>
    shards: np.ndarray  # int64: output shards packed-<shard:06d>.tar
    media_bytes: np.ndarray  # int64
    overlong: np.ndarray  # bool

    @classmethod
    def of_units(cls, ids: np.ndarray, lengths: np.ndarray, media_bytes: np.ndarray, units: list) -> PackTable:
        """Packs numbered from 0 from ``units`` (media type, item indices, kept alone though overlong), in order."""
        n = len(units)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter((len(u[1]) for u in units), np.int64, n), out=offsets[1:])
        members = np.concatenate([u[1] for u in units]).astype(np.int64, copy=False) if n else np.zeros(0, np.int64)
        mb = np.add.reduceat(media_bytes[members], offsets[:-1]) if n else np.zeros(0, np.int64)
        return cls(ids, members, lengths[members], offsets, np.asarray([u[0] for u in units], dtype=object),
                   np.arange(n, dtype=np.int64), np.zeros(n, np.int64), mb.astype(np.int64),
                   np.asarray([bool(u[2]) for u in units], dtype=bool))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def totals(self) -> np.ndarray:
        """Each pack's total token length."""
        return np.add.reduceat(self.lens, self.offsets[:-1]) if len(self) else np.zeros(0, np.int64)

    def pack(self, k: int) -> Pack:
        a, b = int(self.offsets[k]), int(self.offsets[k + 1])
        lens = self.lens[a:b].tolist()
        return Pack(pack_id(int(self.numbers[k])), self.media_types[k], self.ids[self.members[a:b]].tolist(), lens,
                    int(sum(lens)), shard_name(int(self.shards[k])), int(self.media_bytes[k]), bool(self.overlong[k]))

    def __iter__(self) -> Iterator[Pack]:
        return (self.pack(k) for k in range(len(self)))

    def __getitem__(self, k):
        return [self.pack(j) for j in range(len(self))[k]] if isinstance(k, slice) else self.pack(range(len(self))[k])

    def rows(self, start: int, stop: int) -> Iterator[tuple[str, str, list[str], list[int], int]]:
        """(pack id, media type, sample ids, lengths, total) of packs ``start:stop``, the ids looked up at once."""
        stop = min(stop, len(self))
        if start >= stop:
            return
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        ids, lens = self.ids[self.members[lo:hi]].tolist(), self.lens[lo:hi].tolist()
        bounds = (self.offsets[start:stop + 1] - lo).tolist()
        for k in range(stop - start):
            a, b = bounds[k], bounds[k + 1]
            yield (pack_id(int(self.numbers[start + k])), self.media_types[start + k], ids[a:b], lens[a:b],
                   sum(lens[a:b]))

    def jsonl(self, start: int = 0, stop: int | None = None) -> str:
        """pack_plan.jsonl's lines of packs ``start:stop``."""
        return "".join(json.dumps({"pack_id": p, "media_type": mt, "sample_ids": ids, "sample_token_lens": lens,
                                   "total_token_len": total}) + "\n"
                       for p, mt, ids, lens, total in self.rows(start, len(self) if stop is None else stop))

    def batches(self, step: int = 1 << 14, members: int = BATCH_MEMBERS) -> pa.RecordBatchReader:
        """The catalog's pack_plan rows (`store.PACK_PLAN_SCHEMA`'s columns; DuckDB casts them to its types),
        made at most ``step`` packs and about ``members`` members (at least one pack) at a time as the reader
        is read."""
        return pa.RecordBatchReader.from_batches(_SCHEMA, self._batches(step, members))

    def _batches(self, step: int, members: int) -> Iterator[pa.RecordBatch]:
        start = 0
        while start < len(self):
            # the packs whose members end within ``members`` of this batch's first: a batch's ids pass through
            # Python str and bytes objects (~0.2 KB an id), so its size is bounded in ids, not in packs
            fit = int(np.searchsorted(self.offsets, self.offsets[start] + members, side="right")) - 1
            stop = min(start + step, len(self), max(start + 1, fit))
            lo, hi = int(self.offsets[start]), int(self.offsets[stop])
            offs = self.offsets[start:stop + 1] - lo
            cols = [_strings([pack_id(n) for n in self.numbers[start:stop].tolist()]),
                    _strings(self.media_types[start:stop].tolist()),
                    _lists(offs, _strings(self.ids[self.members[lo:hi]].tolist())),
                    _lists(offs, _ints(self.lens[lo:hi])), _ints(np.add.reduceat(self.lens[lo:hi], offs[:-1])),
                    _strings([shard_name(s) for s in self.shards[start:stop].tolist()]),
                    pa.Array.from_buffers(pa.bool_(), stop - start, [None, pa.py_buffer(
                        np.packbits(self.overlong[start:stop], bitorder="little"))])]
            yield pa.RecordBatch.from_arrays(cols, schema=_SCHEMA)
            start = stop

    def select(self, keep: np.ndarray) -> PackTable:
        """The packs with only the members where ``keep`` (per member) holds; a pack left empty is removed."""
        pack_of = np.repeat(np.arange(len(self)), self.sizes())
        left = np.bincount(pack_of[keep], minlength=len(self))
        alive = left > 0
        offsets = np.zeros(int(alive.sum()) + 1, np.int64)
        np.cumsum(left[alive], out=offsets[1:])
        return PackTable(self.ids, self.members[keep], self.lens[keep], offsets, self.media_types[alive],
                         self.numbers[alive], self.shards[alive], self.media_bytes[alive], self.overlong[alive])

    def concat(self, other: PackTable) -> PackTable:
        """This table's packs, then ``other``'s (whose members index its own ids)."""
        return PackTable(np.concatenate([self.ids, other.ids]),
                         np.concatenate([self.members, other.members + len(self.ids)]),
                         np.concatenate([self.lens, other.lens]),
                         np.concatenate([self.offsets, other.offsets[1:] + self.offsets[-1]]),
                         np.concatenate([self.media_types, other.media_types]),
                         *(np.concatenate([getattr(self, f), getattr(other, f)])
                           for f in ("numbers", "shards", "media_bytes", "overlong")))


def arrow_ints(col: pa.Array) -> np.ndarray:
    """An integer Arrow array without nulls as NumPy, read on its buffer: pyarrow's ``to_numpy`` imports pandas,
    which the command's own process never needs."""
    dtype = np.dtype(str(col.type))
    return np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col), offset=col.offset * dtype.itemsize)


def _list_offsets(col: pa.Array) -> np.ndarray:
    offs = col.offsets
    return arrow_ints(offs).astype(np.int64) - offs[0].as_py()


def from_batches(batches) -> PackTable:
    """A stored plan's packs from Arrow batches of pack_plan rows (pack_id, media_type, sample_ids,
    sample_token_lens, output_shard, overlong; in output order), a batch's ids turned into Python strs at once."""
    parts: dict[str, list[np.ndarray]] = {}
    names: dict[str, str] = {}  # each media type one shared str
    for b in batches:
        c = dict(zip(b.schema.names, b.columns))
        got = {"ids": np.asarray(c["sample_ids"].flatten().to_pylist(), dtype=IDS),
               "lens": arrow_ints(c["sample_token_lens"].flatten()).astype(np.int64),
               "sizes": np.diff(_list_offsets(c["sample_ids"])),
               "media_types": np.asarray([names.setdefault(m, m) for m in c["media_type"].to_pylist()], dtype=object),
               "numbers": np.asarray([int(p[1:]) for p in c["pack_id"].to_pylist()], dtype=np.int64),
               "shards": np.asarray([shard_number(s) for s in c["output_shard"].to_pylist()], dtype=np.int64),
               "overlong": np.asarray(c["overlong"].to_pylist(), dtype=bool)}
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
    if not parts:
        return empty()
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    offsets = np.zeros(len(cat["sizes"]) + 1, np.int64)
    np.cumsum(cat["sizes"], out=offsets[1:])
    return PackTable(cat["ids"], np.arange(len(cat["ids"]), dtype=np.int64), cat["lens"], offsets, cat["media_types"],
                     cat["numbers"], cat["shards"], np.zeros(len(offsets) - 1, np.int64), cat["overlong"])


def empty(ids: np.ndarray | None = None) -> PackTable:
    z = np.zeros(0, np.int64)
    return PackTable(np.asarray([], IDS) if ids is None else ids, z, z, np.zeros(1, np.int64),
                     np.asarray([], object), z, z, z, np.zeros(0, bool))
