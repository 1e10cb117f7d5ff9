"""One copy-mode output shard: a tar of one sample per pack (its JSON document, then its media and extra
members as the source bytes), written with fixed header fields (mtime 0, uid/gid 0, mode 0644, PAX format)
and a stable member order, so the same job gives the same bytes. It is written under a temporary name,
fsynced, then renamed: no partial file is ever visible under a final name. A shard whose first pack already
carries the job's fingerprint is left as it is."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from .. import faults, safety
from ..safety import mkstemp  # temp files that end with the umask's mode, not mkstemp's 0600
from ..tario import BLOCK, RECORD, first_pack_meta, member_header, padding
from .bulk import BulkPack, BulkShard, build_shard, job_columns
from .energon import Index, IndexBuilder
from .jobs import ShardJob, ShardResult, dumps, encode_str
from .syscalls import SMALL_READ, Arena, Sources, copy_range, prefetch_aside, start_writeback, writev_all

WRITEBACK_EVERY = 8 << 20  # the disk's writing is started every this many bytes written (`start_writeback`)


def write_shard(out_dir: str, job: BulkShard | ShardJob, context: dict) -> ShardResult:
    """Write one output shard atomically; skip it when a shard with the same content is already there
    (a rerun after a crash, or the untouched shards of an incremental plan). ``job``: prepared in bulk
    (`bulk.build_shard`, inside the writer process), or a ShardJob."""
    t0 = time.perf_counter()
    if isinstance(job, ShardJob):
        job = build_shard(job.name, job_columns(job), context)
    final = Path(out_dir) / job.name
    result = ShardResult(job.name, False, 0, len(job.packs), job.samples, fingerprint=job.fingerprint)
    if final.exists():
        meta = first_pack_meta(final)
        if meta and meta.get("shard_fingerprint") == job.fingerprint:
            return replace(result, skipped=True, bytes=final.stat().st_size, seconds=time.perf_counter() - t0)
    written, index = _write_new(out_dir, job, final)
    return replace(result, bytes=written, seconds=time.perf_counter() - t0, index=index)


def _write_new(out_dir: str, job: BulkShard, final: Path) -> tuple[int, Index]:
    """The shard written under a temporary name and renamed into place: its size and its Energon index."""
    sources, arena = Sources(), Arena()
    prefetch = prefetch_aside([r[:3] for p in job.packs for r in p.reads]
                              + [m[3:5] + m[1:2] for p in job.packs for m in p.members if m[2] < 0])
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    out = _ShardFile(fd, IndexBuilder(p.pack_id for p in job.packs))
    try:
        for pack in job.packs:
            out.pack(pack, sources, arena)
        written = out.finish()
        os.close(fd)
        fd = -1
        safety.replace(tmp, final)  # the folder fsynced too: the name survives a power cut
    except BaseException as e:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        faults.raise_device_fault(e, f"{final} (from {', '.join(sorted(sources.files)) or 'its sources'})", "writing")
        raise
    finally:
        sources.close()
        prefetch.join()
    return written, out.index.index(out.end)


class _ShardFile:
    """An output shard being written to ``fd``, pack after pack: a pack's headers, record and small members
    go out in one ``os.writev``, media of the cut or more are copied in kernel between; the disk's writeback is
    started as the shard grows; the Energon index is kept as members are placed."""

    def __init__(self, fd: int, index: IndexBuilder) -> None:
        self.fd, self.index = fd, index
        self.pos = 0  # bytes written so far
        self.end = 0  # where the last member ends (the tar's end-of-archive blocks follow)
        self.flushed = 0  # bytes whose writeback was started
        self.pending: list = []  # buffers not yet written: one os.writev per pack instead of three writes per member

    def pack(self, pack: BulkPack, sources: Sources, arena: Arena) -> None:
        start, pack_id = self.pos, pack.pack_id
        got = [_read(sources, arena, *r) for r in pack.reads]
        texts = [_source(got[r[0]][r[1]:r[2]], r[3]) if r is not None else "null" for r in pack.records]
        body = "".join([x for pair in zip(pack.heads, texts) for x in pair] + [pack.tail]).encode("utf-8")
        self._buffered(pack_id, f"{pack_id}.json", body, len(body))
        for m in pack.members:
            if m[2] >= 0:
                self._buffered(pack_id, m[0], got[m[2]][m[3]:m[4]], m[1])
            elif m[3] in sources.no_kernel_copy and m[1] < SMALL_READ:  # the kernel refused: read, not copied
                self._buffered(pack_id, m[0], _read(sources, arena, m[3], m[4], m[1], m[5], False), m[1])
            else:  # large: copied in kernel after what is pending
                self._copied(pack_id, m[0], m[1], *m[3:], sources)
        writev_all(self.fd, self.pending)
        self.pending = []
        arena.reset()
        self.index.pack(pack.pack_id, start, self.pos)
        if self.pos - self.flushed >= WRITEBACK_EVERY:
            start_writeback(self.fd, self.flushed, self.pos - self.flushed)
            self.flushed = self.pos

    def _buffered(self, pack_id: str, name: str, data, size: int) -> None:
        header = member_header(name, size)
        self.index.member(pack_id, name, self.pos, self.pos + len(header), size)
        self.pending += [header, data, padding(size)]
        self.pos += len(header) + size + (-size % BLOCK)

    def _copied(self, pack_id: str, name: str, size: int, src: str, offset: int, source_name: str,
                sources: Sources) -> None:
        header = member_header(name, size)
        self.index.member(pack_id, name, self.pos, self.pos + len(header), size)
        self.pending.append(header)
        writev_all(self.fd, self.pending)
        self.pending = []
        if not copy_range(sources.get(src).fileno(), offset, size, self.fd, f"{src}: {source_name}",
                          src not in sources.no_kernel_copy):
            sources.no_kernel_copy.add(src)
        self.pending.append(padding(size))
        self.pos += len(header) + size + (-size % BLOCK)

    def finish(self) -> int:
        """The end-of-archive blocks, padded to a whole record, and the file synced: returns its size."""
        self.end = self.pos
        tail = 2 * BLOCK
        tail += -(self.end + tail) % RECORD
        writev_all(self.fd, [bytes(tail)])
        os.fsync(self.fd)
        return self.end + tail


def _read(sources: Sources, arena: Arena, path: str, offset: int, size: int, what: str, span: bool) -> memoryview:
    """One of a pack's reads (`bulk.BulkPack.reads`) into the arena; a source that ends early is an error."""
    buf = arena.pread(sources.get(path).fileno(), size, offset)
    if len(buf) != size:
        raise OSError(f"{path}: sample {what} ends early ({len(buf)} of {size} bytes at offset {offset})" if span
                      else f"{path}: {what} ends early ({len(buf)} of {size} bytes)")
    return memoryview(buf)


def _source(raw, is_json: bool) -> str:
    """A sample's record as the pack document holds it: a .json record parsed and dumped again, another
    one as a JSON string."""
    text = str(raw, "utf-8")
    return dumps(json.loads(text)) if is_json else encode_str(text)
