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
from dataclasses import dataclass, replace
from pathlib import Path

from .. import faults
from ..safety import mkstemp  # temp files that end with the umask's mode, not mkstemp's 0600
from ..tario import BLOCK, RECORD, first_pack_meta, member_header, padding
from .batches import StreamShard
from .bulk import BulkPack, BulkShard, build_shard, job_columns
from .jobs import ShardJob, ShardResult, dumps, encode_str
from .layout import shard_index
from .places import EXACT, JSON
from .syscalls import SMALL_READ, Arena, Sources, copy_range, prefetch_aside, start_writeback, writev_all

WRITEBACK_EVERY = 8 << 20  # the disk's writing is started every this many bytes written (`start_writeback`)


def write_shard(out_dir: str, job: StreamShard | BulkShard | ShardJob, context: dict) -> ShardResult:
    """Write one output shard atomically; skip it when a shard with the same content is already there
    (a rerun after a crash, or the untouched shards of an incremental plan). ``job``: prepared in bulk a
    batch of packs at a time (`batches.StreamShard`) or at once (`bulk.build_shard`), inside the writer
    process, or a ShardJob."""
    return end_shard(begin_shard(out_dir, job, context))


def begin_shard(out_dir: str, job: StreamShard | BulkShard | ShardJob, context: dict) -> ShardResult | Unsynced:
    """`write_shard` up to the fsync: the shard's bytes written under a temporary name (an Unsynced, which
    `end_shard` syncs and renames into place), or the result of a shard found already there."""
    t0 = time.perf_counter()
    if isinstance(job, ShardJob):
        job = build_shard(job.name, job_columns(job), context)
    final = Path(out_dir) / job.name
    result = ShardResult(job.name, False, 0, job.n_packs, job.samples, fingerprint=job.fingerprint)
    if final.exists():
        meta = first_pack_meta(final)
        if meta and meta.get("shard_fingerprint") == job.fingerprint:
            return replace(result, skipped=True, bytes=final.stat().st_size, seconds=time.perf_counter() - t0)
    sources, arena, prefetches, pack_ids = Sources(), Arena(), [], []
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    out = _ShardFile(fd)
    try:
        for packs in job.batches():
            prefetches.append(prefetch_aside([r[:3] for p in packs for r in p.reads]
                                             + [m[1:4] for p in packs for m in p.members if m[0] < 0]))
            for pack in packs:
                out.pack(pack, sources, arena)
                pack_ids.append(pack.pack_id)
        written = out.finish()
        what = _what(final, sources)  # before the sources close
    except BaseException as e:
        _discard(fd, tmp)
        faults.raise_device_fault(e, _what(final, sources), "writing")
        raise
    finally:
        sources.close()
        for prefetch in prefetches:
            prefetch.join()
    return Unsynced(replace(result, bytes=written), fd, tmp, final, what, t0,
                    (pack_ids, job.layout, job.parts, out.docs, out.end))


@dataclass(slots=True)
class Unsynced:
    """A shard whose bytes are written under its temporary name ``tmp`` (open as ``fd``), not yet fsynced nor
    renamed: ``result`` without its time and index (``index``: `layout.shard_index`'s arguments)."""
    result: ShardResult
    fd: int
    tmp: str
    final: Path
    what: str  # the shard and its sources, for a device fault's message
    t0: float
    index: tuple


def end_shard(begun: ShardResult | Unsynced) -> ShardResult:
    """An Unsynced shard fsynced, closed and renamed into place, with its Energon index; a shard found already
    there as it is. The folder is fsynced once, with the metadata published after the shards (`publish.py`):
    the name survives a power cut from then on, before the writer's record says it is done."""
    if isinstance(begun, ShardResult):
        return begun
    try:
        os.fsync(begun.fd)
        os.close(begun.fd)
        begun.fd = -1
        os.replace(begun.tmp, begun.final)
    except BaseException as e:
        _discard(begun.fd, begun.tmp)
        faults.raise_device_fault(e, begun.what, "writing")
        raise
    return replace(begun.result, seconds=time.perf_counter() - begun.t0, index=shard_index(*begun.index))


def _what(final: Path, sources: Sources) -> str:
    return f"{final} (from {', '.join(sorted(sources.files)) or 'its sources'})"


def _discard(fd: int, tmp: str) -> None:
    """A shard that failed: its file closed (unless ``fd`` is -1) and its temporary name removed."""
    if fd >= 0:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


class _ShardFile:
    """An output shard being written to ``fd``, pack after pack: a pack's document, headers, record and small
    members go out in one ``os.writev`` (the headers and paddings built with the shard, `layout.py`), media of
    the cut or more are copied in kernel between; the disk's writeback is started as the shard grows; each
    pack's place and document size are kept for its Energon index (`layout.shard_index`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pos = 0  # bytes written so far
        self.end = 0  # where the last member ends (the tar's end-of-archive blocks follow)
        self.flushed = 0  # bytes whose writeback was started
        self.docs: list[tuple[int, int, int]] = []  # per pack: where it starts, its document's header and size

    def pack(self, pack: BulkPack, sources: Sources, arena: Arena) -> None:
        got = _reads(sources, arena, pack.reads)
        texts = [_source(got[r[0]][r[1]:r[2]], r[3]) if r is not None else b"null" for r in pack.records]
        body = b"".join([x for pair in zip(pack.heads, texts) for x in pair] + [pack.tail])
        header = member_header(f"{pack.pack_id}.json", len(body))
        self.docs.append((self.pos, len(header), len(body)))
        bufs = [header, body, padding(len(body))]
        if pack.copied:
            self._members(pack, got, bufs, sources, arena)
        else:  # every member read: header, data, padding, member after member, in one os.writev
            n = len(pack.members)
            bufs += [None] * (3 * n)
            bufs[3::3], bufs[5::3] = pack.headers, pack.pads
            bufs[4::3] = [got[r][a:b] for r, a, b in pack.members]
            writev_all(self.fd, bufs)
        arena.reset()
        self.pos += len(header) + len(body) + (-len(body) % BLOCK) + pack.span
        if self.pos - self.flushed >= WRITEBACK_EVERY:
            start_writeback(self.fd, self.flushed, self.pos - self.flushed)
            self.flushed = self.pos

    def _members(self, pack: BulkPack, got: list, pending: list, sources: Sources, arena: Arena) -> None:
        """A pack's members where some are copied in kernel: what is pending written before each of those."""
        for m, header, pad in zip(pack.members, pack.headers, pack.pads):
            if m[0] >= 0:
                pending += [header, got[m[0]][m[1]:m[2]], pad]
            elif m[1] in sources.no_kernel_copy and m[3] < SMALL_READ:  # the kernel refused: read, not copied
                pending += [header, _read(sources, arena, m[1], m[2], m[3], m[4], False), pad]
            else:  # large: copied in kernel after what is pending
                pending.append(header)
                writev_all(self.fd, pending)
                pending.clear()
                src, offset, size, source_name = m[1:]
                if not copy_range(sources.get(src).fileno(), offset, size, self.fd, f"{src}: {source_name}",
                                  src not in sources.no_kernel_copy):
                    sources.no_kernel_copy.add(src)
                pending.append(pad)
        writev_all(self.fd, pending)

    def finish(self) -> int:
        """The end-of-archive blocks, padded to a whole record (the file not yet synced): returns its size."""
        self.end = self.pos
        tail = 2 * BLOCK
        tail += -(self.end + tail) % RECORD
        writev_all(self.fd, [bytes(tail)])
        return self.end + tail


def _reads(sources: Sources, arena: Arena, reads: list[tuple]) -> list[memoryview]:
    """A pack's reads (`bulk.BulkPack.reads`) into the arena, in order, each source's descriptor looked up once
    per pack (a pack reads ~25 samples' spans, from a few sources); a source that ends early is an error."""
    got, fds, pread = [], {}, arena.pread
    for path, offset, size, what, span in reads:
        fd = fds.get(path)
        if fd is None:
            if len(fds) >= sources.limit - 1:  # the next open could close one of them (the LRU's oldest): forgotten
                fds.clear()
            fd = fds[path] = sources.get(path).fileno()
        buf = pread(fd, size, offset)
        if len(buf) != size:
            _ends_early(path, offset, size, what, span, len(buf))
        got.append(buf)
    return got


def _read(sources: Sources, arena: Arena, path: str, offset: int, size: int, what: str, span: bool) -> memoryview:
    """One of a pack's reads (`bulk.BulkPack.reads`) into the arena; a source that ends early is an error."""
    buf = arena.pread(sources.get(path).fileno(), size, offset)
    if len(buf) != size:
        _ends_early(path, offset, size, what, span, len(buf))
    return buf


def _ends_early(path: str, offset: int, size: int, what: str, span: bool, got: int) -> None:
    raise OSError(f"{path}: sample {what} ends early ({got} of {size} bytes at offset {offset})" if span
                  else f"{path}: {what} ends early ({got} of {size} bytes)")


def _source(raw, how: int) -> bytes | memoryview:
    """A sample's record as the pack document holds it (UTF-8): a .json record as it is where the scan found
    it in json.dumps's form (`Sample.record_exact`), else parsed and dumped again; a caption as a JSON string."""
    if how == EXACT:
        return raw
    text = str(raw, "utf-8")
    return (dumps(json.loads(text)) if how == JSON else encode_str(text)).encode("utf-8")
