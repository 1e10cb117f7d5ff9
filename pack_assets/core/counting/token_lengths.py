"""token_lengths stage: every ok sample of a shard counted for the target model, by its profile's rule (the
fast rule, core/counting/tokens.py, or the processor rule, core/counting/procount.py: `counters.counter_for` picks).
Each row's
``counted_by`` says which. A shard's counts are kept while its manifest and the profile are unchanged."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from .. import faults, jsonform, store
from ..reasons import ReasonError
from ..records import TOKEN_LENGTHS_SCHEMA, Rejection, Scanned
from ..results import KEPT, FilePath
from .counters import Counter, counter_for
from .profiles import ModelProfile


def count_shard_rows(counter: Counter, samples: Iterable[dict], media_bytes: dict[str, int]
                     ) -> tuple[list[dict], list[Rejection]]:
    """token_lengths rows for a shard's manifest rows (ok ones are counted; rejected ones are skipped). A row's
    ``messages``, where it has them, are its ``conversation`` already parsed."""
    cols, rejections = _count_columns(counter, [s for s in samples if s["status"] == "ok"], dict.get, media_bytes)
    names = TOKEN_LENGTHS_SCHEMA.names
    return [dict(zip(names, row)) for row in zip(*(cols[name] for name in names))], rejections


def count_scanned_columns(counter: Counter, scanned: Scanned) -> tuple[dict[str, list], list[Rejection]]:
    """`count_shard_rows` of a scan in memory (of `_scanned_rows`' rows), as columns (TOKEN_LENGTHS_SCHEMA's names,
    one list each): the same values, without a dict per row."""
    return _count_columns(counter, [s for s in scanned.samples if s.status == "ok"], getattr, _media_bytes(scanned))


_COUNTED = ("text_tokens", "image_tokens", "video_tokens", "total_tokens")


def _count_columns(counter: Counter, ok: list, get: Callable, media_bytes: dict[str, int]
                   ) -> tuple[dict[str, list], list[Rejection]]:
    """The token_lengths columns (one list per name) of ok samples, each field read by ``get(sample, name)``
    (`dict.get` of a manifest row, `getattr` of a scanned `Sample`), and the rejections of refused counts."""
    items = ((jsonform.loads(get(s, "conversation")) if (m := get(s, "messages")) is None else m,
              get(s, "image_sizes") or [],
              [] if (v := get(s, "videos")) in (None, "", "[]") else json.loads(v)) for s in ok)
    results = list(counter.count_many(items))
    refused = [r if isinstance(r, ReasonError) else None for r in results]
    cols = {name: [get(s, name) for s in ok] for name in ("sample_id", "shard", "media_type", "n_images", "n_videos")}
    counted = [None if e else r for r, e in zip(results, refused)]
    cols.update((name, [r and r[name] for r in counted]) for name in _COUNTED)
    cols["vision_tokens"] = [r and r["image_tokens"] + r["video_tokens"] for r in counted]
    cols["media_bytes"] = [media_bytes.get(sid, 0) for sid in cols["sample_id"]]
    cols["profile"] = [counter.profile.name] * len(ok)
    cols["status"] = ["rejected" if e else "ok" for e in refused]
    cols["reason"] = [e and e.reason for e in refused]
    cols["counted_by"] = [r["counted_by"] if r else counter.profile.rule for r in counted]
    rejections = [Rejection(get(s, "shard"), get(s, "key"), e.reason, e.detail, stage="token_lengths")
                  for s, e in zip(ok, refused) if e]
    return cols, rejections


# -- one shard's counts into <work>/token_lengths/<profile>/<shard>/, kept while current -------------------


@dataclass(frozen=True)
class ShardCounts:
    shard: str
    profile: str
    counted: int
    rejected: int
    total_tokens: int
    seconds: float
    cached: bool  # counted earlier from the same manifest and profile: kept


@dataclass(frozen=True)
class TokenLengthsSummary:
    shards: list[ShardCounts]
    profile: str
    profile_fingerprint: str
    folder: Path

    def as_metadata(self) -> dict:
        counted = sum(s.counted for s in self.shards)
        rejected = sum(s.rejected for s in self.shards)
        seconds = sum(s.seconds for s in self.shards)
        return {"dagster/row_count": counted + rejected, "profile": self.profile,
                "profile_fingerprint": self.profile_fingerprint, "counted": counted, "rejected": rejected,
                "total_tokens": sum(s.total_tokens for s in self.shards),
                "samples_per_second": round(counted / seconds, 1) if seconds else None,
                "dagster/uri": FilePath(self.folder), "dagster/column_schema": TOKEN_LENGTHS_SCHEMA}


# 2: token_lengths.parquet has `counted_by`; older counts are stale, so every file a view reads has the column
TOKEN_LENGTHS_FORMAT = 2


def _token_stamp(work: Path, shard: str, profile: ModelProfile, shard_info: dict | None = None) -> str:
    info = shard_info or store.read_shard_info(work, shard) or {}
    return json.dumps({"profile": profile.fingerprint, "size": info.get("size"), "mtime_ns": info.get("mtime_ns"),
                       "format": TOKEN_LENGTHS_FORMAT})


def token_lengths_are_current(work: Path, shard: str, profile: ModelProfile, shard_info: dict | None = None) -> bool:
    """``shard_info``: the shard's `store.read_shard_info` when the caller has read it (else read here)."""
    stamp = store.token_dir(work, profile.name, shard) / "stamp.json"
    return stamp.exists() and stamp.read_text() == _token_stamp(work, shard, profile, shard_info)


@faults.names_full_disk(faults.WORK)
def run_token_lengths(work: Path, shard: str, profile: ModelProfile, force: bool = False,
                      scanned: Scanned | None = None) -> ShardCounts:
    """Count one shard for the profile; counts made from the same manifest and profile are kept. ``scanned``:
    the scan this process just wrote (``scan.run_manifest(keep=)``), counted from memory while the manifest on
    disk is still that scan."""
    with store.shard_lock(work, shard):  # the manifest read here and the stamp written last stay paired
        tdir = store.token_dir(work, profile.name, shard)
        if not force and token_lengths_are_current(work, shard, profile):
            t = store.read_parquet(tdir / "token_lengths.parquet", ["status", "total_tokens"]).to_pylist()
            ok = [r["total_tokens"] for r in t if r["status"] == "ok"]
            return ShardCounts(shard, profile.name, len(ok), len(t) - len(ok), int(sum(ok)), 0.0, cached=True)
        t0 = time.perf_counter()
        fresh = scanned is not None and _is_on_disk(work, shard, scanned)
        counter = counter_for(profile)
        if fresh:
            cols, rejections = count_scanned_columns(counter, scanned)
        else:
            samples, media_bytes = _manifest_rows(work, shard)
            cols, rejections = _count_columns(counter, [s for s in samples if s["status"] == "ok"], dict.get,
                                              media_bytes)
        rows = list(zip(*(cols[name] for name in TOKEN_LENGTHS_SCHEMA.names)))  # (in the schema's order)
        store.write_token_lengths(work, profile.name, shard, rows, rejections)
        ok = [n for n, status in zip(cols["total_tokens"], cols["status"]) if status == "ok"]
        store.atomic_write_text(tdir / "stamp.json", _token_stamp(work, shard, profile))
    return ShardCounts(shard, profile.name, len(ok), len(rejections), int(sum(ok)),
                       round(time.perf_counter() - t0, 3), cached=False)


def _is_on_disk(work: Path, shard: str, scanned: Scanned) -> bool:
    """Whether the manifest on disk is this scan (no other process has scanned the shard again since)."""
    info = store.read_shard_info(work, shard)
    return scanned.info is not None and info is not None and info == dataclasses.asdict(scanned.info)


def _scanned_rows(scanned: Scanned) -> tuple[list[dict], dict[str, int]]:
    """`_manifest_rows` from the samples in memory: the columns the count reads, the messages as parsed."""
    rows = [{"sample_id": s.sample_id, "shard": s.shard, "key": s.key, "status": s.status,
             "media_type": s.media_type, "n_images": s.n_images, "n_videos": s.n_videos,
             "image_sizes": s.image_sizes, "videos": s.videos, "messages": s.messages} for s in scanned.samples]
    return rows, _media_bytes(scanned)


def _media_bytes(scanned: Scanned) -> dict[str, int]:
    """Each scanned sample's media bytes (those with any), by sample id."""
    media_bytes: dict[str, int] = {}
    for s in scanned.samples:
        media = set(s.media_members)
        size = sum(m.size for m in s.members if m.name in media)
        if size:
            media_bytes[s.sample_id] = media_bytes.get(s.sample_id, 0) + size
    return media_bytes


def _manifest_rows(work: Path, shard: str) -> tuple[list[dict], dict[str, int]]:
    """A shard's manifest rows and each sample's media bytes (what the planner fills output shards by)."""
    mdir = store.manifest_dir(work, shard)
    if not (mdir / "samples.parquet").exists():
        raise FileNotFoundError(f"no manifest for shard {shard!r} under {mdir}: materialize `manifest` first")
    samples = store.read_parquet(mdir / "samples.parquet").to_pylist()
    members = store.read_parquet(mdir / "members.parquet", ["sample_id", "name", "size"]).to_pylist()
    media_names = {s["sample_id"]: set(s["media_members"] or []) for s in samples}
    media_bytes: dict[str, int] = {}
    for m in members:
        if m["name"] in media_names.get(m["sample_id"], ()):
            media_bytes[m["sample_id"]] = media_bytes.get(m["sample_id"], 0) + m["size"]
    return samples, media_bytes


def run_token_counts(work: Path, shards: list[str], profile: ModelProfile, log: Callable[[str], None] | None = None,
                     by_helpers: Collection[str] = (), on_shard: Callable[[ShardCounts], None] | None = None
                     ) -> TokenLengthsSummary:
    """Count the shards one by one, a log line and an `on_shard` call each. `by_helpers`: as in
    `scan.run_manifests`."""
    counts = []
    for shard in shards:
        c = run_token_lengths(work, shard, profile)
        if log:
            log(f"{shard}: counted {c.counted} samples, {c.rejected} rejected, {c.total_tokens} tokens"
                f"{KEPT[shard in by_helpers] if c.cached else ''}")
        counts.append(c)
        if on_shard:
            on_shard(c)
    folder = store.token_dir(work, profile.name, shards[0])
    return TokenLengthsSummary(counts, profile.name, profile.fingerprint, folder)
