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
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import imagesize
import pyarrow.parquet as pq
from PIL import Image

from . import store
from .conversation import ConversationError, media_refs, normalize, place_media
from .records import MANIFEST_FORMAT, Member, Rejection, Sample, ShardInfo
from .results import FilePath

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
VIDEO_EXTS = frozenset({"mp4", "avi", "mov", "mkv", "webm", "m4v"})
CAPTION_EXTS = frozenset({"txt", "caption", "cap"})
_COMPRESSION_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
_CHUNK = 1 << 20
_IMAGE_PREFIX = 16 << 10

# Reason codes are a stable interface (docs/formats.md lists them).
REASONS = {
    "not_a_tar": "the file is not a tar archive",
    "compressed_tar": "the .tar file holds compressed bytes (gzip, zstd, ...): decompress it first",
    "empty_shard": "the shard holds no samples (not an error)",
    "unreadable_shard": "the shard could not be opened (permission, I/O error)",
    "truncated_tar": "the archive ends inside this sample; samples before it are kept",
    "missing_json": "the sample has no .json member (and no caption member)",
    "invalid_json": "the .json member does not parse",
    "json_not_object": "the .json member is not a JSON object",
    "invalid_utf8": "a text member is not UTF-8",
    "no_conversation": "no messages/conversations/caption in the record",
    "bad_turn": "a conversation turn is not an object with a role",
    "unknown_role": "a conversation turn has a role we do not know",
    "missing_media": "media the record names is not among the sample's members",
    "placeholder_mismatch": "<image>/<video> placeholders do not match the media",
    "bad_image": "an image is zero bytes or its header cannot be read",
    "bad_video": "a video has no readable video stream",
    "duplicate_key": "the key already appeared earlier in the same shard",
    "unsafe_member_name": "a member name is absolute or contains '..'",
    "unsupported_member_type": "a member is a link, device or fifo (never followed)",
    "member_too_large": "a member is over the configured size limit",
    "too_many_media": "the sample has more media than the configured limit",
    "shard_changed": "the shard changed while it was scanned (it is rescanned on the next run)",
    "bad_tar_header": "a tar header or PAX record is malformed (bad number or length field); samples before it are kept",
    "scan_error": "an unexpected error while scanning (the detail names it); the rest of the shard and run go on",
}


class ShardError(Exception):
    """The shard as a whole cannot be read; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ScanOptions:
    hash_members: bool = True
    max_member_bytes: int = 4 << 30
    max_json_bytes: int = 64 << 20
    max_media_per_sample: int = 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """One tar member header: name, payload offset and size, and its type."""

    name: str
    offset: int
    size: int
    kind: str  # file | dir | link | special | break
    detail: str = ""
    header: int = -1  # where this member's header blocks begin (extended headers included)
    reason: str = "truncated_tar"  # for a break: the code its sample (or the shard) is rejected with


def split_key(name: str) -> tuple[str, str]:
    """WebDataset rule: the key is the path up to the first dot of the basename; the rest is the part."""
    dot = name.find(".", name.rfind("/") + 1)  # string ops, not posixpath: this runs for every member
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def is_meta_member(name: str) -> bool:
    base = name[name.rfind("/") + 1 :]
    return base.startswith("__") and base.split(".", 1)[0].endswith("__")


def is_unsafe_name(name: str) -> bool:
    return name.startswith("/") or ".." in name.split("/") or name.startswith("\\")


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of ``size`` bytes at ``offset`` of an open file."""

    def __init__(self, f, offset: int, size: int):
        self._f, self._start, self._size, self._pos = f, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


_BLOCK = 512
_TYPES = {b"0": "file", b"\0": "file", b"7": "file", b"5": "dir", b"1": "link", b"2": "link",
          b"3": "special", b"4": "special", b"6": "special"}


def _number(field: bytes) -> int:
    """A tar numeric field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] & 0x80:
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else n
    field = field.split(b"\0", 1)[0].strip()
    return int(field, 8) if field else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _signed_checksum(buf: bytes) -> int:
    """Some old tar writers summed the header as signed chars; tarfile accepts both."""
    return sum(struct.unpack("148b8x356b", buf)) + 256


def _pax(data: bytes) -> dict[str, str]:
    """PAX records ``"LEN key=value\n"``; a malformed record raises ValueError (a length that does not fit
    could otherwise loop forever or read past the header)."""
    out, pos = {}, 0
    while pos < len(data):
        if data[pos] == 0 and not data[pos:].strip(b"\0"):
            break  # NUL padding after the last record
        sp = data.find(b" ", pos)
        if sp < 0 or not data[pos:sp].isdigit():
            raise ValueError(f"PAX record at byte {pos}: no decimal length field")
        end = pos + int(data[pos:sp])
        if end <= sp + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise ValueError(f"PAX record at byte {pos}: length {int(data[pos:sp])} does not match the record")
        key, eq, value = data[sp + 1 : end - 1].partition(b"=")
        if not eq or not key:
            raise ValueError(f"PAX record at byte {pos}: no key=value")
        out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


def _next_name(fd, pos: int) -> str:
    """The name in the plain header at ``pos`` when it is one (what a broken extended header described), so
    the break is charged to that member's sample rather than to the complete sample before it."""
    buf = os.pread(fd, _BLOCK, pos)
    if len(buf) < _BLOCK or buf[156:157] in (b"x", b"g", b"L", b"K"):
        return ""
    try:
        if _number(buf[148:156]) not in (sum(buf) - sum(buf[148:156]) + 256, _signed_checksum(buf)):
            return ""
    except ValueError:
        return ""
    name = _text(buf[0:100])
    if buf[257:262] == b"ustar" and buf[345] != 0:
        name = _text(buf[345:500]) + "/" + name
    return name


def iter_entries(f, file_size: int, trailer: list[int] | None = None) -> Iterator[Entry]:
    """Yield tar headers in order, reading 512-byte headers with ``pread`` and seeking past payloads.

    Handles ustar (with prefix), GNU long names and PAX path/size records, the formats ``tarfile`` and
    webdataset write; the test suite checks it against ``tarfile`` on every fixture archive. Where the
    archive breaks, one ``kind="break"`` entry (named after the member it broke in, if known) ends the
    stream; a file that is not a tar at all raises ShardError. ``trailer`` receives the offset of the
    end-of-archive blocks.
    """
    head = f.read(8)
    f.seek(0)
    if not head:
        raise ShardError("empty_shard", "zero-byte file")
    for magic, kind in _COMPRESSION_MAGIC.items():
        if head.startswith(magic):
            raise ShardError("compressed_tar", f"starts with {kind} magic bytes")
    fd = f.fileno()
    pos, long_name, pax, start = 0, None, {}, None
    while True:
        if start is None:
            start = pos
        buf = os.pread(fd, _BLOCK, pos)
        if len(buf) < _BLOCK:
            if pos == 0:
                raise ShardError("not_a_tar", f"{len(buf)} bytes: shorter than one tar header")
            yield Entry("", pos, 0, "break", f"no end-of-archive blocks after offset {pos}")
            return
        if buf.count(0) == _BLOCK:
            if pos == 0:
                raise ShardError("empty_shard", "the archive holds only end-of-archive blocks")
            if trailer is not None:
                trailer.append(pos)
            return
        try:
            stored = _number(buf[148:156])
        except ValueError:
            stored = -1
        if stored != sum(buf) - sum(buf[148:156]) + 256 and stored != _signed_checksum(buf):
            if pos == 0:
                raise ShardError("not_a_tar", "no valid tar header at offset 0")
            yield Entry("", pos, 0, "break", f"invalid tar header at offset {pos}")
            return
        typeflag = buf[156:157]
        data_at = pos + _BLOCK
        extended = typeflag in (b"x", b"g", b"L", b"K")
        try:
            size = _number(buf[124:136])
            if size < 0:
                raise ValueError(f"negative size {size}")
        except ValueError as e:
            name = "" if extended else (long_name or pax.get("path") or _text(buf[0:100]))
            yield Entry(name, data_at, 0, "break", f"bad size field in the tar header at offset {pos}: {e}",
                        reason="bad_tar_header")
            return
        pos = data_at + -(-size // _BLOCK) * _BLOCK
        if extended:  # extended headers describe the next member
            if data_at + size > file_size:
                yield Entry("", data_at, size, "break", f"extended header at offset {data_at - _BLOCK} is cut short")
                return
            data = os.pread(fd, size, data_at)
            if len(data) < size:
                yield Entry("", data_at, size, "break", f"extended header at offset {data_at - _BLOCK} is cut short")
                return
            if typeflag == b"x":
                try:
                    pax = _pax(data)
                except ValueError as e:
                    yield Entry(_next_name(fd, pos), data_at, size, "break",
                                f"malformed PAX header at offset {data_at - _BLOCK}: {e}", reason="bad_tar_header")
                    return
            elif typeflag == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        name = _text(buf[0:100])
        if buf[257:262] == b"ustar" and buf[345] != 0:
            name = _text(buf[345:500]) + "/" + name
        if long_name is not None:
            name = long_name
        if "path" in pax:
            name = pax["path"]
        if "size" in pax:
            if not (pax["size"].isascii() and pax["size"].isdigit()):
                yield Entry(name, data_at, 0, "break", f"PAX size {pax['size'][:40]!r} of member {name!r} is not a "
                            f"number", reason="bad_tar_header")
                return
            size = int(pax["size"])
            pos = data_at + -(-size // _BLOCK) * _BLOCK
        long_name, pax, header, start = None, {}, start, None
        kind = _TYPES.get(typeflag, "special")
        if kind == "dir" or name.endswith("/"):
            kind, name = "dir", name.rstrip("/")
        if kind == "file" and data_at + size > file_size:
            detail = f"member {name!r} claims {size} bytes at offset {data_at}; the file has {file_size}"
            yield Entry(name, data_at, size, "break", detail)
            return
        yield Entry(name, data_at, size, kind, header=header)


def group_by_key(entries: Iterable[Entry]) -> Iterator[tuple[str, list[Entry]]]:
    """Runs of consecutive members with one key (directories and __meta__ members are not samples).

    A break joins the run it happened in: a nameless break (a bad header, a missing end-of-archive
    block) joins the run in progress, since that run may have lost members.
    """
    key, run = None, []
    for e in entries:
        if e.kind == "dir" or (e.kind != "break" and is_meta_member(e.name)):
            continue
        k = split_key(e.name)[0] if e.name else key
        if k != key and run:
            yield key, run
            run = []
        key = k
        run.append(e)
    if run:
        yield key, run


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


_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP",
                "tif": "TIFF", "tiff": "TIFF"}


# formats whose size imagesize reads exactly as Pillow does (tests/test_manifest.py compares them); it is
# 2-8x faster than Pillow's lazy open, which parses every marker table before the frame header
_FAST_FORMATS = {"JPEG", "PNG", "WEBP", "GIF"}
_MAX_PIXELS = 2 * (Image.MAX_IMAGE_PIXELS or 0) or None  # Pillow refuses more (DecompressionBombError)

try:  # imagesize.get() first checks its argument against a typing.Protocol, which on Python 3.11 costs as
    # much as the header parse; the reader beneath it takes our file object as is (version pinned < 3)
    from imagesize.imagesize import _read_image_metadata

    def _header_size(src) -> tuple[int, int]:
        try:
            m = _read_image_metadata(src, size=True, dpi=False, colors=False, rotation=False, channels=False)
        except Exception:  # imagesize's own contract: unreadable means (-1, -1)
            return -1, -1
        return m.width, m.height
except ImportError:  # pragma: no cover - a later imagesize without the helper

    def _header_size(src) -> tuple[int, int]:
        return imagesize.get(src, exif_rotation=False)


def probe_image(data_or_file, ext: str = "") -> tuple[int, int]:
    """Width and height from the header, no pixel decoded: imagesize for the common formats, Pillow's lazy
    open for the rest and for anything imagesize cannot read (so a bad image gets Pillow's own error)."""
    src = io.BytesIO(data_or_file) if isinstance(data_or_file, bytes) else data_or_file
    fmt = _PIL_FORMATS.get(ext)
    if fmt in _FAST_FORMATS:
        w, h = _header_size(src)  # (-1, -1) when it cannot tell
        if w > 0 and h > 0 and (_MAX_PIXELS is None or w * h <= _MAX_PIXELS):
            return w, h
        src.seek(0)
    try:  # trying the extension's plugin first saves the probe of every other format
        im = Image.open(src, formats=[fmt]) if fmt else Image.open(src)
    except Exception:
        if not fmt:
            raise
        src.seek(0)
        im = Image.open(src)  # the extension lied (a PNG named .jpg): let Pillow find the format
    with im:
        w, h = im.size
    if w <= 0 or h <= 0:
        raise ValueError(f"image size {w}x{h}")
    return w, h


def probe_video(fileobj) -> dict:
    """Frames, fps, size and duration from the container; count packets where the header says 0 frames."""
    import av  # PyAV bundles FFmpeg; imported lazily because text-only runs never need it

    with av.open(fileobj, mode="r") as c:
        if not c.streams.video:
            raise ValueError("no video stream")
        s = c.streams.video[0]
        fps = float(s.average_rate or s.guessed_rate or 0) or None
        frames = int(s.frames or 0)
        duration = float(s.duration * s.time_base) if s.duration and s.time_base else None
        if duration is None and c.duration:
            duration = c.duration / 1_000_000
        if frames <= 0:
            frames = sum(1 for p in c.demux(s) if p.size)
        width, height = s.codec_context.width, s.codec_context.height
    if frames <= 0 or not width or not height:
        raise ValueError(f"video stream reports {frames} frames of {width}x{height}")
    if fps is None:
        fps = frames / duration if duration else 24.0
    return {"frames": frames, "fps": fps, "width": width, "height": height, "duration": duration}


def _resolve_refs(refs: list[str], members: list[tuple[Entry, str]], kind: str) -> list[tuple[Entry, str]]:
    """Order media members by the names the record gives; positional when none of the names resolve."""
    if not refs:
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
    raise ConversationError("missing_media", f"{kind} named in the record not in the sample: {missing[:5]}")


def classify(
    shard: str, key: str, entries: list[Entry], reader: _Reader, options: ScanOptions
) -> tuple[Sample, Rejection | None]:
    """One sample: members with offsets/hashes, its conversation and media metadata, or a reason."""
    sample = Sample(sample_id=f"{shard}/{key}", shard=shard, key=key)

    def reject(reason: str, detail: str) -> tuple[Sample, Rejection]:
        sample.status, sample.reason = "rejected", reason
        return sample, Rejection(shard, key, reason, detail)

    broken = next((e for e in entries if e.kind == "break"), None)
    if broken is not None:
        return reject(broken.reason, broken.detail)

    for e in entries:
        if is_unsafe_name(e.name):
            return reject("unsafe_member_name", f"member {e.name!r}")
        if e.kind != "file":
            return reject("unsupported_member_type", f"member {e.name!r} is a {e.kind}")
        if e.size > options.max_member_bytes:
            return reject("member_too_large", f"member {e.name!r} is {e.size} bytes > {options.max_member_bytes}")

    json_entry = caption_entry = None
    images: list[tuple[Entry, str]] = []
    videos: list[tuple[Entry, str]] = []
    small: dict[str, bytes] = {}
    for e in entries:
        _, part = split_key(e.name)
        ext = _ext(part)
        if ext == "json" and json_entry is None:
            json_entry = e
        elif ext in CAPTION_EXTS and caption_entry is None:
            caption_entry = e
        elif ext in IMAGE_EXTS:
            images.append((e, part))
        elif ext in VIDEO_EXTS:
            videos.append((e, part))

    # hash every member; keep the bytes of the small ones we parse anyway
    image_names = {i.name for i, _ in images}
    for e in entries:
        text_part = e is json_entry or e is caption_entry
        wants_bytes = text_part or (options.hash_members and e.name in image_names)
        if wants_bytes and e.size <= options.max_json_bytes:
            data = reader.read(e)
            small[e.name] = data
            # text members are read anyway: always hashed, so an in-place edit shows (fingerprint, audit)
            sha = hashlib.sha256(data).hexdigest() if options.hash_members or text_part else None
        else:
            sha = reader.hash(e) if options.hash_members else None
        sample.members.append(Member(sample.sample_id, e.name, e.offset, e.size, sha))

    if json_entry is None and caption_entry is None:
        return reject("missing_json", f"members: {[e.name for e in entries][:8]}")
    try:
        record: dict = {}
        caption = None
        if json_entry is not None:
            if json_entry.name not in small:
                return reject("member_too_large", f"json member is {json_entry.size} bytes > {options.max_json_bytes}")
            try:
                text = small[json_entry.name].decode("utf-8")
            except UnicodeDecodeError as e:
                return reject("invalid_utf8", f"{json_entry.name}: {e}")
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                return reject("invalid_json", f"{json_entry.name}: {e}")
            if not isinstance(record, dict):
                return reject("json_not_object", f"{json_entry.name} holds a {type(record).__name__}")
            sample.json_member = json_entry.name
        if caption_entry is not None:
            try:
                caption = small[caption_entry.name].decode("utf-8")
            except (UnicodeDecodeError, KeyError) as e:
                return reject("invalid_utf8", f"{caption_entry.name}: {e}")
            if json_entry is None:
                sample.json_member = caption_entry.name
        messages = normalize(record, caption if ("messages" not in record and "conversations" not in record) else None)
        refs = media_refs(record)
        images = _resolve_refs(refs.images, images, "images")
        videos = _resolve_refs(refs.videos, videos, "videos")
        if len(images) + len(videos) > options.max_media_per_sample:
            return reject("too_many_media", f"{len(images)} images + {len(videos)} videos > {options.max_media_per_sample}")
        messages = place_media(messages, len(images), len(videos))
    except ConversationError as e:
        return reject(e.reason, e.detail)

    for e, part in images:
        ext = _ext(part)
        if e.size == 0:
            return reject("bad_image", f"{e.name} is zero bytes")
        try:
            data = small.get(e.name)
            if data is None:  # not hashing: the header is in the first few KB (rarely after a big EXIF block)
                try:
                    w, h = probe_image(reader.read(e, _IMAGE_PREFIX), ext)
                except Exception:
                    w, h = probe_image(io.BufferedReader(RangeFile(reader.f, e.offset, e.size)), ext)
            else:
                w, h = probe_image(data, ext)
        except Exception as ex:  # Pillow raises many types for bad headers
            return reject("bad_image", f"{e.name}: {type(ex).__name__}: {ex}")
        sample.image_sizes.append([w, h])
    video_meta = []
    for e, _ in videos:
        try:
            video_meta.append(probe_video(io.BufferedReader(RangeFile(reader.f, e.offset, e.size))))
        except Exception as ex:  # PyAV raises its own error tree for broken containers
            return reject("bad_video", f"{e.name}: {type(ex).__name__}: {ex}")

    sample.n_images, sample.n_videos = len(images), len(videos)
    sample.media_type = "video" if videos else ("image" if images else "text")
    sample.media_members = [e.name for e, _ in images] + [e.name for e, _ in videos]
    # every other member (a .cls, a second JSON, an image the record does not name) travels with the sample
    used = {sample.json_member, *sample.media_members}
    sample.extra_members = [e.name for e in entries if e.name not in used]
    sample.conversation = json.dumps(messages, ensure_ascii=False)
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
        info.status = "rejected"
        yield Rejection(shard, None, "unreadable_shard", f"{type(e).__name__}: {e}")
        return
    seen: set[str] = set()
    reader = _Reader(f, options)
    with f:
        try:
            for key, entries in group_by_key(_counting(iter_entries(f, info.size), info)):
                yield from _emit(shard, key, entries, reader, options, seen, info)
        except ShardError as e:
            info.status = "empty" if e.reason == "empty_shard" else "rejected"
            yield Rejection(shard, None, e.reason, e.detail)
        except Exception as e:  # unforeseen: the samples yielded so far stand, the run goes on without the rest
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


def _counting(entries: Iterator[Entry], info: ShardInfo) -> Iterator[Entry]:
    try:
        for e in entries:
            if e.kind == "break":
                info.status = "truncated"
            else:
                info.n_members += 1
                info.n_meta_members += is_meta_member(e.name)
            yield e
    except ShardError:
        raise
    except Exception as ex:  # e.g. an I/O error mid-archive: a break, so the sample in progress gets the row
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
        yield Rejection(shard, key, "duplicate_key", f"key {key!r} seen earlier in this shard (members {[e.name for e in entries][:4]})")
        broken = next((e for e in entries if e.kind == "break"), None)
        if broken is not None:  # the archive also breaks here: say so, not only that the key repeats
            yield Rejection(shard, None, broken.reason, broken.detail)
        return
    seen.add(key)
    try:
        sample, rejection = classify(shard, key, entries, reader, options)
    except Exception as e:  # unforeseen input: this sample gets a reason row, its neighbours go on
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
                "dagster/uri": FilePath(self.folder)}


def manifest_is_current(input_root: Path, work: Path, shard: str) -> dict | None:
    """The stored scan of a shard whose size and mtime have not changed since, else None."""
    info = store.read_shard_info(work, shard)
    try:
        st = (input_root / f"{shard}.tar").stat()
    except OSError:
        return None
    if info and (info["size"], info["mtime_ns"]) == (st.st_size, st.st_mtime_ns) \
            and info.get("manifest_format") == MANIFEST_FORMAT:  # an older version's manifest is rescanned
        return info
    return None


def run_manifest(input_root: Path, work: Path, shard: str, options: ScanOptions = ScanOptions(),
                 force: bool = False) -> ShardManifest:
    """Scan one shard into ``<work>/manifest/<shard>/``; an unchanged shard (size, mtime) is not rescanned."""
    with store.shard_lock(work, shard):  # a concurrent run of this shard finishes first; then it is current
        info = None if force else manifest_is_current(input_root, work, shard)
        cached = info is not None
        if not cached:
            path = input_root / f"{shard}.tar"
            scanned = ShardInfo(shard=shard, path=str(path), size=0, mtime_ns=0)
            store.write_manifest(work, shard, scan_shard(path, shard, options, scanned), scanned)
            info = dataclasses.asdict(scanned)
        reasons = pq.read_table(store.manifest_dir(work, shard) / "rejected.parquet", columns=["key"]).column("key")
    return ShardManifest(shard=shard, status=info["status"], samples=info["n_samples"], ok=info["n_ok"],
                         rejected=info["n_rejected"], members=info["n_members"], bytes=info["size"],
                         seconds=round(info["seconds"], 3), cached=cached,
                         reason_rows=len(reasons) - reasons.null_count)


def run_manifests(input_root: Path, work: Path, shards: list[str], options: ScanOptions = ScanOptions(),
                  log: Callable[[str], None] | None = None) -> ManifestSummary:
    out = []
    for shard in shards:
        s = run_manifest(input_root, work, shard, options)
        if log:
            log(f"{shard}: {s.ok} ok, {s.rejected} rejected of {s.samples} samples in {s.seconds} s"
                f"{' (unchanged, kept)' if s.cached else ''}")
        out.append(s)
    return ManifestSummary(out, store.manifest_dir(work, shards[0]))
