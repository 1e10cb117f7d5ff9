"""File-system safety shared by every stage: file modes, folder checks, locks.

Kept free of heavy imports (the reader imports the writer, which uses these).

- Modes: ``tempfile.mkstemp`` makes 0600 files and ``mkdtemp`` 0700 folders whatever the umask, so a
  temp-then-rename output would be unreadable to a training job running as another uid. ``mkstemp`` and
  ``mkdtemp`` here give what a plain ``open``/``mkdir`` would (0644/0755 under umask 022).
- Folders: ``check_paths`` refuses an output folder that overlaps the input, or a work folder inside the
  output or the input, before anything is written.
- Locks: ``work_lock`` (one pipeline per work folder) and ``path_lock`` (one writer per shard folder),
  advisory ``flock`` locks that the kernel drops when their process dies, re-entrant within a process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from . import faults

LOCK_NAME = ".pack_assets.lock"
LOCK_WAIT_ENV = "PACK_ASSETS_LOCK_WAIT"  # seconds a single-writer step waits for the work lock (default 600)


# --- modes ------------------------------------------------------------------------------------------------

def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask() is the only setter and
    setting it, even briefly, races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    return 0o777 & ~current_umask()


def mkstemp(prefix: str, dir: Path | str, suffix: str = "") -> tuple[int, str]:
    """``tempfile.mkstemp`` whose file ends with the mode a normal file would get (it keeps it through the
    rename that publishes it)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dir)
    try:
        os.fchmod(fd, file_mode())
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, path


def mkdtemp(prefix: str, dir: Path | str) -> str:
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    os.chmod(path, dir_mode())
    return path


def fsync_file(path: Path | str, flags: int = 0) -> None:
    """fsync a file by its name (``flags``: added to the open's, e.g. ``os.O_DIRECTORY``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path | str) -> None:
    """fsync a folder: the names renamed into (or out of) it last through a power cut."""
    fsync_file(path, os.O_DIRECTORY)


def replace(src: Path | str, dst: Path | str) -> None:
    """``os.replace``, then the destination's folder fsynced (and the source's, when another): after a power
    cut the name holds the old file or the new one, and a later rename never lands before this one. The
    file (or folder) renamed must be synced already."""
    os.replace(src, dst)
    folder, src_folder = os.path.dirname(os.path.abspath(dst)), os.path.dirname(os.path.abspath(src))
    fsync_dir(folder)
    if src_folder != folder:
        fsync_dir(src_folder)


def fsync_tree(folder: Path) -> None:
    """fsync every file of a folder just written and the folder itself (before it is renamed into place)."""
    for p in folder.iterdir():
        if p.is_file():
            fsync_file(p)
    fsync_dir(folder)


def atomic_write_bytes(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write under a temporary sibling name, fsync, rename (the folder fsynced): readers see the old file or
    the new one, also after a power cut. ``data``: bytes, or parts written in turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    whole = isinstance(data, bytes | bytearray | memoryview)
    size = len(data) if whole else 0
    try:
        with os.fdopen(fd, "wb") as f:
            for part in [data] if whole else data:
                f.write(part)
                size += 0 if whole else len(part)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if faults.is_no_space(e):
            written = f"{size:,} bytes" + ("" if whole else " so far")
            raise faults.NoSpace(f"no space left on device writing {path} ({written}): "
                                 f"{faults.free_bytes(path.parent):,} bytes free there; free space and rerun") from e
        raise


# --- folders ----------------------------------------------------------------------------------------------

class UnsafePaths(ValueError):
    """The folders overlap so that a run could delete or overwrite its own input or work files."""


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_paths(input_root: Path, work: Path, output: Path) -> None:
    """Refuse, before any write, an output folder that equals, contains or lies inside the input folder
    (the writer replaces and prunes its own shards there), and a work folder that equals or lies inside the
    output folder or the input folder. Symlinks are resolved, so a link cannot hide the overlap."""
    inp, wrk, out = (Path(p).expanduser().resolve() for p in (input_root, work, output))
    if out == inp:
        raise UnsafePaths(f"the output folder {out} is the input folder: packed shards would be written among "
                          "the source shards; choose another --output")
    if _inside(out, inp):
        raise UnsafePaths(f"the output folder {out} lies inside the input folder {inp}: its shards would be read "
                          "back as input on the next run; choose an --output outside the input")
    if _inside(inp, out):
        raise UnsafePaths(f"the output folder {out} contains the input folder {inp}; choose an --output that "
                          "does not hold the source shards")
    if _inside(wrk, out):
        raise UnsafePaths(f"the work folder {wrk} {'is' if wrk == out else 'lies inside'} the output folder "
                          f"{out}; choose a --work outside the output")
    if _inside(wrk, inp):
        raise UnsafePaths(f"the work folder {wrk} {'is' if wrk == inp else 'lies inside'} the input folder "
                          f"{inp}: the input would hold the catalog and its files; choose a --work outside the input")


# --- locks ------------------------------------------------------------------------------------------------

class WorkLocked(RuntimeError):
    """Another process holds the lock."""


_held: dict[str, list] = {}  # resolved lock path -> [fd, depth]: re-entrant within this process


def _holder(path: Path) -> str:
    try:
        h = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        h = {}
    if not h:
        return "another process (no details recorded yet)"
    return f"pid {h.get('pid')} ({h.get('command')}, since {h.get('since')})"


@contextlib.contextmanager
def path_lock(path: Path, command: str = "", wait: float | None = None,
              log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent, never deleted: deleting a lock file
    races with its next user). ``wait``: 0 refuses at once, None waits for ever, else seconds, then
    ``WorkLocked`` naming the holder. Re-entrant: a process that holds it enters again at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    entry = _held.get(key)
    if entry is not None and entry[2] == os.getpid():
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
        return
    fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        deadline = None if wait is None else time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WorkLocked(f"{path.parent} is in use by {_holder(path)}"
                                     + (f"; gave up after {wait:g} s" if wait else "")
                                     + ". Wait for it to finish (or, if that process is gone, rerun: the lock "
                                       "dies with its process)") from None
                if not told and log is not None:
                    log(f"{path.parent} is in use by {_holder(path)}; waiting"
                        + (f" up to {wait:g} s" if wait is not None else ""))
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": command,
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}).encode(), 0)
        _held[key] = [fd, 1, os.getpid()]
        try:
            yield
        finally:
            del _held[key]
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def file_sha256(path: str | Path) -> str:
    """A file's sha256, read in chunks (an output index or a tokenizer file is never held whole)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def forget_inherited_locks() -> None:
    """In a forked child: close its copies of the parent's lock descriptors, so the locks end with the
    parent's `with` blocks and are not held on by the child (a flock lasts while any copy is open)."""
    for key, (fd, _, pid) in list(_held.items()):
        if pid != os.getpid():
            os.close(fd)
            del _held[key]


def lock_wait() -> float:
    return float(os.environ.get(LOCK_WAIT_ENV, "600"))


def work_lock(work: Path, command: str, wait: float | None = 0, log: Callable[[str], None] | None = None):
    """One pipeline at a time per work folder: ``<work>/.pack_assets.lock``."""
    return path_lock(Path(work) / LOCK_NAME, command, wait, log)
