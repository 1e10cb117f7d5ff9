"""One copy-mode output shard: a tar of one sample per pack (its JSON document, then its media and extra
members as the source bytes), written with fixed header fields (mtime 0, uid/gid 0, mode 0644, PAX format)
and a stable member order, so the same job gives the same bytes. It is written under a temporary name,
fsynced, then renamed: no partial file is ever visible under a final name. A shard whose first pack already
carries the job's fingerprint is left as it is."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

from .. import faults, safety
from ..safety import mkstemp  # temp files that end with the umask's mode, not mkstemp's 0600
from ..tario import BLOCK, RECORD, first_pack_meta, member_header, padding
from .energon import Index, IndexBuilder
from .fingerprints import shard_fingerprint
from .jobs import PackJob, ShardJob, ShardResult, SubSample, pack_document
from .syscalls import Arena, Sources, copy_range, prefetch_aside, read_sub, start_writeback, writev_all

WRITEBACK_EVERY = 8 << 20  # the disk's writing is started every this many bytes written (`start_writeback`)


def write_shard(out_dir: str, job: ShardJob | str, context: dict, loader=None) -> ShardResult:
    """Write one output shard atomically; skip it when a shard with the same content is already there
    (a rerun after a crash, or the untouched shards of an incremental plan). ``job`` may be a shard name
    that ``loader`` turns into its ShardJob (inside the writer process)."""
    t0 = time.perf_counter()
    if isinstance(job, str):
        job = loader(job)
    final = Path(out_dir) / job.name
    context = {**context, "shard_fingerprint": shard_fingerprint(job, context)}
    result = ShardResult(job.name, False, 0, len(job.packs), job.samples, fingerprint=context["shard_fingerprint"])
    if final.exists():
        meta = first_pack_meta(final)
        if meta and meta.get("shard_fingerprint") == context["shard_fingerprint"]:
            return replace(result, skipped=True, bytes=final.stat().st_size, seconds=time.perf_counter() - t0)
    written, index = _write_new(out_dir, job, context, final)
    return replace(result, bytes=written, seconds=time.perf_counter() - t0, index=index)


def _write_new(out_dir: str, job: ShardJob, context: dict, final: Path) -> tuple[int, Index]:
    """The shard written under a temporary name and renamed into place: its size and its Energon index."""
    sources, arena = Sources(), Arena()
    prefetch = prefetch_aside(job)
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    out = _ShardFile(fd, IndexBuilder(p.pack_id for p in job.packs))
    try:
        for pack in job.packs:
            out.pack(pack, context, sources, arena)
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

    def pack(self, pack: PackJob, context: dict, sources: Sources, arena: Arena) -> None:
        start = self.pos
        records, data = [], []
        for sub in pack.subs:
            rec, views = read_sub(sub, sources, arena)
            records.append(rec)
            data += views
        body, media = pack_document(pack, context, records)
        self._buffered(pack.pack_id, f"{pack.pack_id}.json", body, len(body))
        for (out_name, sub, m), view in zip(media, data):
            if view is None:  # large: copied in kernel after what is pending
                self._copied(pack.pack_id, out_name, sub, m, sources)
            else:
                self._buffered(pack.pack_id, out_name, view, m["size"])
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

    def _copied(self, pack_id: str, name: str, sub: SubSample, m: dict, sources: Sources) -> None:
        header = member_header(name, m["size"])
        self.index.member(pack_id, name, self.pos, self.pos + len(header), m["size"])
        self.pending.append(header)
        writev_all(self.fd, self.pending)
        self.pending = []
        src = sub.source_path
        if not copy_range(sources.get(src).fileno(), m["offset"], m["size"], self.fd, f"{src}: {m['name']}",
                          src not in sources.no_kernel_copy):
            sources.no_kernel_copy.add(src)
        self.pending.append(padding(m["size"]))
        self.pos += len(header) + m["size"] + (-m["size"] % BLOCK)

    def finish(self) -> int:
        """The end-of-archive blocks, padded to a whole record, and the file synced: returns its size."""
        self.end = self.pos
        tail = 2 * BLOCK
        tail += -(self.end + tail) % RECORD
        writev_all(self.fd, [bytes(tail)])
        os.fsync(self.fd)
        return self.end + tail
