"""Packs as the writer stored them: from an output folder (copy or index mode), tar paths, or one WebDataset
sample's parts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ._core import INDEX_PART, SourceFiles, iter_pack_parts


def iter_packs(paths: str | Path | Iterable[str | Path], source_root: str | Path | Mapping | None = None,
               verify: bool = False) -> Iterator[dict]:
    """Each pack of the given output shards: ``pack_id``, ``media_type``, ``samples`` (with ``media`` as a
    list of (part name, bytes) in order) and ``_meta``. ``paths``: an output folder (copy or index mode;
    its shards in order), one tar, or a list of tars. An index-mode pack's media are read from its source
    shards (``pread`` on kept fds) after their size and mtime are checked against the index: a changed
    source raises ``IndexSourceChanged`` naming it before any of its bytes are used. ``source_root``: where
    the sources are now, when they moved since packing (a folder; for a recipe's epoch folder, a mapping
    dataset name -> folder of the datasets that moved); ``verify``: also compare each range's sha256."""
    with SourceFiles(source_root, verify) as sources:
        for path in shard_paths(paths):
            for _, parts in iter_pack_parts(path):
                yield _pack(sources.resolve(parts) if INDEX_PART in parts else parts)


def shard_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The tars to read: an output folder's shards (the order `wids-index.json` lists them in, else by
    name), one tar, or the given list."""
    if not isinstance(paths, (str, Path)):
        return [Path(p) for p in paths]
    p = Path(paths)
    if not p.is_dir():
        return [p]
    try:
        return [p / s["url"] for s in json.loads((p / "wids-index.json").read_text())["shardlist"]]
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(p.glob("*.tar"))


def _pack(parts: dict) -> dict:
    doc = parts["json"]
    doc = json.loads(doc) if isinstance(doc, (bytes, str)) else json.loads(json.dumps(doc))  # a copy: media go in
    for s in doc["samples"]:
        s["media"] = [(name, parts[name]) for name in s["media"]]
        # members the record does not name, carried byte for byte; never fed to the model
        s["extra"] = [(name, parts[name]) for name in s.get("extra", [])]
    return doc


def pack_from_parts(parts: dict, sources: SourceFiles | None = None) -> dict:
    """A pack as ``iter_packs`` yields it, from one WebDataset sample's parts (``{"json": ..., part name:
    bytes}``, e.g. a Megatron-Energon ``CrudeWebdataset`` raw sample with ``decoder = None``). An index-mode
    sample (an ``index.json`` part) is read from its sources through ``sources`` (keep one
    ``SourceFiles(source_root)`` per worker; default: one per process, at the recorded input root)."""
    if INDEX_PART in parts:
        parts = (sources or _process_sources()).resolve(parts)
    return _pack(parts)


_SOURCES: tuple[int, SourceFiles] | None = None


def _process_sources() -> SourceFiles:
    global _SOURCES
    if _SOURCES is None or _SOURCES[0] != os.getpid():  # a forked worker opens its own fds
        _SOURCES = (os.getpid(), SourceFiles())
    return _SOURCES[1]
