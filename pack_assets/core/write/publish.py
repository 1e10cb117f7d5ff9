"""Files put in place together: each written under a temporary sibling name (the form `owned.remove_temp_leftovers`
knows), all fsynced at once, then renamed into place folder by folder, each folder fsynced once after its last
rename instead of once per file. The files' fsyncs are issued side by side (threads: an fsync releases the GIL), so the
file system commits them together instead of one journal commit after another. After a power cut each name
holds its old file or its new one; once `Publish.commit` returns, every rename is durable, also the renames of
shards made before it into the same folders (`shard.end_shard` leaves its folder's fsync to the metadata
published after the shards). A file whose name already holds exactly the bytes (and the mode) it would get is
left in place, not rewritten: it is fsynced and its folder fsynced as a written one's, so the guarantee holds
the same (a rerun that keeps most output shards rewrote each one's unchanged `.tar.idx`, and a rename over a
file cost more than the rest of the batch: docs/benchmarks.md, issue 41)."""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..safety import file_mode, fsync_dir, fsync_file, mkstemp

SYNC_THREADS = 16  # fsyncs of a batch in flight at once


def fsync_all(paths: list[str]) -> None:
    """fsync every file of ``paths``, side by side; the first error raised."""
    if len(paths) <= 1:
        for p in paths:
            fsync_file(p)
        return
    with ThreadPoolExecutor(max_workers=min(SYNC_THREADS, len(paths)), thread_name_prefix="fsync") as pool:
        for f in [pool.submit(fsync_file, p) for p in paths]:
            f.result()


def holds(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) with exactly ``data`` and the mode a new file gets."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or stat.S_IMODE(st.st_mode) != file_mode():
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(len(data) + 1) == data
    finally:
        os.close(fd)


class Publish:
    """A batch of files to put in place: `write` (bytes) or `written` (a temporary file the caller wrote), then
    `commit`. Used as a context manager: what was not committed when the block ends is removed."""

    def __init__(self) -> None:
        # (temporary name, final path) in the order added; None for a final path that already holds its bytes
        self._pending: list[tuple[str | None, Path]] = []

    def write(self, path: Path, data: bytes) -> None:
        """``data`` written under a temporary name next to ``path`` (fsynced by `commit`); unless ``path``
        already holds exactly it (`holds`): then left in place, and fsynced by `commit` all the same."""
        if holds(path, data):
            self._pending.append((None, path))
            return
        fd, tmp = mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
        self._pending.append((tmp, path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def written(self, tmp: str, path: Path) -> None:
        """A temporary file (next to ``path``), written and closed by the caller, to sync and rename to ``path``."""
        self._pending.append((tmp, path))

    def commit(self) -> None:
        """Every file fsynced; then, folder by folder (in the order each first appears), its files renamed into
        place and the folder fsynced before the next folder's first rename: a power cut loses at most the
        renames into one folder since its last fsync, the batch's and those just before it (the shards')."""
        fsync_all([str(path) if tmp is None else tmp for tmp, path in self._pending])
        folders: dict[str, list] = {}
        for tmp, path in self._pending:
            folders.setdefault(os.path.dirname(os.path.abspath(path)), []).append((tmp, path))
        for folder, files in folders.items():
            for tmp, path in files:
                if tmp is not None:  # (should one fail, `discard` finds the names renamed before it gone)
                    os.replace(tmp, path)
            fsync_dir(folder)  # also where every file was left in place: its name durable, whoever renamed it
        self._pending.clear()

    def discard(self) -> None:
        for tmp, _ in self._pending:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        self._pending.clear()

    def __enter__(self) -> Publish:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()
