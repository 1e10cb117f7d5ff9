"""Manifest stage: scan WebDataset tar shards in place.

A chain of small generators, as webdataset itself reads shards: tar headers -> samples grouped by key ->
classified samples (ok rows with member offsets/sizes/sha256, or rejected rows with a reason).
Nothing is extracted; payloads are read by ``seek(offset); read(size)``; memory does not grow with the
shard, except for the set of keys seen (to catch duplicate keys).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import posixpath
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import faults, jsonform, store
from .conversation import media_refs, normalize, place_media
from .media import IMAGE_EXTS, VIDEO_EXTS, probe_image, probe_video
from .reasons import ReasonError
from .records import MANIFEST_FORMAT, SAMPLES_SCHEMA, Member, Rejection, Sample, Scanned, ShardInfo
from .results import KEPT, FilePath
from .settings import ScanOptions
from .tario import Entry, RangeFile, group_by_key, is_meta_member, is_unsafe_name, iter_entries, split_key

CAPTION_EXTS = frozenset({"txt", "caption", "cap"})
_CHUNK = 1 << 20
_IMAGE_PREFIX = 16 << 10
_READ_AHEAD = 256  # samples whose headers the scan walks before classifying them (`_read_ahead`)


class _Reader:
    """Reads payloads of one shard by ``pread`` (no shared file position, no read-ahead of unused bytes)."""

    def __init__(self, f, options: ScanOptions):
        self.f, self.fd, self.options = f, f.fileno(), options

    def read(self, e: Entry, limit: int | None = None) -> bytes:
        size = e.size if limit is None else min(e.size, limit)
        data = os.pread(self.fd, size, e.offset)
        while len(data) < size:  # pread may return short reads on some filesystems
            more = os.pread(self.fd, size - len(data), e.offset + len(data))
            if not more:
                break
            data += more
        return data

    def hash(self, e: Entry) -> str:
        h = hashlib.sha256()
        pos, end = e.offset, e.offset + e.size
        while pos < end:
            chunk = os.pread(self.fd, min(_CHUNK, end - pos), pos)
            if not chunk:
                break
            h.update(chunk)
            pos += len(chunk)
        return h.hexdigest()


def _ext(part: str) -> str:
    return part.rsplit(".", 1)[-1].lower() if part else ""


def _resolve_refs(refs: list[str], members: list[tuple[Entry, str]], kind: str) -> list[tuple[Entry, str]]:
    """Order media members by the names the record gives; positional when none of the names resolve."""
    if not refs:
        return members
    if len(refs) == 1 == len(members) and refs[0] == members[0][1]:  # one member, named by its part: no table
        return members
    by_name: dict[str, tuple[Entry, str]] = {}
    for e, part in members:
        for alias in (part, e.name, posixpath.basename(e.name)):
            by_name.setdefault(alias, (e, part))
    found = [by_name.get(r) or by_name.get(posixpath.basename(r)) for r in refs]
    if all(found):
        return found  # type: ignore[return-value]
    if not any(found) and len(refs) == len(members):
        return members
    missing = [r for r, f in zip(refs, found) if f is None]
    raise ReasonError("missing_media", f"{kind} named in the record not in the sample: {missing[:5]}")


@dataclass(slots=True)
class _Parts:
    """A sample's members by role, in tar order: the record (first .json), a caption, images, videos."""

    json: Entry | None = None
    caption: Entry | None = None
    images: list[tuple[Entry, str]] = field(default_factory=list)
    videos: list[tuple[Entry, str]] = field(default_factory=list)


def _check_entries(entries: list[Entry], options: ScanOptions) -> None:
    """The archive broke in this sample, or a member is one we never read."""
    broken = next((e for e in entries if e.kind == "break"), None)
    if broken is not None:
        raise ReasonError(broken.reason, broken.detail)
    for e in entries:
        if is_unsafe_name(e.name):
            raise ReasonError("unsafe_member_name", f"member {e.name!r}")
        if e.kind != "file":
            raise ReasonError("unsupported_member_type", f"member {e.name!r} is a {e.kind}")
        if e.size > options.max_member_bytes:
            raise ReasonError("member_too_large", f"member {e.name!r} is {e.size} bytes > {options.max_member_bytes}")


def _find_parts(entries: list[Entry]) -> _Parts:
    parts = _Parts()
    for e in entries:
        _, part = split_key(e.name)
        ext = _ext(part)
        if ext == "json" and parts.json is None:
            parts.json = e
        elif ext in CAPTION_EXTS and parts.caption is None:
            parts.caption = e
        elif ext in IMAGE_EXTS:
            parts.images.append((e, part))
        elif ext in VIDEO_EXTS:
            parts.videos.append((e, part))
    return parts


def _hash_members(sample: Sample, entries: list[Entry], parts: _Parts, reader: _Reader,
                  options: ScanOptions) -> dict[str, bytes]:
    """Every member's row (offset, size, sha256); returns the bytes of the small ones we parse anyway."""
    small: dict[str, bytes] = {}
    image_names = {i.name for i, _ in parts.images}
    for e in entries:
        text_part = e is parts.json or e is parts.caption
        wants_bytes = text_part or (options.hash_members and e.name in image_names)
        if wants_bytes and e.size <= options.max_json_bytes:
            data = reader.read(e)
            small[e.name] = data
            # text members are read anyway: always hashed, so an in-place edit shows (fingerprint, audit)
            sha = hashlib.sha256(data).hexdigest() if options.hash_members or text_part else None
        else:
            sha = reader.hash(e) if options.hash_members else None
        sample.members.append(Member(sample.sample_id, e.name, e.offset, e.size, sha))
    return small


def _read_record(sample: Sample, entries: list[Entry], parts: _Parts, small: dict[str, bytes],
                 options: ScanOptions) -> tuple[dict, str | None, bool]:
    """The parsed JSON record (``{}`` without one), the caption text (None without one), and whether the record's
    strings are long ones (`jsonform.long_strings`: a hint for the JSON text of its messages)."""
    if parts.json is None and parts.caption is None:
        raise ReasonError("missing_json", f"members: {[e.name for e in entries][:8]}")
    record: dict = {}
    caption, long = None, False
    if parts.json is not None:
        name = parts.json.name
        if name not in small:
            raise ReasonError("member_too_large", f"json member is {parts.json.size} bytes > {options.max_json_bytes}")
        try:
            text = small[name].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ReasonError("invalid_utf8", f"{name}: {e}") from None
        long = jsonform.long_strings(small[name])
        record, exact = _loads(text, small[name], long, name)
        if not isinstance(record, dict):
            raise ReasonError("json_not_object", f"{name} holds a {type(record).__name__}")
        sample.json_member = name
        sample.record_exact = exact  # json.dumps(record, ensure_ascii=False)'s text
    if parts.caption is not None:
        try:
            caption = small[parts.caption.name].decode("utf-8")
        except (UnicodeDecodeError, KeyError) as e:
            raise ReasonError("invalid_utf8", f"{parts.caption.name}: {e}") from None
        if parts.json is None:
            sample.json_member = parts.caption.name
    return record, caption, long


def _loads(text: str, utf8: bytes, long: bool, name: str) -> tuple[object, bool]:
    """(``json.loads(text)``, whether ``text`` is json.dumps' of that dict), by `jsonform.loads_form` (``utf8``:
    the text's UTF-8; ``long``: its `long_strings`): the same value or the same error."""
    try:
        return jsonform.loads_form(text, utf8, long)
    except json.JSONDecodeError as e:
        raise ReasonError("invalid_json", f"{name}: {e}") from None


def _conversation(record: dict, caption: str | None, parts: _Parts, options: ScanOptions) -> list[dict]:
    """Normalized messages with the media placed; ``parts`` media reordered as the record names them."""
    messages = normalize(record, caption if ("messages" not in record and "conversations" not in record) else None)
    refs = media_refs(record)
    parts.images = _resolve_refs(refs.images, parts.images, "images")
    parts.videos = _resolve_refs(refs.videos, parts.videos, "videos")
    n_images, n_videos = len(parts.images), len(parts.videos)
    if n_images + n_videos > options.max_media_per_sample:
        raise ReasonError("too_many_media", f"{n_images} images + {n_videos} videos > {options.max_media_per_sample}")
    return place_media(messages, n_images, n_videos)


def _measure_images(sample: Sample, images: list[tuple[Entry, str]], small: dict[str, bytes], reader: _Reader) -> None:
    """``sample.image_sizes`` from the headers; a rejected sample keeps the sizes read before the bad one."""
    for e, part in images:
        ext = _ext(part)
        if e.size == 0:
            raise ReasonError("bad_image", f"{e.name} is zero bytes")
        try:
            data = small.get(e.name)
            if data is None:  # not hashing: the header is in the first few KB (rarely after a big EXIF block)
                try:
                    w, h = probe_image(reader.read(e, _IMAGE_PREFIX), ext)
                except Exception as ex:
                    faults.raise_device_fault(ex, reader.f.name)
                    w, h = probe_image(io.BufferedReader(RangeFile(reader.f, e.offset, e.size)), ext)
            else:
                w, h = probe_image(data, ext)
        except Exception as ex:  # Pillow raises many types for bad headers
            faults.raise_device_fault(ex, reader.f.name)
            raise ReasonError("bad_image", f"{e.name}: {type(ex).__name__}: {ex}") from None
        sample.image_sizes.append([w, h])


def _video_metas(videos: list[tuple[Entry, str]], reader: _Reader) -> list[dict]:
    metas = []
    for e, _ in videos:
        try:
            metas.append(probe_video(io.BufferedReader(RangeFile(reader.f, e.offset, e.size))))
        except Exception as ex:  # PyAV raises its own error tree for broken containers
            faults.raise_device_fault(ex, reader.f.name)
            raise ReasonError("bad_video", f"{e.name}: {type(ex).__name__}: {ex}") from None
    return metas


def classify(
    shard: str, key: str, entries: list[Entry], reader: _Reader, options: ScanOptions
) -> tuple[Sample, Rejection | None]:
    """One sample: members with offsets/hashes, its conversation and media metadata, or a reason."""
    sample = Sample(sample_id=f"{shard}/{key}", shard=shard, key=key)
    try:
        _check_entries(entries, options)
        parts = _find_parts(entries)
        small = _hash_members(sample, entries, parts, reader, options)
        record, caption, long = _read_record(sample, entries, parts, small, options)
        messages = _conversation(record, caption, parts, options)
        _measure_images(sample, parts.images, small, reader)
        video_meta = _video_metas(parts.videos, reader)
    except ReasonError as e:  # every step rejects by raising; the sample keeps what was filled in so far
        sample.status, sample.reason = "rejected", e.reason
        return sample, Rejection(shard, key, e.reason, e.detail)
    images, videos = parts.images, parts.videos
    sample.n_images, sample.n_videos = len(images), len(videos)
    sample.media_type = "video" if videos else ("image" if images else "text")
    sample.media_members = [e.name for e, _ in images] + [e.name for e, _ in videos]
    # every other member (a .cls, a second JSON, an image the record does not name) travels with the sample
    used = {sample.json_member, *sample.media_members}
    sample.extra_members = [e.name for e in entries if e.name not in used]
    sample.conversation = jsonform.dumps(messages, long)  # (the record's texts are its messages')
    sample.messages = messages
    sample.videos = json.dumps(video_meta) if video_meta else "[]"
    return sample, None


def scan_shard(
    path: str | os.PathLike, shard: str, options: ScanOptions = ScanOptions(), info: ShardInfo | None = None
) -> Iterator[Sample | Rejection]:
    """Every sample of one shard as a Sample (ok or rejected) plus Rejection rows; fills ``info``."""
    t0 = time.perf_counter()
    path = os.fspath(path)
    if info is None:
        info = ShardInfo(shard=shard, path=path, size=0, mtime_ns=0)
    try:
        st = os.stat(path)
        info.size, info.mtime_ns = st.st_size, st.st_mtime_ns
        f = open(path, "rb", buffering=_CHUNK)
    except OSError as e:
        faults.raise_device_fault(e, path)
        info.status = "rejected"
        yield Rejection(shard, None, "unreadable_shard", f"{type(e).__name__}: {e}")
        return
    seen: set[str] = set()
    reader = _Reader(f, options)
    with f:
        try:
            for batch in _read_ahead(group_by_key(_counting(iter_entries(f, info.size), info))):
                for key, entries in batch:
                    yield from _emit(shard, key, entries, reader, options, seen, info)
        except ReasonError as e:  # only iter_entries raises here (classify's are caught per sample): shard-level
            info.status = "empty" if e.reason == "empty_shard" else "rejected"
            yield Rejection(shard, None, e.reason, e.detail)
        except Exception as e:  # unforeseen: the samples yielded so far stand, the run goes on without the rest
            faults.raise_device_fault(e, path)
            info.status = "truncated"
            yield Rejection(shard, None, "scan_error", f"{type(e).__name__}: {e} (samples before it are kept)")
    if info.status == "ok" and info.n_samples == 0:
        info.status = "empty"
        yield Rejection(shard, None, "empty_shard", "the archive holds no samples")
    try:
        after = os.stat(path)
        changed = (after.st_size, after.st_mtime_ns) != (info.size, info.mtime_ns)
    except OSError:
        changed = True
    if changed:  # the recorded size/mtime no longer match: the writer refuses it and the next run rescans
        info.status = "changed"
        yield Rejection(shard, None, "shard_changed", "the shard changed (or vanished) while it was being scanned")
    info.seconds = time.perf_counter() - t0


def _read_ahead(groups: Iterator[tuple[str, list[Entry]]], n: int = _READ_AHEAD) -> Iterator[list]:
    """The samples' member lists in runs of ``n``: the headers of the next ``n`` samples walked in one go, then
    those samples classified (the walk interleaved sample by sample with the classification cost more CPU:
    docs/benchmarks.md, issue 41, session 56). An error of the walk comes after the samples walked before it, as
    it did one sample at a time."""
    batch: list = []
    try:
        for g in groups:
            batch.append(g)
            if len(batch) == n:
                yield batch
                batch = []
    except Exception:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def _counting(entries: Iterator[Entry], info: ShardInfo) -> Iterator[Entry]:
    try:
        for e in entries:
            if e.kind == "break":
                info.status = "truncated"
            else:
                info.n_members += 1
                info.n_meta_members += is_meta_member(e.name)
            yield e
    except ReasonError:  # the file is no tar at all: a shard-level row, not a break
        raise
    except Exception as ex:  # e.g. a bug reading the archive: a break, so the sample in progress gets the row
        faults.raise_device_fault(ex, info.path)  # the device's error: no row a rerun would keep
        info.status = "truncated"
        yield Entry("", -1, 0, "break", f"reading the archive: {type(ex).__name__}: {ex}", reason="scan_error")


def _emit(shard, key, entries, reader, options, seen, info) -> Iterator[Sample | Rejection]:
    if key is None:  # a break before any sample began: nothing to attribute it to but the shard
        yield Rejection(shard, None, entries[0].reason, entries[0].detail)
        return
    info.n_samples += 1
    if key in seen:
        info.n_rejected += 1
        sid = f"{shard}/{key}#dup{info.n_samples}"
        yield Sample(sid, shard, key, status="rejected", reason="duplicate_key")
        yield Rejection(shard, key, "duplicate_key",
                        f"key {key!r} seen earlier in this shard (members {[e.name for e in entries][:4]})")
        broken = next((e for e in entries if e.kind == "break"), None)
        if broken is not None:  # the archive also breaks here: say so, not only that the key repeats
            yield Rejection(shard, None, broken.reason, broken.detail)
        return
    seen.add(key)
    try:
        sample, rejection = classify(shard, key, entries, reader, options)
    except Exception as e:  # unforeseen input: this sample gets a reason row, its neighbours go on
        faults.raise_device_fault(e, reader.f.name)
        sample = Sample(f"{shard}/{key}", shard, key, status="rejected", reason="scan_error")
        rejection = Rejection(shard, key, "scan_error", f"{type(e).__name__}: {e}")
    if rejection is None:
        info.n_ok += 1
    else:
        info.n_rejected += 1
    yield sample
    if rejection is not None:
        yield rejection


# -- the stage: one shard's scan into <work>/manifest/<shard>/, kept while the tar is unchanged --------------


@dataclass(frozen=True)
class ShardManifest:
    """One shard's scan: counts, and whether every rejected sample has its reason row."""

    shard: str
    status: str
    samples: int
    ok: int
    rejected: int
    members: int
    bytes: int
    seconds: float
    cached: bool  # the stored scan was current: not rescanned
    reason_rows: int  # sample-level rows in rejected.parquet

    @property
    def accounted(self) -> bool:
        return self.samples == self.ok + self.rejected and self.reason_rows == self.rejected


@dataclass(frozen=True)
class ManifestSummary:
    """The scans of one run's shards (one partition, or a backfill's batch)."""

    shards: list[ShardManifest]
    folder: Path

    @property
    def accounted(self) -> bool:
        return all(s.accounted for s in self.shards)

    def total(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.shards)

    def as_metadata(self) -> dict:
        return {"dagster/row_count": self.total("samples"),
                "status": ", ".join(sorted({s.status for s in self.shards})),
                "ok": self.total("ok"), "rejected": self.total("rejected"), "members": self.total("members"),
                "shard_bytes": self.total("bytes"), "seconds": round(sum(s.seconds for s in self.shards), 3),
                "dagster/uri": FilePath(self.folder), "dagster/column_schema": SAMPLES_SCHEMA}


def manifest_is_current(input_root: Path, work: Path, shard: str, shard_info: dict | None = None) -> dict | None:
    """The stored scan of a shard whose size and mtime have not changed since, else None. ``shard_info``: its
    `store.read_shard_info` when the caller has read it (else read here)."""
    info = shard_info or store.read_shard_info(work, shard)
    try:
        st = store.source_tar(input_root, shard).stat()
    except OSError:
        return None
    if info and (info["size"], info["mtime_ns"]) == (st.st_size, st.st_mtime_ns) \
            and info.get("manifest_format") == MANIFEST_FORMAT:  # an older version's manifest is rescanned
        return info
    return None


@faults.names_full_disk(faults.WORK)
def run_manifest(input_root: Path, work: Path, shard: str, options: ScanOptions = ScanOptions(),
                 force: bool = False, keep: Scanned | None = None) -> ShardManifest:
    """Scan one shard into ``<work>/manifest/<shard>/``; an unchanged shard (size, mtime) is not rescanned.
    ``keep``: filled with the scan when there is one (its info and samples), for a count in this process."""
    with store.shard_lock(work, shard):  # a concurrent run of this shard finishes first; then it is current
        info = None if force else manifest_is_current(input_root, work, shard)
        cached = info is not None
        if not cached:
            path = store.source_tar(input_root, shard)
            scanned = ShardInfo(shard=shard, path=str(path), size=0, mtime_ns=0)
            records = scan_shard(path, shard, options, scanned)
            store.write_manifest(work, shard, records if keep is None else _kept(records, keep), scanned)
            info = dataclasses.asdict(scanned)
            if keep is not None:
                keep.info = scanned
        reasons = store.read_parquet(store.manifest_dir(work, shard) / "rejected.parquet", ["key"]).column("key")
    return ShardManifest(shard=shard, status=info["status"], samples=info["n_samples"], ok=info["n_ok"],
                         rejected=info["n_rejected"], members=info["n_members"], bytes=info["size"],
                         seconds=round(info["seconds"], 3), cached=cached,
                         reason_rows=len(reasons) - reasons.null_count)


def _kept(records: Iterator[Sample | Rejection], keep: Scanned) -> Iterator[Sample | Rejection]:
    for rec in records:
        if isinstance(rec, Sample):
            keep.samples.append(rec)
        yield rec


def run_manifests(input_root: Path, work: Path, shards: list[str], options: ScanOptions = ScanOptions(),
                  log: Callable[[str], None] | None = None, by_helpers: Collection[str] = (),
                  on_shard: Callable[[ShardManifest], None] | None = None) -> ManifestSummary:
    """Scan the shards one by one, a log line and an `on_shard` call each. `by_helpers`: the shards this
    command's helper processes scanned just before (runner/shardwork.py): a current scan of one of them is
    theirs, not an earlier run's."""
    out = []
    for shard in shards:
        s = run_manifest(input_root, work, shard, options)
        if log:
            log(f"{shard}: {s.ok} ok, {s.rejected} rejected of {s.samples} samples in {s.seconds} s"
                f"{KEPT[shard in by_helpers] if s.cached else ''}")
        out.append(s)
        if on_shard:
            on_shard(s)
    return ManifestSummary(out, store.manifest_dir(work, shards[0]))
