"""Files put in place together: each written under a temporary sibling name (the form `owned.remove_temp_leftovers`
knows) and fsynced, then all renamed into place, each folder fsynced once after its last rename instead of once
per file. After a power cut each name holds its old file or its new one; once `Publish.commit` returns, every
rename is durable, also the renames of shards made before it into the same folders (`shard.end_shard` leaves
its folder's fsync to the metadata published after the shards)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..safety import fsync_dir, mkstemp


class Publish:
    """A batch of files to put in place: `write` (bytes) or `synced` (a temporary file already fsynced), then
    `commit`. Used as a context manager: what was not committed when the block ends is removed."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, Path]] = []  # (temporary name, final path) in the order added

    def write(self, path: Path, data: bytes) -> None:
        """``data`` written and fsynced under a temporary name next to ``path``."""
        fd, tmp = mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
        self._pending.append((tmp, path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def synced(self, tmp: str, path: Path) -> None:
        """A temporary file (next to ``path``), written and fsynced by the caller, to rename to ``path``."""
        self._pending.append((tmp, path))

    def commit(self) -> None:
        """Every file renamed into place in the order added, then each folder fsynced once."""
        folders = {}
        for tmp, path in self._pending:
            os.replace(tmp, path)  # (should one fail, `discard` finds the names renamed before it gone)
            folders[os.path.dirname(os.path.abspath(path))] = None
        self._pending.clear()
        for folder in folders:
            fsync_dir(folder)

    def discard(self) -> None:
        for tmp, _ in self._pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._pending.clear()

    def __enter__(self) -> Publish:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()
