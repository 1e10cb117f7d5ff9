"""Index mode's outputs (``output_mode: index``), as their readers see them: the format's names, where a
source shard is (under the input root the index recorded, or a recipe's dataset folders, or wherever the
data moved), and the stamp-checked ``pread`` of the byte ranges an index names, which the training reader and
the audit share. The writer (``core/write/index.py``) writes this format.

An index-mode output shard holds, per pack, ``<pack>.json`` (the document copy mode writes) and
``<pack>.index.json``: for every media and extra part the copy would hold, the source shard (path relative to
the input root), byte offset, size and sha256, plus each source shard's size and mtime as scanned and the
input root (absolute). A recipe's epochs (several inputs) record ``roots`` instead (dataset name -> absolute
folder); their sources are ``<dataset>/<shard>.tar``, the first path component naming the dataset.
``pack_index.json`` at the top lists the shards and every source's stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path


class SourceChanged(RuntimeError):
    """A source shard is not the one the manifest scanned (or an index names): its bytes are not the planned ones."""


INDEX_FILE = "pack_index.json"  # top level: input root (or roots), output shards, every source's stamp
INDEX_PART = "index.json"  # per pack: `<pack>.index.json`
FORMAT = "pack_assets-index-1"


class IndexSourceChanged(SourceChanged):
    """A source shard an index names is missing, or its size or mtime differ from when it was packed (or a
    range's sha256 differs, when verified): its bytes are not the ones planned."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"source shard {path} {detail}; rerun pack-assets on it (the index names byte ranges of "
                         "the shard as it was scanned)")
        self.path = path


Root = str | Mapping  # one input folder, or a recipe's dataset name -> folder (absolute when recorded)


def recorded_roots(input_root) -> Root:
    """What the index records: the input folder, or every dataset's folder, absolute."""
    if isinstance(input_root, Mapping):
        return {name: str(Path(p).resolve()) for name, p in sorted(input_root.items())}
    return str(Path(input_root).resolve())


def index_root(index: dict) -> Root:
    """The root(s) a pack's index or ``pack_index.json`` recorded (``roots``/``input_roots`` for a recipe)."""
    return index.get("roots") or index.get("input_roots") or index.get("root") or index.get("input_root") or ""


def source_path(recorded: Root, rel: str, override: str | Path | Mapping | None = None) -> Path:
    """Where source ``rel`` is: under the recorded root, or ``override`` (the data moved). For a recipe's
    index, ``rel`` is ``<dataset>/<shard>.tar`` and ``override`` a mapping of the datasets that moved (the
    others stay at their recorded folders)."""
    if isinstance(recorded, Mapping):
        if override is not None and not isinstance(override, Mapping):
            raise ValueError(f"this index names {len(recorded)} dataset folder(s) ({', '.join(recorded)}): give "
                             "source_root as a mapping dataset name -> folder")
        name, _, rest = rel.partition("/")
        base = (override or {}).get(name) or recorded.get(name)
        if base is None or not rest:
            raise ValueError(f"source {rel!r} names no dataset of the index ({', '.join(recorded)})")
        return Path(base) / rest
    if isinstance(override, Mapping):
        raise ValueError("this index has one input root: give source_root as a folder, not a mapping")
    return Path(override if override is not None else recorded) / rel


def is_index_folder(out_dir: Path) -> bool:
    return (Path(out_dir) / INDEX_FILE).is_file()


def load_index(out_dir: Path) -> dict | None:
    try:
        return json.loads((Path(out_dir) / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return None


class SourceFiles:
    """Source shards kept open (a bounded LRU of fds) for reading index-mode packs by ``pread``. Before any
    range of a source is read, its size and mtime are compared (``fstat`` of the kept fd, every pack) with
    the stamp the index recorded; ``verify`` also compares each range's sha256. ``root`` overrides the input
    root the index recorded (the data moved): a folder for a single input's index, or for a recipe's a
    mapping dataset name -> folder of the datasets that moved."""

    def __init__(self, root: str | Path | Mapping | None = None, verify: bool = False, limit: int = 64):
        self.root = dict(root) if isinstance(root, Mapping) else Path(root) if root is not None else None
        self.verify, self.limit, self.fds = verify, limit, {}

    def _fd(self, path: str, pinned: set[str]) -> int:
        fd = self.fds.pop(path, None)
        if fd is None:
            # least recently used first, never one the pack being read needs (a pack may name more sources)
            while len(self.fds) >= self.limit:
                old = next((p for p in self.fds if p not in pinned), None)
                if old is None:
                    break
                os.close(self.fds.pop(old))
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise IndexSourceChanged(path, f"cannot be opened ({type(e).__name__}: {e.strerror or e})") from None
        self.fds[path] = fd
        return fd

    def _checked(self, path: str, stamp: dict, pinned: set[str]) -> int:
        fd = self._fd(path, pinned)
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (stamp.get("size"), stamp.get("mtime_ns")):
            raise IndexSourceChanged(path, f"changed since it was packed (size {st.st_size}, mtime_ns "
                                           f"{st.st_mtime_ns}; indexed {stamp.get('size')}, {stamp.get('mtime_ns')})")
        return fd

    def resolve(self, parts: dict, problems: list[str] | None = None) -> dict:
        """``parts`` of one index-mode pack with each indexed part's bytes read from its source (and the
        ``index.json`` part gone): what the copy-mode shard's parts are. A changed source raises
        IndexSourceChanged, or with ``problems`` given its message goes there and its parts stay absent."""
        raw = parts[INDEX_PART]
        index = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
        recorded = index_root(index)
        out = {k: v for k, v in parts.items() if k != INDEX_PART}
        fds, bad, pinned, paths = {}, set(), set(), {}
        for rel, stamp in index.get("sources", {}).items():  # every stamp before the first byte is read
            path = paths[rel] = str(source_path(recorded, rel, self.root))
            pinned.add(path)
            try:
                fds[rel] = self._checked(path, stamp, pinned)
            except IndexSourceChanged as e:
                if problems is None:
                    raise
                problems.append(str(e))
                bad.add(rel)
        for part, r in index.get("parts", {}).items():
            if r["source"] in bad:
                continue
            data = os.pread(fds[r["source"]], r["size"], r["offset"])
            path = paths[r["source"]]
            try:
                if len(data) != r["size"]:
                    raise IndexSourceChanged(path, f"ends inside {part} ({len(data)} of {r['size']} bytes)")
                if self.verify and r.get("sha256") and hashlib.sha256(data).hexdigest() != r["sha256"]:
                    raise IndexSourceChanged(path, f"holds other bytes for {part} (sha256 differs from the index)")
            except IndexSourceChanged as e:
                if problems is None:
                    raise
                problems.append(str(e))
                continue
            out[part] = data
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sources_unchanged(index: dict, root: str | Path | Mapping | None = None) -> bool:
    """Every source shard ``pack_index.json`` names has its recorded size and mtime now."""
    recorded = index_root(index)
    for rel, stamp in index.get("sources", {}).items():
        try:
            st = os.stat(source_path(recorded, rel, root))
        except (OSError, ValueError):
            return False
        if (st.st_size, st.st_mtime_ns) != (stamp.get("size"), stamp.get("mtime_ns")):
            return False
    return True
