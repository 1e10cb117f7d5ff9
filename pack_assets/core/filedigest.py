"""An output shard's whole-file digest, so that the default audit re-reads every shard without re-checking
each one. A clean audit that read a shard in full (tar structure, every document against the plan, every
member's sha256 against the manifest) records the digest of its bytes, taken from the same read as the checks
(`HashedReads`: the bytes it checked, no second read). The next audit re-reads a shard that is unchanged since
(same size, mtime and content fingerprint as the record) only to hash it: where the digest is the recorded one,
the bytes are the very bytes that passed; any other shard, or one whose bytes changed under the same size and
mtime, is read in full (`vouched`). xxh3-128, not sha256: these digests guard against corruption and edits, not
adversaries, and hashing must stay under the disk's read speed.

`EarlyDigests` hashes those shards ahead, while the plan and the writer run (`start_for`): `pack-assets run` starts
one reader of small requests before Dagster's cold import (whose reads of many small files would wait behind large
requests: four readers of 4 MB stretched the import several times over, docs/benchmarks.md), and the plan adds
the others as it starts. Each digest is kept with the
file's identity as it was read; the audit takes one only for a file nobody has written since (same inode, size,
mtime and ctime: a write or a `utime` sets the ctime, which nothing sets back), so it is still a digest of the
bytes on disk that this run computed, and anything else is hashed then. It reads past the page cache (O_DIRECT):
through the cache, the copies out of it and the cache's filling cost the CPU the plan and the writer need beside
it on a small machine, and slowed the hashing itself (docs/benchmarks.md)."""

from __future__ import annotations

import collections
import errno
import json
import mmap
import os
import threading
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from .. import __version__

if TYPE_CHECKING:
    from .settings import Settings

CHUNK = 8 << 20
DIRECT_CHUNK = 4 << 20
EARLY_THREADS = 4  # sequential readers of one disk while the writer writes to it (waiting on it, not on a core)
BESIDE_IMPORT = 1, 1 << 20  # (readers, request size) while the command imports Dagster


Identity = tuple[int, int, int, int, int]
AUDITED = "audited_shards.json"  # the last clean audit's record, in the work folder (core/audit.py writes it)


def identity(st: os.stat_result) -> Identity:
    """What changes when a file is written or replaced: a same-size edit with its mtime put back changes the ctime."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _open_direct(path: Path) -> int | None:
    """A descriptor reading ``path`` past the page cache (O_DIRECT), None where the file system refuses it."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:  # tmpfs and a few others: no direct I/O
            return None
        raise


def _read_all(fd: int, h, stop: threading.Event | None, direct: bool, chunk: int = DIRECT_CHUNK) -> bool:
    """``fd``'s bytes into ``h`` in large chunks of one buffer (page-aligned for O_DIRECT); False once ``stop``
    is set. xxhash releases the GIL while it hashes: threads hash files in parallel."""
    if direct:
        buf = mmap.mmap(-1, chunk)
    else:
        buf = bytearray(CHUNK)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # the kernel reads ahead
    view = memoryview(buf)
    try:
        while n := os.readv(fd, [buf]):
            if stop is not None and stop.is_set():
                return False
            h.update(view[:n])
        return True
    finally:
        view.release()
        if direct:
            buf.close()


def identified_digest(path: Path, stop: threading.Event | None = None, direct: bool = False,
                      chunk: int = DIRECT_CHUNK) -> tuple[str, Identity] | None:
    """xxh3-128 of the file's bytes (hex) and the file's identity, the same before and after the read; None when
    it cannot be read, changed meanwhile, or ``stop`` was set. ``direct``: read past the page cache (O_DIRECT,
    where the file system allows it): no copy out of the cache and no cache filled with bytes the run does not
    read again, so the hashing leaves the CPU and the cache to the stages running beside it; ``chunk`` bytes a
    request there."""
    h = xxhash.xxh3_128()
    try:
        fd = _open_direct(path) if direct else None
        direct = fd is not None
        fd = fd if direct else os.open(path, os.O_RDONLY)
        try:
            before = identity(os.fstat(fd))
            if not _read_all(fd, h, stop, direct, chunk):
                return None
            after = identity(os.fstat(fd))
        finally:
            os.close(fd)
    except OSError:
        return None
    return (h.hexdigest(), after) if before == after else None


def file_digest(path: Path) -> str | None:
    """xxh3-128 of the file's bytes (hex), None when it cannot be read."""
    got = identified_digest(path)
    return got[0] if got else None


class HashedReads:
    """The reads of a walk that goes through a file front to back (a tar walk: header, payload, the next header),
    served from large chunks read in order into one buffer and hashed as they are read: the file's digest
    (`file_digest`'s, of the whole file) comes from the same single read, which served the walk its bytes. `begin` with
    the open file, `pread` as ``os.pread``, then `finish` at the walk's end: ``digest`` is set, unless the file
    changed meanwhile."""

    def __init__(self) -> None:
        self.digest: str | None = None
        self._fd, self._before, self._h = -1, None, xxhash.xxh3_128()
        self._buf = bytearray(CHUNK)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # the buffer holds the file's bytes [_start, _end); all before _end are hashed

    def begin(self, fd: int) -> None:
        self._fd, self._before = fd, identity(os.fstat(fd))

    def pread(self, fd: int, n: int, at: int) -> bytes:
        """``os.pread(fd, n, at)`` for ``fd`` the file begun with, from the chunk held when it holds the range."""
        if at < self._start or fd != self._fd:  # behind the walk (not its order): read again, already hashed
            return os.pread(fd, n, at)
        if at + n > self._end:
            while at - self._end > CHUNK:  # a payload the walk skipped: hashed a chunk at a time, not held whole
                got = os.preadv(self._fd, [self._buf], self._end)
                if not got:
                    break
                self._h.update(self._view[:got])
                self._start, self._end = self._end, self._end + got
            # from where the reads stopped (a gap before `at` is read and hashed too), or from `at` where the chunk
            # held ends inside the range (the bytes before _end were hashed: skipped)
            first = min(at, self._end)
            if at + n - first > CHUNK:  # larger than a chunk: read whole, as os.pread would, nothing kept
                data = os.pread(self._fd, at + n - first, first)
                self._h.update(memoryview(data)[self._end - first:])
                self._start = self._end = first + len(data)
                return data[at - first:]
            got = os.preadv(self._fd, [self._buf], first)
            self._h.update(self._view[self._end - first:got])
            self._start, self._end = first, first + got
        lo = at - self._start
        return bytes(self._view[lo:min(lo + n, self._end - self._start)])

    def finish(self) -> str | None:
        """Read and hash the rest of the file; ``digest``, None when the file is no longer the one begun with."""
        while got := os.preadv(self._fd, [self._buf], self._end):
            self._h.update(self._view[:got])
            self._start, self._end = self._end, self._end + got
        same = self._before is not None and identity(os.fstat(self._fd)) == self._before
        self.digest = self._h.hexdigest() if same else None
        return self.digest


class EarlyDigests:
    """Output shards hashed ahead of the audit by threads of its own (`start`), each digest with the file's
    identity as it was read; `digest` gives one only while the file is still that file. The readers take the
    shards in name order from one queue, so more can join the reads under way."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._started: dict[Path, Future] = {}
        self._stop = threading.Event()
        self._target: tuple | None = None  # (out_dir, record, tool_version) of the reads under way
        self._queue: collections.deque[Path] = collections.deque()
        self._readers = 0

    def __enter__(self) -> EarlyDigests:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, out_dir: Path, record: Path, tool_version: str, readers: int = EARLY_THREADS,
              chunk: int = DIRECT_CHUNK) -> None:
        """Hash, in the background, each output shard that the last clean audit's record (``record``, written
        by ``tool_version``: another's digests are not taken) holds a digest for and whose size and mtime are
        still the ones it recorded (the others are read in full): ``readers`` threads, ``chunk`` bytes a request.
        Started again for the same folder and record, the reads under way go on, with more readers if asked."""
        if self._target != (out_dir, record, tool_version) or self._pool is None:
            self.close()
            self._target = (out_dir, record, tool_version)
            todo = _unchanged_since(out_dir, record, tool_version)
            if not todo:
                return
            self._stop = threading.Event()
            self._pool = ThreadPoolExecutor(EARLY_THREADS, thread_name_prefix="early-digest")
            self._started = {p: Future() for p in todo}
            self._queue = collections.deque(todo)
        while self._readers < min(readers, EARLY_THREADS, len(self._started)):
            self._pool.submit(_read_queue, self._queue, self._started, self._stop, chunk)
            self._readers += 1

    def start_for(self, settings: Settings, readers: int = EARLY_THREADS, chunk: int = DIRECT_CHUNK) -> EarlyDigests:
        """`start` when a run of ``settings`` has an audit that takes these digests: an incremental plan keeps
        the output shards it had, and the default audit scope hashes them (a blend's epochs: not hashed early).
        Safe at any time before the audit: a digest is taken only for a file that is still the one it read."""
        if settings.plan.incremental and settings.audit_scope == "all" and not settings.recipe:
            self.start(settings.out, settings.work / AUDITED, __version__, readers, chunk)
        return self

    def digest(self, path: Path) -> str | None:
        """The digest taken early of ``path`` (waiting for it if it is being taken), None when none was started,
        it failed, or the file is no longer the file that was hashed."""
        started = self._started.get(path)
        try:
            got = started.result() if started is not None else None
            return got[0] if got is not None and identity(path.stat()) == got[1] else None
        except (CancelledError, OSError):
            return None

    def close(self) -> None:
        """Stop hashing (what is not started is cancelled, what is under way stops at its next chunk: a failed
        plan or write leaves no thread reading) and forget the digests."""
        self._stop.set()
        for f in self._started.values():
            f.cancel()  # (one a reader took already is running: it ends with None at its next chunk)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._pool, self._started, self._target, self._readers = None, {}, None, 0


def _unchanged_since(out_dir: Path, record: Path, tool_version: str) -> list[Path]:
    """The output shards ``record`` holds a digest for whose size and mtime are still the ones it recorded."""
    shards, _, digests = audited(record, {}, tool_version)  # the record read as the audit reads it
    todo = []
    for n in sorted(n for n in digests if isinstance(shards.get(n), list) and len(shards[n]) >= 2):
        try:
            st = (out_dir / n).stat()
        except OSError:
            continue
        if [st.st_size, st.st_mtime_ns] == shards[n][:2]:
            todo.append(out_dir / n)
    return todo


def _read_queue(queue: collections.deque, started: dict[Path, Future], stop: threading.Event, chunk: int) -> None:
    """One reader: the next shard of ``queue`` hashed into its future, until the queue is empty or ``stop``."""
    while not stop.is_set():
        try:
            path = queue.popleft()
        except IndexError:
            return
        future = started[path]
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(identified_digest(path, stop, True, chunk))
            except BaseException as e:  # (identified_digest returns None for an OSError: this is a bug's)
                future.set_exception(e)


def vouched(out_dir: Path, names: Iterable[str], recorded: dict[str, str], workers: int = 0,
            early: EarlyDigests | None = None) -> dict[str, str]:
    """Of ``names`` (unchanged since a clean audit by their stamps), those whose file digest, computed now (or
    by ``early``, of the file as it still is), is the one that audit recorded: name -> digest. Hashed by
    ``workers`` threads (0: one per core)."""
    todo = sorted(n for n in names if isinstance(recorded.get(n), str))
    if not todo:
        return {}

    def digest(name: str) -> str | None:
        return (early.digest(out_dir / name) if early is not None else None) or file_digest(out_dir / name)

    with ThreadPoolExecutor(max(1, min(workers or os.cpu_count() or 1, len(todo)))) as pool:
        digests = dict(zip(todo, pool.map(digest, todo)))
    return {n: d for n, d in digests.items() if d is not None and d == recorded[n]}


def audited(path: Path, counting_versions: dict, tool_version: str) -> tuple[dict, float, dict]:
    """The last clean audit's record (``audited_shards.json``): each output shard's [size, mtime_ns,
    fingerprint]; the fraction of samples its recount covered (0 for a record written before the fraction was
    kept, or under other versions of the packages that count: an upgrade may count otherwise); the file
    digests of the shards it passed, only under the tool version that wrote them (a new one may check more)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, 0.0, {}
    if not isinstance(record, dict):
        return {}, 0.0, {}
    if "shards" not in record:
        return record, 0.0, {}
    shards, fraction, digests = record["shards"], record.get("recount_fraction"), record.get("digests")
    if not isinstance(shards, dict):
        return {}, 0.0, {}
    same = isinstance(fraction, (int, float)) and record.get("versions") == counting_versions
    ours = isinstance(digests, dict) and record.get("tool_version") == tool_version
    return shards, float(fraction) if same else 0.0, digests if ours else {}
