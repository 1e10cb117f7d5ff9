"""What a run says when the machine fails it, in one line: a folder it may not write, a full disk, an I/O
error on a file. Kept free of heavy imports (the scan, the writer and the preflight use it).

- ``check_writable``: the output and work folders refused before any scan when this user cannot write them
  (a read-only mount, missing permissions, an immutable file), by ``access(2)``, which also answers for root
  on a read-only file system or an immutable file.
- ``NoSpace``: a full disk named by its folder, with the bytes needed (where the plan knows them) and free.
  ``check_space`` refuses before writing when the bytes clearly do not fit; ``names_full_disk`` turns an
  ENOSPC met while writing into the same line.
- ``FileFault``: an I/O error of the device (EIO and kin) on a file, named. Such an error is the machine's,
  not the data's: the scan raises it instead of recording a reason row (which the next run would keep while
  the shard is unchanged), so the rerun after the fault is cleared reads the file again.
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

# the errors a device or a file system gives (not the data's, nor a missing or forbidden file)
DEVICE_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.ENXIO, errno.ENODEV, errno.ESTALE,
                           errno.ETIMEDOUT, errno.EREMOTEIO, errno.ENOLINK, errno.EROFS})
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
WORK = {"work": ("work", "--work")}  # names_full_disk's folders for a stage that writes the work folder only


class NotWritable(PermissionError):
    """The output or work folder cannot be written by this run."""


class NoSpace(RuntimeError):
    """A folder's file system is full (or the run's bytes clearly do not fit in it)."""


class FileFault(RuntimeError):
    """An I/O error of the device on one file; the message names the file."""


# --- permissions ------------------------------------------------------------------------------------------

def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable(path: Path) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0), effective_ids=True)
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def _why_not(path: Path) -> str:
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return "is on a read-only file system"
    return f"is not writable by this user (uid {os.geteuid()})"


def check_writable(folder: Path, what: str, flag: str, files: tuple[str, ...] = ()) -> None:
    """Refuse a folder (or, when it does not exist yet, the folder it would be made in) that this process
    cannot write, and any of ``files`` in it that it cannot replace or update: one line naming it."""
    folder = Path(folder).expanduser().absolute()
    base = _existing(folder)
    if not base.is_dir():
        raise NotWritable(f"the {what} folder {folder}: {base} is not a folder; choose another {flag}")
    targets = [base] + [folder / f for f in files if (folder / f).exists()]
    for path in targets:
        if not _writable(path):
            where = f"the {what} folder {folder}" if path == folder else (
                f"{path} (in the {what} folder)" if path.parent == folder else
                f"the {what} folder {folder} cannot be made: {path}")
            raise NotWritable(f"{where} {_why_not(path)}; make it writable or choose another {flag}")


# --- space ------------------------------------------------------------------------------------------------

def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(_existing(Path(folder).absolute())).free


def no_space(folder: Path, what: str, flag: str, needed: int | None) -> NoSpace:
    free = free_bytes(folder)
    need = f"needs at least {needed:,} bytes" if needed and needed > free else "needs more than that" + (
        f" (the plan's lower bound: {needed:,} bytes)" if needed else "")
    return NoSpace(f"no space left on device for the {what} folder {folder}: {free:,} bytes free, the run {need}; "
                   f"free space (or choose another {flag}) and rerun: what was finished is kept")


def check_space(folder: Path, what: str, flag: str, needed: int) -> None:
    """Refuse before writing when ``needed`` bytes (a lower bound) clearly do not fit in the folder."""
    if needed > free_bytes(folder):
        raise no_space(folder, what, flag, needed)


def is_no_space(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT, raised by Python's OS calls, reported in a library's message (DuckDB, Arrow), or SQLite's
    SQLITE_FULL (the Energon index, made while the shards are written)."""
    return (isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS) or "No space left on device" in str(exc) \
        or "Disk quota exceeded" in str(exc) \
        or (isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL)


def _fullest(paths: list[Path], names: list[str]) -> str:
    """The name of the folder with the least room; one on the same file system as the first is the first."""
    devices = [os.stat(_existing(p.absolute())).st_dev for p in paths]
    room = [free_bytes(p) if d != devices[0] else free_bytes(paths[0]) for p, d in zip(paths, devices)]
    return names[min(range(len(paths)), key=lambda i: (room[i], i))]


def names_full_disk(folders: dict[str, tuple[str, str]], needed: Callable[..., int | None] | None = None):
    """Decorate a stage so that a full disk met inside it is one ``NoSpace`` line naming the folder:
    ``folders`` maps a parameter of the stage to (what, flag), e.g. ``{"work": ("work", "--work")}``; of
    several, the one whose file system has the least room is named. ``needed(**arguments)``: the bytes the
    stage still needs when it failed, where it can tell. Another I/O error of the device that names no file
    (Arrow's, a bare ``os.read``'s) is a ``FileFault`` naming the stage's folders."""
    def wrap(stage):
        signature = inspect.signature(stage)

        @functools.wraps(stage)
        def run(*args, **kwargs):
            try:
                return stage(*args, **kwargs)
            except NoSpace:
                raise
            except Exception as e:
                bound = signature.bind(*args, **kwargs).arguments
                if is_device_fault(e) and not is_no_space(e):
                    places = " or ".join(f"the {what} folder {bound[p]}" for p, (what, _) in folders.items())
                    raise file_fault(e, places, "in") from e
                if not is_no_space(e):
                    raise
                param = _fullest([Path(bound[p]) for p in folders], list(folders))
                what, flag = folders[param]
                need = needed(**bound) if needed is not None else None
                raise no_space(Path(bound[param]), what, flag, need) from e
        return run
    return wrap


# --- device errors ----------------------------------------------------------------------------------------

def is_device_fault(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DEVICE_ERRNOS


def file_fault(exc: OSError, path, doing: str) -> FileFault:
    """The one line for an I/O error on ``path`` (the error's own file name when it carries one)."""
    return FileFault(f"I/O error {doing} {exc.filename or path}: {exc.strerror or exc}; nothing half-written is kept, "
                     "rerun once the device is fixed")


def raise_device_fault(exc: BaseException, path, doing: str = "reading") -> None:
    """Re-raise ``exc`` as a ``FileFault`` naming ``path`` when it is the device's error (in a handler that
    would otherwise record it as the data's); a ``FileFault`` goes on as it is; else return."""
    if isinstance(exc, FileFault):
        raise exc
    if is_device_fault(exc):
        raise file_fault(exc, path, doing) from exc
