"""A copy-mode shard's packs written without reading their bytes into this process: their source shards mapped
read-only (``mmap``), each pack's document parts, tar headers and paddings queued with views of the maps, and
the queue written by one ``os.writev`` per IOV_MAX buffers. The kernel copies straight from the source's page
cache (one copy, where a ``pread`` then a ``writev`` make two), and a thread that writes a shard this way holds
the GIL for a few calls per shard, not one per sample: the next shard is prepared beside it (`copy.py`).

Only the kernel touches the maps: no Python code reads their bytes. A source cut short under the writer then
makes ``writev`` fail with EFAULT (a clear error here), where a read of the map by this process would be
killed by SIGBUS. A pack of a record that must be parsed (a caption, a .json not in json.dumps's form) or of
a member copied in kernel (`syscalls.SMALL` or more) is not queued: `shard.py` reads and writes it as before."""

from __future__ import annotations

import errno
import mmap
import os

from ..tario import IOV_MAX, writev_all
from .batches import StreamShard
from .bulk import BulkPack, BulkShard
from .places import EXACT

# the bytes viewed in a shard's maps before they are all unmapped (what is queued written first): the pages the
# kernel copied from, and their neighbours it maps with them, stay in the writer's resident set while mapped
# (docs/benchmarks.md: the peak RSS at a few bounds)
MAPPED_BYTES = 32 << 20


def mappable(pack: BulkPack) -> bool:
    """Whether the pack's bytes are all copied as the source holds them: no record to parse, no member copied
    in kernel."""
    return not pack.copied and all(r is None or r[3] == EXACT for r in pack.records)


def in_one_call(job) -> bool:
    """Whether a prepared shard's packs are queued (`MappedQueue`), judged by its packs built so far (a
    streamed shard's first batch: its later ones are of the same data): the writer's choice of where to write
    it (`copy._overlapped`), not of its bytes."""
    if isinstance(job, BulkShard):
        packs = job.packs
    elif isinstance(job, StreamShard):
        packs = job.first_packs
    else:
        return False
    return bool(packs) and all(map(mappable, packs))


class Maps:
    """Read-only maps of source shards (path -> a memoryview of the whole file as it was when mapped), at most
    ``limit`` at once, unmapped once ``max_bytes`` of them are viewed (`full`): the pages the kernel copies
    from count in this process's resident set while they are mapped. None for a source that cannot be
    mapped (an empty file, a filesystem without mmap): its packs are read instead."""

    def __init__(self, limit: int = 256, max_bytes: int = MAPPED_BYTES) -> None:
        self.limit, self.max_bytes, self.viewed = limit, max_bytes, 0
        self.views: dict[str, memoryview | None] = {}

    def view(self, path: str, offset: int, size: int) -> memoryview | None:
        """The source's bytes at ``offset`` as a view of its map; None where it is not mapped or ends before."""
        if path not in self.views:
            self.views[path] = _mapped(path)
        whole = self.views[path]
        if whole is None or offset + size > len(whole):
            return None
        self.viewed += size
        return whole[offset:offset + size]

    def full(self) -> bool:
        return len(self.views) >= self.limit or self.viewed >= self.max_bytes

    def close(self) -> None:
        """Unmap every source (a map still viewed by a buffer not yet freed is left to be unmapped with it)."""
        for view in self.views.values():
            if view is not None:
                base = view.obj
                view.release()
                try:
                    base.close()
                except BufferError:  # a view of it is still alive: unmapped when that is freed
                    pass
        self.views.clear()
        self.viewed = 0


def _mapped(path: str) -> memoryview | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # the read path reports it
    try:
        return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError):  # ValueError: an empty file
        return None
    finally:
        os.close(fd)


class MappedQueue:
    """Buffers of packs waiting to be written to ``fd`` in one ``os.writev`` per IOV_MAX of them; ``sources``:
    the source shards they view, named by the error for one cut short meanwhile."""

    def __init__(self, fd: int, maps: Maps) -> None:
        self.fd, self.maps = fd, maps
        self.bufs: list = []
        self.sources: set[str] = set()

    def views(self, reads: list[tuple]) -> list[memoryview] | None:
        """Each read (`bulk.BulkPack.reads`) as a view of its source's map; None where a source is not mapped or
        shorter than the read (the read path then reads it, or reports how early it ends)."""
        if self.maps.full():
            self.flush()  # nothing queued views a map any more: all of them can go
            self.maps.close()
        got = [self.maps.view(*r[:3]) for r in reads]
        if any(v is None for v in got):
            return None
        self.sources.update(r[0] for r in reads)
        return got

    def add(self, bufs: list) -> bool:
        """Queue a pack's buffers; returns whether the queue was written (it holds IOV_MAX buffers or more)."""
        self.bufs += bufs
        if len(self.bufs) < IOV_MAX:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Write what is queued. EFAULT: a source was cut short after it was mapped (the kernel found no page
        behind a view)."""
        if not self.bufs:
            return
        try:
            writev_all(self.fd, self.bufs)
        except OSError as e:
            if e.errno != errno.EFAULT:
                raise
            raise OSError(errno.EFAULT, "a source shard ended early while it was copied (cut short or rewritten "
                                        f"under the writer): one of {', '.join(sorted(self.sources))}") from None
        finally:
            self.bufs.clear()
        self.sources.clear()
