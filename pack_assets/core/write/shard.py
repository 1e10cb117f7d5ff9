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
from concurrent.futures import Future, ThreadPoolExecutor
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

ARENAS = 2  # packs read ahead of the thread that writes them (`_ShardFile`), each in an arena of its own
WRITEBACK_EVERY = 8 << 20  # the disk's writing is started every this many bytes written (`start_writeback`)


def write_shard(out_dir: str, job: StreamShard | BulkShard | ShardJob, context: dict,
                aside: bool = False) -> ShardResult:
    """Write one output shard atomically; skip it when a shard with the same content is already there
    (a rerun after a crash, or the untouched shards of an incremental plan). ``job``: prepared in bulk a
    batch of packs at a time (`batches.StreamShard`) or at once (`bulk.build_shard`), inside the writer
    process, or a ShardJob."""
    return end_shard(begin_shard(out_dir, job, context, aside))


def begin_shard(out_dir: str, job: StreamShard | BulkShard | ShardJob, context: dict,
                aside: bool = False) -> ShardResult | Unsynced:
    """`write_shard` up to the fsync: the shard's bytes written under a temporary name (an Unsynced, which
    `end_shard` syncs and renames into place), or the result of a shard found already there. ``aside``: its
    packs written by a thread of their own (`_ShardFile`; where this process is the only writer)."""
    t0 = time.perf_counter()
    if isinstance(job, ShardJob):
        job = build_shard(job.name, job_columns(job), context)
    final = Path(out_dir) / job.name
    result = ShardResult(job.name, False, 0, job.n_packs, job.samples, fingerprint=job.fingerprint)
    if final.exists():
        meta = first_pack_meta(final)
        if meta and meta.get("shard_fingerprint") == job.fingerprint:
            return replace(result, skipped=True, bytes=final.stat().st_size, seconds=time.perf_counter() - t0)
    sources, prefetches, pack_ids = Sources(), [], []
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    out = _ShardFile(fd, aside)
    try:
        for packs in job.batches():
            prefetches.append(prefetch_aside([r[:3] for p in packs for r in p.reads]
                                             + [m[1:4] for p in packs for m in p.members if m[0] < 0]))
            for pack in packs:
                out.pack(pack, sources)
                pack_ids.append(pack.pack_id)
        written = out.finish()
        what = _what(final, sources)  # before the sources close
    except BaseException as e:
        out.close(wait=False)  # (its thread done with the file before it is closed)
        _discard(fd, tmp)
        faults.raise_device_fault(e, _what(final, sources), "writing")
        raise
    finally:
        sources.close()
        for prefetch in prefetches:
            prefetch.join()
    return Unsynced(replace(result, bytes=written), fd, tmp, final, what, t0,
                    (pack_ids, job.layout, job.parts, out.docs, out.end), out)


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
    out: _ShardFile  # whose thread may still be writing its last packs (`_ShardFile.close`)


def end_shard(begun: ShardResult | Unsynced) -> ShardResult:
    """An Unsynced shard fsynced, closed and renamed into place, with its Energon index; a shard found already
    there as it is. The folder is fsynced once, with the metadata published after the shards (`publish.py`):
    the name survives a power cut from then on, before the writer's record says it is done."""
    if isinstance(begun, ShardResult):
        return begun
    try:
        begun.out.close()
        os.fsync(begun.fd)
        os.close(begun.fd)
        begun.fd = -1
        os.replace(begun.tmp, begun.final)
    except BaseException as e:
        begun.out.close(wait=False)
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
    pack's place and document size are kept for its Energon index (`layout.shard_index`).

    A pack of members all read is written by a thread of the shard's own while this one reads and builds the
    next (`os.writev` releases the GIL for the kernel's copy into the page cache, the largest part of the
    copy's time): two arenas, each pack's reads into the one the write before last has finished with. The
    writes are made one after the other in pack order (one thread, a FIFO queue), so the bytes are the same;
    a pack with members copied in kernel, and the end of the archive, are written here once the thread's
    writes are done. A failed write is raised here at the next wait for it (the shard is then discarded; the
    thread's queued writes are cancelled and the running one waited for before the file is closed: `__exit__`)."""

    def __init__(self, fd: int, aside: bool = False) -> None:
        self.fd = fd
        self.pos = 0  # bytes written so far
        self.end = 0  # where the last member ends (the tar's end-of-archive blocks follow)
        self.flushed = 0  # bytes whose writeback was started
        self.docs: list[tuple[int, int, int]] = []  # per pack: where it starts, its document's header and size
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pack-writes") if aside else None
        self.arenas = tuple(Arena() for _ in range(ARENAS if aside else 1))
        self.writes: list[Future | None] = [None] * len(self.arenas)  # the thread's write of each arena's last pack
        self.turn = 0

    def close(self, wait: bool = True) -> None:
        """The thread's writes done, in order (the first failed one raised), and the thread ended; without
        ``wait`` (the shard is discarded) those not begun are cancelled and the one under way waited for."""
        if self.thread is None:
            return
        try:
            if wait:
                self._drain()
        finally:
            self.thread.shutdown(wait=True, cancel_futures=True)

    def _drain(self) -> None:
        """Every write of the thread's done, the oldest first."""
        for i in range(len(self.writes)):
            self._wait((self.turn + 1 + i) % len(self.writes))

    def _arena(self) -> Arena:
        """The next pack's arena, once the thread's write of the pack it last held is done (its error raised)."""
        self.turn = (self.turn + 1) % len(self.arenas)
        self._wait(self.turn)
        arena = self.arenas[self.turn]
        arena.reset()
        return arena

    def _wait(self, i: int) -> None:
        write, self.writes[i] = self.writes[i], None
        if write is not None:
            write.result()

    def pack(self, pack: BulkPack, sources: Sources) -> None:
        arena = self._arena()
        got = _reads(sources, arena, pack.reads)
        texts = [_source(got[r[0]][r[1]:r[2]], r[3]) if r is not None else b"null" for r in pack.records]
        body = b"".join([x for pair in zip(pack.heads, texts) for x in pair] + [pack.tail])
        header = member_header(f"{pack.pack_id}.json", len(body))
        self.docs.append((self.pos, len(header), len(body)))
        bufs = [header, body, padding(len(body))]
        if pack.copied:
            self._drain()
            self._members(pack, got, bufs, sources, arena)
        else:  # every member read: header, data, padding, member after member, in one os.writev (by the thread)
            n = len(pack.members)
            bufs += [None] * (3 * n)
            bufs[3::3], bufs[5::3] = pack.headers, pack.pads
            bufs[4::3] = [got[r][a:b] for r, a, b in pack.members]
            self._write(writev_all, self.fd, bufs)
        self.pos += len(header) + len(body) + (-len(body) % BLOCK) + pack.span
        if self.pos - self.flushed >= WRITEBACK_EVERY:  # after the writes queued before it
            if self.thread is None:
                start_writeback(self.fd, self.flushed, self.pos - self.flushed)
            else:  # (advice only: its result not waited for)
                self.thread.submit(start_writeback, self.fd, self.flushed, self.pos - self.flushed)
            self.flushed = self.pos

    def _write(self, call, *args) -> None:
        """A write (or the writeback's start) made by the thread after those queued, or here without one."""
        if self.thread is None:
            call(*args)
        else:
            self.writes[self.turn] = self.thread.submit(call, *args)

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
        """The end-of-archive blocks, padded to a whole record, queued after the packs (the file not yet
        synced: `close` waits for them): returns its size."""
        self.end = self.pos
        tail = 2 * BLOCK
        tail += -(self.end + tail) % RECORD
        self.turn = (self.turn + 1) % len(self.arenas)
        self._wait(self.turn)
        self._write(writev_all, self.fd, [bytes(tail)])
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
