"""Where `convert` puts its samples: numbered WebDataset shards, each written under a temporary name and
renamed into place when full, so a shard is visible complete or not at all.

A sample is its members, each ``(name, payload)`` with the payload as ``bytes`` or any buffer (a
``memoryview`` of an Arrow buffer is written as it is, no copy in Python). Headers are the fixed ones of
``tario.member_header`` (mtime 0, uid/gid 0, mode 0644, PAX for long names), and each shard ends the way
``tarfile`` ends one, so the same samples give the same bytes. Samples are gathered into runs of about
``_RUN_BYTES``, each written with ``os.writev`` (no buffered file: it would copy every payload into its buffer
first). With ``background`` a thread does the writes (in order; the caller goes on with the next samples
meanwhile, at most ``_QUEUE_BYTES`` behind), and an error there is raised in the caller at its next call. A
run, not a sample, is a hand-over to that thread: each one makes it wait for the GIL the converting thread
holds.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from .safety import mkstemp
from .tario import BLOCK, RECORD, member_header, padding, writev_all

Member = tuple[str, "bytes | memoryview"]
_QUEUE_BYTES = 64 << 20
_RUN_BYTES = 1 << 20  # much larger runs made the writer thread slower (docs/benchmarks.md, issue 42)


def _write_all(fd: int, bufs: list) -> int:
    """Write the buffers in order (`tario.writev_all`: a short write resumes inside its buffer); the bytes."""
    size = sum(len(b) for b in bufs)
    writev_all(fd, bufs)
    return size


class _Writer:
    """Runs write steps in order on one thread; ``submit`` blocks while ``_QUEUE_BYTES`` wait."""

    def __init__(self) -> None:
        self._steps: deque = deque()
        self._cond = threading.Condition()
        self._queued = 0
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self._thread.start()

    def submit(self, step: Callable[[], None], size: int = 0) -> None:
        with self._cond:
            while self._queued > _QUEUE_BYTES and self.error is None:
                self._cond.wait()
            self._raise()
            self._steps.append((step, size))
            self._queued += size
            self._cond.notify_all()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._steps and not self._stopping:
                    self._cond.wait()
                if not self._steps:
                    return
                step, size = self._steps.popleft()
            try:
                if self.error is None:
                    step()
            except BaseException as e:  # raised in the caller at its next submit / drain
                self.error = e
            with self._cond:
                self._queued -= size
                self._cond.notify_all()

    def drain(self) -> None:
        """Wait for every submitted step, stop the thread, raise its error if any."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._raise()


class ShardSink:
    """``<out>/<prefix>-NNNNNN.tar``; a new shard starts once one holds ``samples_per_shard`` samples or the
    next sample would pass ``max_shard_bytes`` (a sample is never split across shards)."""

    def __init__(self, out_dir: Path, samples_per_shard: int = 1000, max_shard_bytes: int = 1 << 30,
                 prefix: str = "shard", background: bool = False):
        self.out_dir, self.prefix = out_dir, prefix
        self.samples_per_shard, self.max_shard_bytes = samples_per_shard, max_shard_bytes
        self.shards: list[str] = []
        self._fd = -1
        self._pos = 0  # bytes written to the open shard
        self._tmp = ""
        self._run: list = []  # the open shard's next buffers, written as one run
        self._run_bytes = 0
        self._open = False
        self._closed = 0  # shards finished or queued to finish
        self._n = 0
        self._bytes = 0
        self._writer = _Writer() if background else None
        out_dir.mkdir(parents=True, exist_ok=True)

    def _do(self, step: Callable[[], None], size: int = 0) -> None:
        if self._writer is None:
            step()
        else:
            self._writer.submit(step, size)

    def add(self, members: Sequence[Member]) -> None:
        size = sum(len(data) for _, data in members)
        if self._open and (self._n >= self.samples_per_shard or self._bytes + size > self.max_shard_bytes):
            self._close_shard()
        if not self._open:
            self._open = True
            self._do(self._start)
        for name, data in members:
            n = len(data)
            self._run += (member_header(name, n), data, padding(n))
        self._run_bytes += size
        if self._run_bytes >= _RUN_BYTES:
            self._write_run()
        self._n += 1
        self._bytes += size

    def _write_run(self) -> None:
        bufs, size = self._run, self._run_bytes
        self._run, self._run_bytes = [], 0
        if bufs:
            self._do(lambda: self._write(bufs), size)

    def _start(self) -> None:
        self._fd, self._tmp = mkstemp(prefix=f".{self.prefix}.tmp-", dir=self.out_dir)  # 0644 under umask 022
        self._pos = 0

    def _write(self, bufs: list) -> None:
        self._pos += _write_all(self._fd, bufs)

    def _finish(self, final: Path) -> None:
        end = 2 * BLOCK
        end += -(self._pos + end) % RECORD  # the end-of-archive blocks, then zeros to a whole record
        fd, self._fd = self._fd, -1
        try:
            _write_all(fd, [bytes(end)])
        finally:
            os.close(fd)
        os.replace(self._tmp, final)
        self._tmp = ""
        self.shards.append(str(final))

    def _close_shard(self) -> None:
        final = self.out_dir / f"{self.prefix}-{self._closed:06d}.tar"
        self._closed += 1
        self._write_run()
        self._do(lambda: self._finish(final))
        self._open = False
        self._n = self._bytes = 0

    def close(self) -> None:
        """Finish the open shard (end-of-archive blocks, padded to a whole record), publish it, and wait for
        every write."""
        if self._open:
            self._close_shard()
        if self._writer is not None:
            self._writer.drain()

    def abort(self) -> None:
        """Drop the shard being written (an error stopped the conversion): no partial shard is left."""
        if self._writer is not None:
            with contextlib.suppress(BaseException):
                self._writer.drain()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
        if self._tmp:  # opened and not published (the failure may have been in its finishing)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = ""

    def __enter__(self) -> ShardSink:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.close()
        except BaseException:  # a write that failed on the writer thread: no partial shard stays
            self.abort()
            raise
