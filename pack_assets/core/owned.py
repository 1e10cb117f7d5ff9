"""What the writer owns in an output folder, so it deletes and overwrites only its own files.

``<out>/.pack_assets-files.json`` records every file the writer put there (shards, ``.tar.idx``,
``.nv-meta/*``, ``wids-index.json``), with the sha256 of the small ones. Names are added before a file is
created under them (a crash leaves a recorded name, never an unrecorded file of ours) and the record is
trimmed to the current plan at the end. A file the record does not name is a user's: never deleted,
never overwritten (the run refuses instead). A recorded small file whose bytes changed since (a hand-edited
``dataset.yaml``) or a recorded shard whose first pack is no longer ours counts as the user's too.

Output folders written before the record existed are adopted file by file when the content proves it
is ours: a shard whose first pack's ``_meta`` says ``tool: pack_assets``, and the index files that list
only such shards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from . import safety
from .tario import first_pack_meta

RECORD = ".pack_assets-files.json"
NV_META = ".nv-meta"
META_FILES = ("dataset.yaml", "split.yaml", ".info.json", "index.sqlite", "index.uuid")
WIDS = "wids-index.json"
LEGACY_INFO = f"{NV_META}/.info.yaml"  # written by early versions; stale next to .info.json
_UNHASHED = (".tar",)  # large, and the first pack's `_meta` says whose it is
_UNHASHED_NAMES = (f"{NV_META}/index.sqlite",)  # not byte-stable (SQLite page layout)


class ForeignFiles(RuntimeError):
    """Files the writer would overwrite were not written by it."""


def planned_files(shards: list[str]) -> set[str]:
    """Every path (relative to the output folder) the writer produces for these output shards."""
    names = {WIDS, *(f"{NV_META}/{m}" for m in META_FILES)}
    for s in shards:
        names |= {s, f"{s}.idx"}
    return names


def load(out: Path) -> dict[str, str | None] | None:
    """name -> sha256 (None when not hashed) of every recorded file; None when there is no record."""
    try:
        doc = json.loads((out / RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ForeignFiles(f"{out / RECORD} is unreadable ({e}); it records which files pack_assets wrote. "
                           "Restore it, or move the output folder's contents away and rerun") from None
    return dict(doc.get("files", {}))


def save(out: Path, files: dict[str, str | None]) -> None:
    doc = {"tool": "pack_assets", "note": "files written by pack_assets; it deletes or overwrites no others",
           "files": dict(sorted(files.items()))}
    safety.atomic_write_bytes(out / RECORD, (json.dumps(doc, indent=1) + "\n").encode())


def _hashed(name: str) -> bool:
    return not name.endswith(_UNHASHED) and name not in _UNHASHED_NAMES


def _tar_is_ours(path: Path) -> bool:
    return (first_pack_meta(path) or {}).get("tool") == "pack_assets"


def _listed_shards(out: Path, name: str) -> list[str] | None:
    """The shards an index file names (None when unreadable)."""
    p = out / name
    try:
        if name == WIDS:
            doc = json.loads(p.read_text())
            return [s["url"] for s in doc["shardlist"]] if doc.get("__kind__") == "wids-shard-index-v1" else None
        if name == LEGACY_INFO:
            return re.findall(r"^  (\S+): \d+$", p.read_text(), re.M)
        split = (out / NV_META / "split.yaml").read_text()
        return re.findall(r"^  - (\S+)$", split, re.M)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _proves_ours(out: Path, name: str) -> bool:
    """For an unrecorded file: does its content show the writer made it (an output folder from before
    the record)?"""
    p = out / name
    if name.endswith(".tar"):
        return _tar_is_ours(p)
    if name.endswith(".tar.idx"):
        return (out / name[:-4]).is_file() and _tar_is_ours(out / name[:-4])
    if name == WIDS or name.startswith(NV_META + "/"):
        listed = _listed_shards(out, name)
        return bool(listed) and all((out / s).is_file() and _tar_is_ours(out / s) for s in listed)
    return False


def _still_ours(out: Path, name: str, sha: str | None) -> bool:
    """For a recorded file: unchanged since the writer made it (small files), or still its shard."""
    p = out / name
    if name.endswith(".tar"):
        return _tar_is_ours(p)
    return sha is None or safety.file_sha256(p) == sha


def _foreign(out: Path, names, recorded: dict[str, str | None],
             unchanged: Callable[[str], bool] = lambda name: False) -> list[str]:
    """The names among `names` taken by a file that is not ours (a folder or a link at a name counts as not
    ours). `unchanged`: whether a recorded shard is as the writer left it, ours without reading its first pack."""
    foreign = []
    for name in sorted(names):
        p = out / name
        if not p.is_file():
            if p.exists() or p.is_symlink():
                foreign.append(name)
            continue
        if name in recorded and name.endswith(".tar") and unchanged(name):
            continue
        ours = _still_ours(out, name, recorded[name]) if name in recorded else _proves_ours(out, name)
        if not ours:
            foreign.append(name)
    return foreign


def _refuse(out: Path, foreign: list[str]) -> None:
    if not foreign:
        return
    what = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
    hint = (" (`.nv-meta/` here was not written by pack_assets, e.g. your own `energon prepare` output)"
            if any(n.startswith(NV_META) for n in foreign) else "")
    raise ForeignFiles(f"refusing to overwrite files in {out} that pack_assets did not write (or that were "
                       f"changed since): {what}{hint}. Move them away or choose another --output")


# the output shard names any plan gives (core/plan.py: packed-NNNNNN.tar) and their indexes
OUTPUT_SHARD = re.compile(r"packed-\d{6}\.tar(?:\.idx)?")


def writer_names(out: Path, extra: tuple[str, ...] = ()) -> set[str]:
    """The names present in `out` that some plan's writer writes: output shards and their indexes, the
    Energon and wids metadata, and `extra` (e.g. index mode's pack_index.json)."""
    if not out.is_dir():
        return set()
    fixed = {WIDS, *extra, *(f"{NV_META}/{m}" for m in META_FILES)}
    return ({p.name for p in out.iterdir() if OUTPUT_SHARD.fullmatch(p.name)}
            | {n for n in fixed if (out / n).exists() or (out / n).is_symlink()})


def refuse_foreign(out: Path, extra: tuple[str, ...] = (),
                   unchanged: Callable[[str], bool] = lambda name: False) -> None:
    """Before a run scans anything: refuse when a file at a name the writer may write is not ours (the
    writer's `claim` checks the planned names again). A recorded shard that ``unchanged`` vouches for (the
    writer's record of its size and mtime) is not read; any other recorded shard's first pack is."""
    _refuse(out, _foreign(out, writer_names(out, extra), load(out) or {}, unchanged))


def claim(out: Path, planned: set[str],
          unchanged: Callable[[str], bool] = lambda name: False) -> dict[str, str | None]:
    """Before writing: refuse when a planned name is taken by a file that is not ours; then record the
    planned names (so a crash never leaves an unrecorded file of ours). Returns the previous record. As in
    `refuse_foreign`, a recorded shard that ``unchanged`` vouches for (the writer's record of its size and
    mtime) is not read; any other recorded shard's first pack is (a rerun that keeps most shards read each
    one's first pack, cold, for nothing: docs/benchmarks.md, issue 41)."""
    out.mkdir(parents=True, exist_ok=True)
    before = load(out)
    recorded = dict(before or {})
    _refuse(out, _foreign(out, planned, recorded, unchanged))
    if before is None and (out / LEGACY_INFO).is_file() and _proves_ours(out, LEGACY_INFO):
        recorded[LEGACY_INFO] = None  # an early version's file: removed with the other stale ones
    # planned names are recorded without a hash until finish(): a crash in between leaves files that are ours
    # but rewritten, which a stale hash would refuse on the next run (their content was checked just above)
    save(out, {**recorded, **{n: None for n in planned}})
    return recorded


def finish(out: Path, planned: set[str], before: dict[str, str | None]) -> list[str]:
    """After writing: delete the recorded files the plan no longer has (unless they changed hands), and
    record the planned ones with their hashes. Returns the deleted names."""
    removed = []
    for name in sorted(set(before) - planned):
        p = out / name
        if p.is_file() and not p.is_symlink() and _still_ours(out, name, before[name]):
            p.unlink()  # a shard (or index) of an earlier, larger plan
            removed.append(name)
    save(out, {n: (safety.file_sha256(out / n) if _hashed(n) else None) for n in planned if (out / n).is_file()})
    return removed


_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-[a-z0-9_]{8}(?:-journal|-wal|-shm)?$")  # tempfile's 8 random chars


def remove_temp_leftovers(out: Path, names: set[str]) -> list[str]:
    """Remove what a killed writer left: temporary names of exactly the form the writer makes
    (``.{name}.tmp-XXXXXXXX``) for a file it owns; anything else is left alone."""
    owned = names | {RECORD}
    removed = []
    for folder, prefix in ((out, ""), (out / NV_META, NV_META + "/")):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            m = _TMP.match(p.name)
            if m and prefix + m["name"] in owned and p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(prefix + p.name)
    return removed


def foreign_files(out: Path, planned: set[str]) -> list[str]:
    """Files in the output folder (top level and `.nv-meta/`) that the writer does not own: left alone."""
    found = []
    for folder, prefix in ((out, ""), (out / NV_META, NV_META + "/")):
        if folder.is_dir():
            found += [prefix + p.name for p in folder.iterdir()
                      if prefix + p.name not in planned and p.name != RECORD and p.name != NV_META]
    return sorted(found)
