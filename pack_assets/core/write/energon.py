"""The metadata that lets readers open an output folder as it is: Megatron-Energon's ``.nv-meta/`` (as
``energon prepare`` writes it: dataset.yaml, split.yaml, .info.json, index.sqlite, index.uuid) with each
shard's ``.tar.idx``, and webdataset's ``wids-index.json``. The index of a shard just written comes from
its layout (`layout.shard_index`), the rows of shards the last write left unchanged are taken from its
index (`LastIndex`), and only the others are read back from their tar headers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import struct
import urllib.parse
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from .. import store
from ..owned import NV_META, WIDS
from ..safety import file_sha256, mkstemp
from ..tario import Entry, group_by_key, iter_entries, split_key
from .publish import Publish

ENERGON_FORMAT = "7.4.1"  # the megatron-energon release whose `energon prepare` output this matches (tested)

# (key, header offset, size) per sample, (sample index, part, data offset, size) per member, end offset
Index = tuple[list[tuple[str, int, int]], list[tuple[int, str, int, int]], int]


def plain_key(pack_id: str) -> bool:
    """Whether every member `{pack_id}.{part}` has the key pack_id by the WebDataset rule (no dot, no
    folder) and is no __meta__ member."""
    return bool(pack_id) and "." not in pack_id and "/" not in pack_id and not (
        pack_id.startswith("__") and pack_id.endswith("__"))


def index_of(entries: list[Entry], end: int) -> Index:
    """The index of a shard's entries as a reader groups them (WebDataset keys)."""
    samples, parts = [], []
    groups = list(group_by_key(entries))
    for i, (key, entries) in enumerate(groups):
        start = entries[0].header
        stop = groups[i + 1][1][0].header if i + 1 < len(groups) else end
        samples.append((key, start, stop - start))
        parts += [(i, split_key(e.name)[1], e.offset, e.size) for e in entries]
    return samples, parts, end


def sample_index(path: Path) -> Index:
    """The index of a shard on disk (one the writer did not just write), read back from its tar headers."""
    trailer: list[int] = []
    with open(path, "rb") as f:
        entries = list(iter_entries(f, path.stat().st_size, trailer))
    return index_of(entries, trailer[0] if trailer else path.stat().st_size)


@dataclass(frozen=True)
class LastIndex:
    """What the writer's record says of the Energon index the last write left: its sha256, its tars in tar
    id order (``listed``); ``kept``: those unchanged since (size, mtime), whose rows stand."""
    sha256: str
    listed: list[str]
    kept: frozenset[str]

    @staticmethod
    def rows(db, tar_id: int, parts: bool = True) -> Index:
        samples = db.execute("SELECT sample_key, byte_offset, byte_size FROM samples WHERE tar_file_id = ? "
                             "ORDER BY sample_index", [tar_id]).fetchall()
        found = db.execute("SELECT sample_index, part_name, content_byte_offset, content_byte_size FROM sample_parts "
                           "WHERE tar_file_id = ? ORDER BY rowid", [tar_id]).fetchall() if parts else []
        return samples, found, (samples[-1][1] + samples[-1][2]) if samples else 0


@dataclass(frozen=True)
class EnergonMeta:
    """What `write_energon_meta` wrote: the folder's shards and each one's sample count, as its index has it."""
    folder: Path
    counts: dict[str, int]

    def check(self, planned: Iterable[tuple[str, int]]) -> None:
        """Every (shard, packs planned) holds one sample per pack in the index just written."""
        for shard, packs in planned:
            if self.counts[shard] != packs:
                raise RuntimeError(f"{shard}: {self.counts[shard]} samples on disk, {packs} packs planned")


def write_energon_meta(out_dir: Path, shard_names: list[str], fingerprint: str, publish: Publish,
                       indexes: dict[str, Index] | None = None, last: LastIndex | None = None,
                       built: IndexRows | None = None) -> EnergonMeta:
    """`.nv-meta/` as `energon prepare` writes it (dataset.yaml, split.yaml, .info.json, index.sqlite,
    index.uuid) plus each shard's `.tar.idx`, so Megatron-Energon loads the output as it is; each file written
    and fsynced into ``publish``, which puts them in place (the caller commits it). ``indexes``: the shards
    this run wrote, indexed as they were written; ``last``: the index the last write left, whose rows of its
    unchanged shards are kept (when those are its every tar and come first, as after an incremental plan, the
    new index starts as that file); the others are read back from their tar headers. ``built``: the index's
    rows already given as the shards came (`IndexRows`, for ``shard_names``), in place of ``indexes``/``last``."""
    meta = out_dir / NV_META
    meta.mkdir(parents=True, exist_ok=True)
    names = sorted(shard_names)
    rows = built if built is not None else IndexRows(out_dir, names, last)
    with rows:
        for name in names:
            if name in (indexes or {}):
                rows.add(name, indexes[name])
        counts = rows.finish(publish)
    publish.write(meta / "index.uuid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"pack_assets:{fingerprint}")).encode())
    publish.write(meta / "dataset.yaml", b"__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    split = "split_parts:\n  train:\n" + "".join(f"  - {n}\n" for n in names) + "  val: []\n  test: []\nexclude: []\n"
    publish.write(meta / "split.yaml", split.encode())
    info = {"energon_version": ENERGON_FORMAT, "shard_counts": {n: counts[n] for n in names}}
    publish.write(meta / ".info.json", json.dumps(info, indent=2).encode())
    return EnergonMeta(out_dir, counts)


@dataclass(frozen=True)
class _Start:
    """Where the new index.sqlite is written (a temp file) and what it starts from: ``base``, the last index
    copied as it is (its tars first and all kept); else empty, the last index's ``copied`` file read from."""
    tmp_db: str
    copied: str | None
    last: LastIndex | None
    base: bool


def _start(meta: Path, names: list[str], last: LastIndex | None) -> _Start:
    fd, tmp_db = mkstemp(prefix=".index.sqlite.tmp-", dir=meta)
    os.close(fd)
    try:
        if last is not None:  # hashed as copied: the rows kept are the rows the record vouches for
            try:
                shutil.copyfile(meta / "index.sqlite", tmp_db)
                vouched = file_sha256(tmp_db) == last.sha256
            except OSError:
                vouched = False
            if not vouched:
                last = None
                Path(tmp_db).write_bytes(b"")
        base = last is not None and names[:len(last.listed)] == last.listed and last.kept >= set(last.listed)
        if last is None or base:
            return _Start(tmp_db, None, last, base)
        fd, new_db = mkstemp(prefix=".index.sqlite.tmp-", dir=meta)  # the copy is read from; the new one starts empty
        os.close(fd)
        return _Start(new_db, tmp_db, last, False)
    except BaseException:
        Path(tmp_db).unlink(missing_ok=True)
        raise


class IndexRows:
    """index.sqlite being made, tar by tar in tar id order (the output folder's shards in name order), as each
    shard's rows become known: `add` a shard just written with its index as it was written (a writer's pool
    gives its shards in that order; the rows of the shards before it that no index is given for, found current
    or left by the last write, are taken then, as `finish` would), `finish` the rest, the table indexes and its
    `.tar.idx` files. The same statements in the same order, in one transaction, whenever they are made: the same
    file as made at the end (the tail after the last shard was all of them: docs/benchmarks.md, issue 41). Its
    temporary files are removed when the block ends unless `finish` handed them to the publish."""

    def __init__(self, out_dir: Path, names: list[str], last: LastIndex | None = None) -> None:
        self.out_dir, self.names, self.last = out_dir, sorted(names), last
        self.tar_ids = {n: i for i, n in enumerate(self.names)}
        self.given: dict[str, Index] = {}  # the shards given, not yet inserted (a later one's before)
        self.idx: list[tuple[str, bytes]] = []  # each tar's `.tar.idx`, in tar order
        self.counts: dict[str, int] = {}
        self.start: _Start | None = None
        self.db = self.old = None
        self.made_meta = False  # whether `.nv-meta/` was made here (removed again when left empty)

    def __enter__(self) -> IndexRows:
        return self

    def __exit__(self, *exc) -> None:
        self._close()
        if self.start is not None:  # not handed to the publish
            Path(self.start.tmp_db).unlink(missing_ok=True)
            if self.made_meta:
                with contextlib.suppress(OSError):
                    (self.out_dir / NV_META).rmdir()

    def _close(self) -> None:
        for con in (self.db, self.old):
            if con is not None:
                con.close()
        self.db = self.old = None
        if self.start is not None and self.start.copied is not None:
            Path(self.start.copied).unlink(missing_ok=True)

    def _open(self) -> None:
        meta = self.out_dir / NV_META
        self.made_meta = not meta.is_dir()
        meta.mkdir(parents=True, exist_ok=True)
        self.start = _start(meta, self.names, self.last)
        if self.start.copied is not None:
            self.old = sqlite3.connect(f"file:{urllib.parse.quote(self.start.copied)}?mode=ro", uri=True)
        self.db = sqlite3.connect(self.start.tmp_db)
        # a temp file until its rename: one fsync of the finished file (`publish`), not one per transaction, and no
        # rollback journal (a failed write leaves a temp file that is removed); the file's bytes depend on
        # neither, only on the statements and their order
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute("PRAGMA journal_mode = OFF")
        for sql in store.ENERGON_INDEX_TABLES:
            self.db.execute(sql)

    def add(self, name: str, index: Index) -> None:
        """A shard just written, with its index: its rows, and those of the shards before it not given one, in."""
        stop = self.tar_ids[name]
        if stop < len(self.counts):
            raise RuntimeError(f"{name}: its index given after a later shard's")
        self.given[name] = index
        self._rows(stop + 1)

    def _rows(self, stop: int) -> None:
        """The rows of the tars up to ``stop`` (not included) not yet in, in tar id order."""
        if self.start is None:
            self._open()
        for tar_id in range(len(self.counts), stop):
            name = self.names[tar_id]
            self.counts[name] = _tar_rows(self.db, self.old, self.out_dir, tar_id, name, self.given, self.start,
                                          self.idx)
            self.given.pop(name, None)

    def finish(self, publish: Publish) -> dict[str, int]:
        """The rest of the rows, the table indexes, the file into ``publish`` after the `.tar.idx` files (fsynced
        with the batch's other files); returns each shard's sample count."""
        self._rows(len(self.names))
        for sql in store.ENERGON_INDEX_INDEXES:
            self.db.execute(sql)
        self.db.commit()
        self._close()
        for path, data in self.idx:
            publish.write(self.out_dir / path, data)
        publish.written(self.start.tmp_db, self.out_dir / NV_META / "index.sqlite")
        self.start = None
        return self.counts


def _tar_rows(db, old, out_dir: Path, tar_id: int, name: str, indexes: dict[str, Index], start: _Start,
              idx: list[tuple[str, bytes]]) -> int:
    """Tar ``tar_id``'s rows in the new index (kept, as written, from the last index, or read back) and its
    `.tar.idx` (its name and bytes added to ``idx``); returns its sample count."""
    last = start.last
    if start.base and tar_id < len(last.listed):
        samples, _, end = LastIndex.rows(db, tar_id, parts=False)
    else:
        if name in indexes:
            samples, parts, end = indexes[name]
        elif old is not None and name in last.kept:  # kept: in the record, so in its listing
            samples, parts, end = LastIndex.rows(old, last.listed.index(name))
        else:
            samples, parts, end = sample_index(out_dir / name)
        db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                       [(tar_id, k, i, off, size) for i, (k, off, size) in enumerate(samples)])
        insert_parts(db, tar_id, parts)
    idx.append((f"{name}.idx", struct.pack(f"<{len(samples) + 1}Q", *[off for _, off, _ in samples], end)))
    return len(samples)


PARTS_PER_INSERT = 200  # sample_parts' rows one INSERT statement holds (800 parameters: under SQLite's old 999)


def insert_parts(db, tar_id: int, parts: list[tuple]) -> None:
    """Tar ``tar_id``'s sample_parts rows (sample index, part, data offset, size), in order, PARTS_PER_INSERT rows
    a statement: the same rows in the same order, so the same file, as a statement per row, whose binding and
    stepping per row took twice the time (docs/benchmarks.md, issue 41)."""
    parts = parts if isinstance(parts, list) else list(parts)
    full = len(parts) - len(parts) % PARTS_PER_INSERT
    row, width = f"({int(tar_id)}, ?, ?, ?, ?)", 4 * PARTS_PER_INSERT
    if full:
        flat = list(chain.from_iterable(parts[:full]))
        db.executemany("INSERT INTO sample_parts VALUES " + ", ".join([row] * PARTS_PER_INSERT),
                       [flat[i:i + width] for i in range(0, len(flat), width)])
    if full < len(parts):
        db.executemany(f"INSERT INTO sample_parts VALUES {row}", parts[full:])


def write_wids_index(meta: EnergonMeta, publish: Publish) -> None:
    """`wids-index.json` into ``publish``: the shard list with sample counts that webdataset's `wids` reads for
    random access."""
    counts = meta.counts
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": meta.folder.name,
             "shardlist": [{"url": n, "nsamples": counts[n]} for n in sorted(counts)]}
    publish.write(meta.folder / WIDS, json.dumps(index, indent=2).encode())
