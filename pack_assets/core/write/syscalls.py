"""Moving bytes from source shards into an output shard with as few system calls and copies as it takes:
``copy_file_range`` for large members (in kernel, no user pages), one ``pread`` per sample's small members
into a buffer reused pack after pack (`Arena`), one ``os.writev`` per pack, the kernel asked to read a shard's
source ranges ahead in file order (`prefetch_aside`) and to start writing back as the shard grows
(`start_writeback`). Where the kernel cannot copy between two files (EXDEV and kin) the bytes are read and
written instead; the output bytes are the same either way."""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from ..tario import BLOCK, writev_all
from .jobs import SubSample

# Media and extra members of this size or more are copied in kernel (copy_file_range: no user-space copy, no
# user pages); smaller ones are read with their sample's record (one pread of the span) and written with the
# pack's os.writev (the cut measured in docs/benchmarks.md).
SMALL = 64 << 10
# the cut for a source the kernel cannot copy from (another filesystem type: EXDEV): only these are copied by
# reads of their own, the rest go with the sample's span read
SMALL_READ = 1 << 20
# a sample's small members are read with one pread of their span when the gaps between them (tar headers and
# padding, typically 1 KB per member) stay under this (and under the cut, so that no member copied apart lies
# inside the span): a 16 KB image then costs one slice, not one syscall
SPAN_GAP = 64 << 10
# copy_file_range's errors that say the kernel cannot copy between these two files (EXDEV: filesystems of
# different types, Linux 5.12 on): the caller reads and writes that source's members instead
NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL}


class Sources:
    """A small LRU of open source shards (bounded file descriptors). ``no_kernel_copy``: those the kernel cannot
    copy from into this output shard (`copy_range`): their members are read and written back."""

    def __init__(self, limit: int = 64):
        self.limit, self.files = limit, {}
        self.no_kernel_copy: set[str] = set()

    def get(self, path: str):
        f = self.files.pop(path, None)
        if f is None:
            if len(self.files) >= self.limit:
                oldest = next(iter(self.files))
                self.files.pop(oldest).close()
            f = open(path, "rb", buffering=0)
        self.files[path] = f
        return f

    def close(self):
        for f in self.files.values():
            f.close()
        self.files.clear()


def _prefetch(ranges: list[tuple[str, int, int]]) -> None:
    """Ask the kernel to read a shard's source ranges (path, offset, size) in (file, offset) order: one sweep
    per source instead of the random order packs visit them in. Its own descriptors: it runs beside the writer
    (`prefetch_aside`), whose open sources come and go."""
    if not hasattr(os, "posix_fadvise"):
        return
    ranges = sorted(set(ranges))
    merged: list[list] = []  # members that lie together (a sample's, consecutive samples') in one call
    for path, offset, size in ranges:
        last = merged[-1] if merged else None
        if last and last[0] == path and offset <= last[2] + 8 * BLOCK:  # tar headers and padding between
            last[2] = max(last[2], offset + size)
        else:
            merged.append([path, offset, offset + size])
    fd, at = -1, None
    try:
        for path, lo, hi in merged:
            if path != at:
                if fd >= 0:
                    os.close(fd)
                fd, at = os.open(path, os.O_RDONLY), path
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
    except OSError:
        return  # only advice: the writer reports a source it cannot read
    finally:
        if fd >= 0:
            os.close(fd)


def prefetch_aside(ranges: list[tuple[str, int, int]]) -> threading.Thread:
    """`_prefetch` in a thread, started, while the shard is written (its advice calls release the GIL; in
    line they held up the first pack)."""
    t = threading.Thread(target=_prefetch, args=(ranges,), name="prefetch", daemon=True)
    t.start()
    return t


class Arena:
    """One buffer, reused pack after pack, that a pack's small members are read into (`os.preadv`) until
    its bytes are written: a fresh bytes object per 100 KB+ read costs page faults, as much again as the
    copy itself. A read that does not fit gets a buffer of its own, and the next pack a larger arena: it
    grows to the largest pack's small members."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.buf, self.used, self.wanted = memoryview(bytearray(size)), 0, 0

    def pread(self, fd: int, n: int, offset: int) -> memoryview:
        """``n`` bytes of ``fd`` at ``offset`` (fewer at its end), viewed: slicing them copies nothing."""
        self.wanted += n
        if self.used + n > len(self.buf):
            return memoryview(os.pread(fd, n, offset))
        view = self.buf[self.used:self.used + n]
        self.used += n
        return view[:os.preadv(fd, [view], offset)]

    def reset(self) -> None:
        """The pack's bytes are written: the buffer is free again (a new one when the pack did not fit; the
        old one may still be viewed, so it is never resized)."""
        if self.wanted > len(self.buf):  # doubled at least: packs of growing size do not reallocate each time
            self.buf = memoryview(bytearray(max(self.wanted, 2 * len(self.buf))))
        self.used = self.wanted = 0


def copy_range(src_fd: int, offset: int, size: int, dst_fd: int, what: str, kernel: bool = True) -> bool:
    """Copy `size` bytes of the source at `offset` to dst_fd's position, in kernel where it can (`kernel`),
    else by reads; returns False when the kernel said it cannot copy between these files. `what` names the
    member in the error for a source that ends early."""
    left, pos = size, offset
    while left:
        n = 0
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, left, pos)
            except (AttributeError, OSError) as e:  # AttributeError: a platform without the call
                kernel = isinstance(e, OSError) and e.errno not in NO_KERNEL_COPY
        if n <= 0:
            chunk = os.pread(src_fd, min(left, 1 << 22), pos)
            if not chunk:
                raise OSError(f"{what}: the source ends {left} bytes early, at offset {pos}")
            writev_all(dst_fd, [chunk])
            n = len(chunk)
        left -= n
        pos += n
    return kernel


def start_writeback(fd: int, offset: int, size: int) -> None:
    """Have the kernel start writing these just-written bytes to disk, without waiting: below its dirty
    thresholds it would start only at the shard's fsync, which then waited for the whole shard after the CPU
    work instead of beside it. POSIX_FADV_DONTNEED starts the writeback and drops only clean pages, and
    pages just written are dirty or under writeback: the audit still reads them from memory."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)


def read_record(sub: SubSample, sources: Sources) -> bytes | None:
    """The sample's record member alone (index mode: its text goes into the pack's JSON, the media stay put)."""
    m = sub.json_member
    if m is None:
        return None
    data = os.pread(sources.get(sub.source_path).fileno(), m["size"], m["offset"])
    if len(data) != m["size"]:
        raise OSError(f"{sub.source_path}: {m['name']} ends early ({len(data)} of {m['size']} bytes)")
    return data
