"""An output shard's whole-file digest, so that the default audit re-reads every shard without re-checking
each one. A clean audit that read a shard in full (tar structure, every document against the plan, every
member's sha256 against the manifest) records the digest of its bytes right after (`file_digest`, the file
still in the page cache). The next audit re-reads a shard that is unchanged since (same size, mtime and content
fingerprint as the record) only to hash it: where the digest is the recorded one, the bytes are the very
bytes that passed; any other shard, or one whose bytes changed under the same size and mtime, is read in full
(`vouched`). xxh3-128, not sha256: these digests guard against corruption and edits, not adversaries, and
hashing must stay under the disk's read speed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

CHUNK = 8 << 20


def file_digest(path: Path) -> str | None:
    """xxh3-128 of the file's bytes (hex), None when it cannot be read."""
    h = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    except OSError:
        return None
    return h.hexdigest()


def vouched(out_dir: Path, names: Iterable[str], recorded: dict[str, str], workers: int = 0) -> dict[str, str]:
    """Of ``names`` (unchanged since a clean audit by their stamps), those whose file digest, computed now, is
    the one that audit recorded: name -> digest. Hashed by ``workers`` threads (0: one per core)."""
    todo = sorted(n for n in names if isinstance(recorded.get(n), str))
    if not todo:
        return {}
    with ThreadPoolExecutor(max(1, min(workers or os.cpu_count() or 1, len(todo)))) as pool:
        digests = dict(zip(todo, pool.map(lambda n: file_digest(out_dir / n), todo)))
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
