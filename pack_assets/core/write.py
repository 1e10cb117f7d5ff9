"""packed_shards stage: one output sample per pack, media copied by byte range.

Each output shard is a tar written with fixed header fields (mtime 0, uid/gid 0, mode 0644, PAX format)
and a stable member order, so the same plan gives byte-identical shards. It is written under a temporary
name, fsynced, then renamed: no partial file is ever visible under a final name. A rerun skips a shard
whose first pack already carries the plan's fingerprint.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import shutil
import threading
import time
import urllib.parse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from .. import __version__
from . import labels, owned, store
from .plan import PlanInfo, config_fingerprint
from .results import FilePath
from .safety import check_paths, file_sha256, mkstemp  # temp files that end with the umask's mode, not mkstemp's 0600
from .tario import (BLOCK, RECORD, Entry, extra_name, first_pack_meta, group_by_key, iter_entries, media_name,
                    member_header, padding, split_key)

NV_META = ".nv-meta"
# Media and extra members of this size or more are copied in kernel (copy_file_range: no user-space copy, no
# user pages); smaller ones are read with their sample's record (one pread of the span) and written with the
# pack's os.writev. Whole writer, against reading them back (docs/benchmarks.md, session 35): ~136 KB members
# 0.79 of the wall, 0.74 of the CPU; 64 KB about even; 32 KB members, one call each, 1.04 of the wall.
_SMALL = 64 << 10
# the cut for a source the kernel cannot copy from (another filesystem type: EXDEV): only these are copied by
# reads of their own, the rest go with the sample's span read
_SMALL_READ = 1 << 20


@dataclass
class SubSample:
    sample_id: str
    shard: str
    key: str
    source_path: str
    token_len: int
    messages: list | None  # None when messages_json holds them
    json_member: dict | None  # {"name", "offset", "size", "sha256"}
    media: list[dict]  # [{"name", "offset", "size", "sha256"}] in media order
    extra: list[dict] = field(default_factory=list)  # members neither the record nor media, same fields
    conversation_sha256: str | None = None  # of the manifest's normalized conversation text
    source_stamp: str | None = None  # "size:mtime_ns" of the source shard as scanned
    # the manifest's conversation text (json.dumps(messages, ensure_ascii=False), as the scan stored it): spliced
    # into the pack document as is, the same bytes as dumping ``messages`` again, without parsing it first
    messages_json: str | None = None

    def messages_text(self) -> str:
        return self.messages_json if self.messages_json is not None else _dumps(self.messages)


@dataclass
class PackJob:
    pack_id: str
    media_type: str
    total_token_len: int
    subs: list[SubSample]


@dataclass
class ShardJob:
    name: str
    packs: list[PackJob]


class _Sources:
    """A small LRU of open source shards (bounded file descriptors). ``no_kernel_copy``: those the kernel cannot
    copy from into this output shard (`_copy`): their members are read and written back."""

    def __init__(self, limit: int = 64):
        self.limit, self.files = limit, {}
        self.no_kernel_copy: set[str] = set()

    def get(self, path: str):
        f = self.files.pop(path, None)
        if f is None:
            if len(self.files) >= self.limit:
                oldest = next(iter(self.files))
                self.files.pop(oldest).close()
            f = open(path, "rb", buffering=0)
        self.files[path] = f
        return f

    def close(self):
        for f in self.files.values():
            f.close()
        self.files.clear()


def _prefetch(job: ShardJob) -> None:
    """Ask the kernel to read this shard's source ranges in (file, offset) order: one sweep per source
    instead of the random order packs visit them in. Its own descriptors: it runs beside the writer
    (`_prefetch_aside`), whose open sources come and go."""
    if not hasattr(os, "posix_fadvise"):
        return
    ranges = sorted({(sub.source_path, m["offset"], m["size"]) for p in job.packs for sub in p.subs
                     for m in ([sub.json_member] if sub.json_member else []) + sub.media + sub.extra})
    merged: list[list] = []  # members that lie together (a sample's, consecutive samples') in one call
    for path, offset, size in ranges:
        last = merged[-1] if merged else None
        if last and last[0] == path and offset <= last[2] + 8 * BLOCK:  # tar headers and padding between
            last[2] = max(last[2], offset + size)
        else:
            merged.append([path, offset, offset + size])
    fd, at = -1, None
    try:
        for path, lo, hi in merged:
            if path != at:
                if fd >= 0:
                    os.close(fd)
                fd, at = os.open(path, os.O_RDONLY), path
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
    except OSError:
        return  # only advice: the writer reports a source it cannot read
    finally:
        if fd >= 0:
            os.close(fd)


def _prefetch_aside(job: ShardJob) -> threading.Thread:
    """`_prefetch` in a thread, started, while the shard is written (its advice calls release the GIL; in
    line they held up the first pack by ~0.1 s per 3,000 samples even with every page cached)."""
    t = threading.Thread(target=_prefetch, args=(job,), name="prefetch", daemon=True)
    t.start()
    return t


class _Arena:
    """One buffer, reused pack after pack, that a pack's small members are read into (`os.preadv`) until
    its bytes are written: a fresh bytes object per 100 KB+ read costs page faults, as much again as the
    copy itself (217 MB of ~136 KB images read and written: 0.14 s with fresh buffers, 0.07 s reused). A
    read that does not fit gets a buffer of its own, and the next pack a larger arena: it grows to the
    largest pack's small members."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.buf, self.used, self.wanted = memoryview(bytearray(size)), 0, 0

    def pread(self, fd: int, n: int, offset: int) -> bytes | memoryview:
        self.wanted += n
        if self.used + n > len(self.buf):
            return os.pread(fd, n, offset)
        view = self.buf[self.used:self.used + n]
        self.used += n
        return view[:os.preadv(fd, [view], offset)]

    def reset(self) -> None:
        """The pack's bytes are written: the buffer is free again (a new one when the pack did not fit; the
        old one may still be viewed, so it is never resized)."""
        if self.wanted > len(self.buf):  # doubled at least: packs of growing size do not reallocate each time
            self.buf = memoryview(bytearray(max(self.wanted, 2 * len(self.buf))))
        self.used = self.wanted = 0


# json.dumps(x, ensure_ascii=False) without building an encoder per call (what json.dumps does for any keyword)
_dumps = json.JSONEncoder(ensure_ascii=False).encode
# a sample's small members are read with one pread of their span when the gaps between them (tar headers and
# padding, typically 1 KB per member) stay under this (and under the cut, so that no member copied apart lies
# inside the span): a 16 KB image then costs one slice, not one syscall
_SPAN_GAP = 64 << 10
_IOV_MAX = 1024  # buffers per os.writev call (Linux IOV_MAX)
_WRITEBACK_EVERY = 8 << 20  # the disk's writing is started every this many bytes written (`_start_writeback`)


# copy_file_range's errors that say the kernel cannot copy between these two files (EXDEV: filesystems of
# different types, Linux 5.12 on): the caller reads and writes that source's members instead
_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL}


def _copy(src_fd: int, offset: int, size: int, dst_fd: int, what: str, kernel: bool = True) -> bool:
    """Copy `size` bytes of the source at `offset` to dst_fd's position, in kernel where it can (`kernel`),
    else by reads; returns False when the kernel said it cannot copy between these files. `what` names the
    member in the error for a source that ends early."""
    left, pos = size, offset
    while left:
        n = 0
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, left, pos)
            except (AttributeError, OSError) as e:  # AttributeError: a platform without the call
                kernel = isinstance(e, OSError) and e.errno not in _NO_KERNEL_COPY
        if n <= 0:
            chunk = os.pread(src_fd, min(left, 1 << 22), pos)
            if not chunk:
                raise OSError(f"{what}: the source ends {left} bytes early, at offset {pos}")
            _write_all(dst_fd, [chunk])
            n = len(chunk)
        left -= n
        pos += n
    return kernel


def _start_writeback(fd: int, offset: int, size: int) -> None:
    """Have the kernel start writing these just-written bytes to disk, without waiting: below its dirty
    thresholds it would start only at the shard's fsync, which then waited for the whole shard after the CPU
    work instead of beside it (6,000 packed samples, 0.87 GB in 4 shards: the writer 0.84-0.95 s against
    1.14-1.40 s). POSIX_FADV_DONTNEED starts the writeback and drops only clean pages, and pages just
    written are dirty or under writeback: the audit still reads them from memory (measured the same)."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)


def _write_all(fd: int, bufs: list) -> None:
    """os.writev until every buffer is written (a short write resumes inside the buffer it stopped in)."""
    i = 0
    while i < len(bufs):
        batch = bufs[i:i + _IOV_MAX]
        n = os.writev(fd, batch)
        for b in batch:
            if n >= len(b):
                n -= len(b)
                i += 1
            else:
                bufs[i] = memoryview(b)[n:]
                break


def read_record(sub: SubSample, sources: _Sources) -> bytes | None:
    """The sample's record member alone (index mode: its text goes into the pack's JSON, the media stay put)."""
    m = sub.json_member
    if m is None:
        return None
    data = os.pread(sources.get(sub.source_path).fileno(), m["size"], m["offset"])
    if len(data) != m["size"]:
        raise OSError(f"{sub.source_path}: {m['name']} ends early ({len(data)} of {m['size']} bytes)")
    return data


def _read_sub(sub: SubSample, sources: _Sources, arena: _Arena) -> tuple[bytes | None, list]:
    """The record's bytes and each media/extra member's bytes (None for a media or extra member of _SMALL or
    more, or `_SMALL_READ` for a source in ``sources.no_kernel_copy``: copied when written), read into
    `arena`: valid until its next reset. The small members of a sample usually follow each other in its
    source tar, so they are sliced out of one pread of their span; members far apart are read one by one."""
    f = sources.get(sub.source_path)
    fd = f.fileno()
    members = sub.media + sub.extra
    # the record is always read (its text goes into the pack's JSON), media of the cut or more are copied later
    cut = _SMALL_READ if sub.source_path in sources.no_kernel_copy else _SMALL
    small = ([sub.json_member] if sub.json_member else []) + [m for m in members if m["size"] < cut]
    got: dict[int, bytes | memoryview] = {}
    if len(small) > 1:
        lo = min(m["offset"] for m in small)
        hi = max(m["offset"] + m["size"] for m in small)
        if hi - lo <= sum(m["size"] for m in small) + min(_SPAN_GAP, cut - 1):
            buf = arena.pread(fd, hi - lo, lo)
            if len(buf) != hi - lo:
                raise OSError(f"{sub.source_path}: sample {sub.key} ends early ({len(buf)} of {hi - lo} bytes "
                              f"at offset {lo})")
            view = memoryview(buf)
            got = {id(m): view[m["offset"] - lo:m["offset"] - lo + m["size"]] for m in small}
    for m in small:
        if id(m) not in got:
            data = arena.pread(fd, m["size"], m["offset"])
            if len(data) != m["size"]:
                raise OSError(f"{sub.source_path}: {m['name']} ends early ({len(data)} of {m['size']} bytes)")
            got[id(m)] = data
    return (got[id(sub.json_member)] if sub.json_member else None), [got.get(id(m)) for m in members]


def pack_document(job: PackJob, context: dict, records: list) -> tuple[bytes, list[tuple[str, SubSample, dict]]]:
    """The pack's JSON (conversations + ``_meta``) as bytes and its media members in output order.
    ``records``: each sub-sample's record member bytes (None without one). The text is the bytes
    ``json.dumps(doc, ensure_ascii=False)`` gives for the document dict (samples, then ``PackMeta.as_dict()``),
    built piece by piece: each conversation, already JSON in the manifest, is spliced in instead of parsed and
    dumped again, and ``_meta``'s sources are written without building their dicts (a test checks the bytes
    against json.dumps)."""
    samples, sources, media_out = [], [], []
    pack_id = job.pack_id
    for i, (sub, raw) in enumerate(zip(job.subs, records)):
        names, src_media = [], []
        for j, m in enumerate(sub.media):
            out_name = media_name(pack_id, i, j, m["name"])
            names.append(out_name.split(".", 1)[1])
            media_out.append((out_name, sub, m))
            src_media.append(_output_member(m, out_name))
        extra_names, src_extra = [], []
        for j, m in enumerate(sub.extra):  # copied like media; they add no tokens (not in the conversation)
            out_name = extra_name(pack_id, i, j, m["name"])
            extra_names.append(out_name.split(".", 1)[1])
            media_out.append((out_name, sub, m))
            src_extra.append(_output_member(m, out_name))
        source = "null"
        if sub.json_member is not None:
            text = str(raw, "utf-8")
            source = _dumps(json.loads(text)) if sub.json_member["name"].endswith(".json") else _encode_str(text)
        sid = _encode_str(sub.sample_id) if type(sub.sample_id) is str else _dumps(sub.sample_id)
        # key order as the dict {"sample_id", "token_len", "messages", "media", "source"[, "extra"]} dumps
        samples.append(f'{{"sample_id": {sid}, "token_len": {_dumps(sub.token_len)}, '
                       f'"messages": {sub.messages_text()}, "media": {_dumps(names)}, "source": {source}'
                       + (f', "extra": {_dumps(extra_names)}}}' if sub.extra else "}"))  # only when present
        # SourceRef.as_dict, key for key
        sources.append(f'{{"sample_id": {sid}, "shard": {_dumps(sub.shard)}, "key": {_dumps(sub.key)}, '
                       f'"json_member": {_member_json(sub.json_member)}, "media": [{", ".join(src_media)}]'
                       + (f', "extra": [{", ".join(src_extra)}]}}' if sub.extra else "}"))
    # PackMeta.as_dict, key for key, the context's items after the fixed ones
    meta = (f'{{"pack_id": {_dumps(pack_id)}, "media_type": {_dumps(job.media_type)}, '
            f'"sample_ids": {_dumps([s.sample_id for s in job.subs])}, '
            f'"sample_token_lens": {_dumps([s.token_len for s in job.subs])}, '
            f'"total_token_len": {_dumps(job.total_token_len)}, "sources": [{", ".join(sources)}]')
    if _META_FIXED & context.keys():  # a context key would replace a fixed one in place, as the dict merge does
        meta = _dumps({**json.loads(meta + "}"), **context})
    else:
        rest = _dumps(context)[1:-1]
        meta += f", {rest}}}" if rest else "}"
    body = (f'{{"pack_id": {_dumps(pack_id)}, "media_type": {_dumps(job.media_type)}, '
            f'"samples": [{", ".join(samples)}], "_meta": {meta}}}')
    return body.encode("utf-8"), media_out


_MEMBER_KEYS = ("name", "offset", "size", "sha256")
_META_FIXED = {"pack_id", "media_type", "sample_ids", "sample_token_lens", "total_token_len", "sources"}


def _member_json(m: dict | None) -> str:
    """json.dumps(m, ensure_ascii=False) of a source member, built directly for the usual
    {"name", "offset", "size", "sha256"} (this runs per member)."""
    if m is not None and tuple(m) == _MEMBER_KEYS and type(m["name"]) is str and type(m["offset"]) is int \
            and type(m["size"]) is int and (m["sha256"] is None or type(m["sha256"]) is str):
        sha = m["sha256"]
        return (f'{{"name": {_encode_str(m["name"])}, "offset": {m["offset"]}, "size": {m["size"]}, '
                f'"sha256": {"null" if sha is None else _encode_str(sha)}}}')
    return _dumps(m)


def _output_member(m: dict, out_name: str) -> str:
    """json.dumps({**m, "output_name": out_name}, ensure_ascii=False): the member as ``_meta`` lists it."""
    if m and "output_name" not in m:
        return f'{_member_json(m)[:-1]}, "output_name": {_encode_str(out_name)}}}'
    return _dumps({**m, "output_name": out_name})


_encode_str = json.encoder.encode_basestring  # a str as JSON, ensure_ascii=False (json's C encoder)


def member_key(m: dict | None) -> str:
    """A source member as the fingerprint sees it: name (the output name's extension), place and content
    (sha256; None when not hashed, then the place stands in for it)."""
    if m is None:
        return "-"
    # == json.dumps([name, offset, size, sha256], ensure_ascii=False), built directly: this runs per member
    sha = m["sha256"]
    if type(m["offset"]) is int and type(m["size"]) is int and (sha is None or type(sha) is str):
        return (f'[{_encode_str(m["name"])}, {m["offset"]}, {m["size"]}, '
                f'{"null" if sha is None else _encode_str(sha)}]')
    return _dumps([m["name"], m["offset"], m["size"], sha])


class ShardFingerprint:
    """What decides a shard's bytes: its packs in order; per sample its id, token count, normalized
    conversation, record member, media and extra members (name, offset, size, sha256: the bytes copied, the
    output names and ``_meta``); the profile, max length and tool version. Fed pack by pack, so the writer
    (from a ShardJob) and the skip check (from one catalog query over all shards) compute the same value.
    A member scanned without a hash is known by its place only, so then the source shard's size and mtime
    stand in for its content. The whole context that ``_meta`` carries (profile, settings, tool version) is
    covered; the plan's data fingerprint is not in it, so an incremental plan keeps the untouched output
    shards of the one before."""

    def __init__(self, context: dict) -> None:
        covered = {k: v for k, v in context.items() if k != "shard_fingerprint"}
        self._h = hashlib.sha256(json.dumps(covered, sort_keys=True).encode())

    def pack(self, pack_id: str, media_type: str, total_token_len: int) -> None:
        self._h.update(f"{pack_id}|{media_type}|{total_token_len}\n".encode())

    def sub(self, sample_id: str, token_len: int, conversation_sha256: str | None, json_member: dict | None,
            media: list[dict], extra: list[dict], source_stamp: str | None = None) -> None:
        keys = [member_key(json_member), *map(member_key, media), "+", *map(member_key, extra)]
        unhashed = any(m is not None and m["sha256"] is None for m in [json_member, *media, *extra])
        stamp = source_stamp if unhashed else ""
        self._h.update(f"{sample_id}|{token_len}|{conversation_sha256}|{stamp}|{'|'.join(keys)}\n".encode())

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:16]


def shard_fingerprint(job: ShardJob, context: dict, fp: ShardFingerprint | None = None) -> str:
    """``fp``: the fingerprint to feed (index mode's covers its roots too); by default copy mode's."""
    fp = ShardFingerprint(context) if fp is None else fp
    for p in job.packs:
        fp.pack(p.pack_id, p.media_type, p.total_token_len)
        for sub in p.subs:
            conv = sub.conversation_sha256 or hashlib.sha256(sub.messages_text().encode()).hexdigest()
            fp.sub(sub.sample_id, sub.token_len, conv, sub.json_member, sub.media, sub.extra, sub.source_stamp)
    return fp.hexdigest()


def write_shard(out_dir: str, job: ShardJob | str, context: dict, loader=None) -> dict:
    """Write one output shard atomically; skip it when a shard with the same content is already there
    (a rerun after a crash, or the untouched shards of an incremental plan). ``job`` may be a shard name
    that ``loader`` turns into its ShardJob (inside the writer process)."""
    t0 = time.perf_counter()
    if isinstance(job, str):
        job = loader(job)
    final = Path(out_dir) / job.name
    context = {**context, "shard_fingerprint": shard_fingerprint(job, context)}
    if final.exists():
        meta = first_pack_meta(final)
        if meta and meta.get("shard_fingerprint") == context["shard_fingerprint"]:
            return {"shard": job.name, "skipped": True, "bytes": final.stat().st_size, "packs": len(job.packs),
                    "samples": sum(len(p.subs) for p in job.packs), "seconds": time.perf_counter() - t0,
                    "fingerprint": context["shard_fingerprint"]}
    sources, arena = _Sources(), _Arena()
    prefetch = _prefetch_aside(job)
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    # the Energon index of the finished file, kept as it is written instead of read back: per pack (one
    # WebDataset sample when its id is a plain key) its place and its members' data; other ids go through
    # the reader's own grouping of the entries a reader would see
    plain = all(_plain_key(p.pack_id) for p in job.packs)
    samples: list[tuple[str, int, int]] = []
    parts: list[tuple[int, str, int, int]] = []
    entries: list[Entry] = []
    pos = 0  # bytes written so far
    flushed = 0  # bytes whose writeback was started
    try:
        pending: list = []  # buffers not yet written: one os.writev per pack instead of three writes per member
        for pack in job.packs:
            start, cut, k = pos, len(pack.pack_id) + 1, len(samples)
            records, data = [], []
            for sub in pack.subs:
                rec, views = _read_sub(sub, sources, arena)
                records.append(rec)
                data += views
            body, media = pack_document(pack, context, records)
            name = f"{pack.pack_id}.json"
            header = member_header(name, len(body))
            if plain:
                parts.append((k, "json", pos + len(header), len(body)))
            else:
                entries.append(Entry(name, pos + len(header), len(body), "file", header=pos))
            pending += [header, body, padding(len(body))]
            pos += len(header) + len(body) + (-len(body) % BLOCK)
            for (out_name, sub, m), view in zip(media, data):
                header = member_header(out_name, m["size"])
                if plain:
                    parts.append((k, out_name[cut:], pos + len(header), m["size"]))
                else:
                    entries.append(Entry(out_name, pos + len(header), m["size"], "file", header=pos))
                if view is None:  # large: copied in kernel after what is pending
                    pending.append(header)
                    _write_all(fd, pending)
                    pending = []
                    src = sub.source_path
                    if not _copy(sources.get(src).fileno(), m["offset"], m["size"], fd, f"{src}: {m['name']}",
                                 src not in sources.no_kernel_copy):
                        sources.no_kernel_copy.add(src)
                    pending.append(padding(m["size"]))
                else:
                    pending += [header, view, padding(m["size"])]
                pos += len(header) + m["size"] + (-m["size"] % BLOCK)
            _write_all(fd, pending)
            pending = []
            arena.reset()
            samples.append((pack.pack_id, start, pos - start))
            if pos - flushed >= _WRITEBACK_EVERY:
                _start_writeback(fd, flushed, pos - flushed)
                flushed = pos
        end = pos
        tail = 2 * BLOCK
        tail += -(end + tail) % RECORD
        _write_all(fd, [bytes(tail)])
        os.fsync(fd)
        written = end + tail
        os.close(fd)
        fd = -1
        os.replace(tmp, final)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        sources.close()
        prefetch.join()
    return {"shard": job.name, "skipped": False, "bytes": written, "packs": len(job.packs),
            "samples": sum(len(p.subs) for p in job.packs), "seconds": time.perf_counter() - t0,
            "fingerprint": context["shard_fingerprint"], "index": (samples, parts, end) if plain else _index(entries, end)}


def _plain_key(pack_id: str) -> bool:
    """Whether every member `{pack_id}.{part}` has the key pack_id by the WebDataset rule (no dot, no
    folder) and is no __meta__ member."""
    return bool(pack_id) and "." not in pack_id and "/" not in pack_id and not (
        pack_id.startswith("__") and pack_id.endswith("__"))


def _write_shard_star(args):
    return write_shard(*args)


def write_all(out_dir: Path, jobs: list[ShardJob] | list[str], context: dict, workers: int = 0, progress=None,
              loader=None, done: list[dict] | None = None, plan_fingerprint: str = "",
              last: LastIndex | None = None) -> list[dict]:
    """Write every shard (a process pool when there are several), remove stale ones, write Energon metadata
    (its index uuid named after ``plan_fingerprint``). ``done``: results of shards the caller already found
    current; they are kept, not rewritten. ``last``: the index the last write left, whose rows of those
    still hold."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sorted({r["shard"] for r in done or []} | {j if isinstance(j, str) else j.name for j in jobs})
    planned = owned.planned_files(names)
    before = owned.claim(out_dir, planned)  # refuses before the first write when a planned name is not ours
    owned.remove_temp_leftovers(out_dir, planned | set(before))
    workers = workers or min(os.cpu_count() or 1, max(1, len(jobs)))
    args = [(str(out_dir), j, context, loader) for j in jobs]
    results: list[dict] = list(done or [])
    total = len(results) + len(jobs)
    for i, r in enumerate(results, 1):
        if progress:
            progress(r, i, total)
    if workers <= 1 or len(jobs) <= 1:
        for a in args:
            results.append(write_shard(*a))
            if progress:
                progress(results[-1], len(results), total)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for r in pool.map(_write_shard_star, args):
                results.append(r)
                if progress:
                    progress(r, len(results), total)
    keep = {r["shard"] for r in results}
    indexes = {r["shard"]: r.pop("index") for r in results if "index" in r}
    counts = write_energon_meta(out_dir, sorted(keep), plan_fingerprint or context["config_fingerprint"], indexes, last)
    write_wids_index(out_dir, counts)
    owned.finish(out_dir, planned, before)  # only recorded files of an earlier plan are deleted
    for r in results:
        if counts[r["shard"]] != r["packs"]:
            raise RuntimeError(f"{r['shard']}: {counts[r['shard']]} samples on disk, {r['packs']} packs planned")
    return results


ENERGON_FORMAT = "7.4.1"  # the megatron-energon release whose `energon prepare` output this matches (tested)


Index = tuple[list[tuple[str, int, int]], list[tuple[int, str, int, int]], int]


def _sample_index(path: Path) -> Index:
    """The index of a shard on disk (one the writer did not just write), read back from its tar headers."""
    trailer: list[int] = []
    with open(path, "rb") as f:
        entries = list(iter_entries(f, path.stat().st_size, trailer))
    return _index(entries, trailer[0] if trailer else path.stat().st_size)


def _index(entries: list[Entry], end: int) -> Index:
    """(key, header offset, size) per sample, (sample index, part, data offset, size) per member, end offset."""
    samples, parts = [], []
    groups = list(group_by_key(entries))
    for i, (key, entries) in enumerate(groups):
        start = entries[0].header
        stop = groups[i + 1][1][0].header if i + 1 < len(groups) else end
        samples.append((key, start, stop - start))
        parts += [(i, split_key(e.name)[1], e.offset, e.size) for e in entries]
    return samples, parts, end


@dataclass(frozen=True)
class LastIndex:
    """What the writer's record says of the Energon index the last write left: its sha256, its tars in tar
    id order (``listed``); ``kept``: those unchanged since (size, mtime), whose rows stand."""
    sha256: str
    listed: list[str]
    kept: frozenset[str]

    @staticmethod
    def rows(db, tar_id: int, parts: bool = True) -> Index:
        samples = db.execute("SELECT sample_key, byte_offset, byte_size FROM samples WHERE tar_file_id = ? "
                             "ORDER BY sample_index", [tar_id]).fetchall()
        found = db.execute("SELECT sample_index, part_name, content_byte_offset, content_byte_size FROM sample_parts "
                           "WHERE tar_file_id = ? ORDER BY rowid", [tar_id]).fetchall() if parts else []
        return samples, found, (samples[-1][1] + samples[-1][2]) if samples else 0


_INDEX_TABLES = ("CREATE TABLE IF NOT EXISTS samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
                 "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)",
                 "CREATE TABLE IF NOT EXISTS sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
                 "content_byte_offset INTEGER, content_byte_size INTEGER)")
_INDEX_INDEXES = ("CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
                  "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, "
                  "content_byte_offset)",
                  "CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
                  "content_byte_offset, content_byte_size)")


def write_energon_meta(out_dir: Path, shard_names: list[str], fingerprint: str,
                       indexes: dict[str, Index] | None = None, last: LastIndex | None = None) -> dict[str, int]:
    """`.nv-meta/` as `energon prepare` writes it (dataset.yaml, split.yaml, .info.json, index.sqlite,
    index.uuid) plus each shard's `.tar.idx`, so Megatron-Energon loads the output as it is. ``indexes``: the
    shards this run wrote, indexed as they were written; ``last``: the index the last write left, whose rows
    of its unchanged shards are kept (when those are its every tar and come first, as after an incremental
    plan, the new index starts as that file: the 1M-sample index took ~2 s to rebuild); the others are read
    back from their tar headers."""
    import sqlite3
    import struct
    import uuid

    from .store import atomic_write_text

    meta = out_dir / NV_META
    meta.mkdir(parents=True, exist_ok=True)
    names = sorted(shard_names)
    counts: dict[str, int] = {}
    indexes = indexes or {}
    fd, tmp_db = mkstemp(prefix=".index.sqlite.tmp-", dir=meta)
    os.close(fd)
    old = copied = db = None
    try:
        if last is not None:  # hashed as copied: the rows kept are the rows the record vouches for
            try:
                shutil.copyfile(meta / "index.sqlite", tmp_db)
                vouched = file_sha256(tmp_db) == last.sha256
            except OSError:
                vouched = False
            if not vouched:
                last = None
                Path(tmp_db).write_bytes(b"")
        base = last is not None and names[:len(last.listed)] == last.listed and last.kept >= set(last.listed)
        if last is not None and not base:  # the copy is read from; the new index starts empty
            copied = tmp_db
            fd, tmp_db = mkstemp(prefix=".index.sqlite.tmp-", dir=meta)
            os.close(fd)
            old = sqlite3.connect(f"file:{urllib.parse.quote(copied)}?mode=ro", uri=True)
        db = sqlite3.connect(tmp_db)
        for sql in _INDEX_TABLES:
            db.execute(sql)
        for tar_id, name in enumerate(names):
            if base and tar_id < len(last.listed):
                samples, _, end = LastIndex.rows(db, tar_id, parts=False)
            else:
                if name in indexes:
                    samples, parts, end = indexes[name]
                elif old is not None and name in last.kept:  # kept: in the record, so in its listing
                    samples, parts, end = LastIndex.rows(old, last.listed.index(name))
                else:
                    samples, parts, end = _sample_index(out_dir / name)
                db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                               [(tar_id, k, i, off, size) for i, (k, off, size) in enumerate(samples)])
                db.executemany("INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)", [(tar_id, *p) for p in parts])
            counts[name] = len(samples)
            idx = out_dir / f"{name}.idx"
            data = struct.pack(f"<{len(samples) + 1}Q", *[off for _, off, _ in samples], end)
            fd, tmp = mkstemp(prefix=f".{idx.name}.tmp-", dir=out_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, idx)
        for sql in _INDEX_INDEXES:
            db.execute(sql)
        db.commit()
    except BaseException:
        Path(tmp_db).unlink(missing_ok=True)
        raise
    finally:
        for con in (db, old):
            if con is not None:
                con.close()
        if copied is not None:
            Path(copied).unlink(missing_ok=True)
    os.replace(tmp_db, meta / "index.sqlite")
    atomic_write_text(meta / "index.uuid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"pack_assets:{fingerprint}")))
    atomic_write_text(meta / "dataset.yaml", "__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    split = "split_parts:\n  train:\n" + "".join(f"  - {n}\n" for n in names) + "  val: []\n  test: []\nexclude: []\n"
    atomic_write_text(meta / "split.yaml", split)
    info = {"energon_version": ENERGON_FORMAT, "shard_counts": {n: counts[n] for n in names}}
    atomic_write_text(meta / ".info.json", json.dumps(info, indent=2))
    return counts


def write_wids_index(out_dir: Path, counts: dict[str, int]) -> None:
    """`wids-index.json`: the shard list with sample counts that webdataset's `wids` reads for random access."""
    from .store import atomic_write_text

    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": out_dir.name,
             "shardlist": [{"url": n, "nsamples": counts[n]} for n in sorted(counts)]}
    atomic_write_text(out_dir / "wids-index.json", json.dumps(index, indent=2))


# -- the stage: every planned output shard, written or found current ----------------------------------------


@dataclass(frozen=True)
class WriteSummary:
    output_dir: Path
    shards: int
    written: int  # rewritten this run; the rest already held exactly their planned content
    skipped: int
    bytes: int
    packs: int
    seconds: float
    fingerprint: str
    foreign_files: list[str]  # files in the output folder this tool did not write: left alone
    example_meta: dict  # the first output shard's first `_meta`, for the UI
    output_mode: str = "copy"  # "index": the shards hold byte ranges into the sources, not media (bytes is the index)

    @property
    def mb_per_second(self) -> float | None:
        return round(self.bytes / self.seconds / 1e6, 1) if self.seconds else None

    def as_metadata(self) -> dict:
        return {"dagster/row_count": self.packs, "output_shards": self.shards, "written": self.written,
                "skipped": self.skipped, "bytes": self.bytes, "mb_per_second": self.mb_per_second,
                "dagster/uri": FilePath(self.output_dir), "foreign_files_left_alone": self.foreign_files,
                "example_meta": self.example_meta, "output_mode": self.output_mode}


class SourceChanged(RuntimeError):
    pass


def write_context(info: PlanInfo) -> dict:
    """What every output shard's `_meta` carries besides its packs."""
    return {"profile": info.profile, "profile_fingerprint": info.profile_fingerprint,
            "chat_template_kwargs": json.loads(info.chat_template_kwargs or "{}"),
            "label_policy": labels.meta_value(info.config.label_policy),
            "config_fingerprint": config_fingerprint(info.config, info.profile_fingerprint),
            "max_len": info.config.max_len, "tool": "pack_assets", "tool_version": __version__}


# what the writer reads per output shard, gathered for every shard to write at once (store.staged)
WRITE_ROWS = {
    "subs": """SELECT p.output_shard, pm.pack_id, pm.position, s.sample_id, s.shard, s.key, s.json_member,
                      s.media_members, t.total_tokens, s.extra_members, sh.size || ':' || sh.mtime_ns AS stamp
               FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
               JOIN token_lengths t USING (sample_id) LEFT JOIN shards sh ON sh.shard = s.shard WHERE {shards}""",
    "members": """SELECT p.output_shard, m.sample_id, m.name, m."offset", m.size, m.sha256
                  FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN members m USING (sample_id) WHERE {shards}""",
}
# the conversations, most of the bytes, are read per shard (gathered too, they added ~0.8 GB at 1M)
WRITE_CONVERSATIONS = {
    "conversations": """SELECT p.output_shard, s.sample_id, s.conversation, sha256(s.conversation)
                        FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id)
                        WHERE {shards}""",
}


def shard_job(con, input_root: Path, name: str, rows: store.Staged | None = None) -> ShardJob:
    """Everything the writer needs for one output shard, from the plan and the manifest (one shard at a time, so
    memory follows the output shard size, not the dataset); ``rows``: WRITE_ROWS gathered for every shard."""
    members = {(r[0], r[1]): {"name": r[1], "offset": r[2], "size": r[3], "sha256": r[4]}
               for r in store.shard_rows(con, WRITE_ROWS, "members", name, rows)}
    conversations = {r[0]: r[1:] for r in store.shard_rows(con, WRITE_CONVERSATIONS, "conversations", name)}
    subs: dict[str, list[SubSample]] = {}
    paths: dict[str, str] = {}  # per source shard, not per sample
    for (pack_id, _, sid, shard, key, json_member, media_members, tokens, extra_members,
         stamp) in store.shard_rows(con, WRITE_ROWS, "subs", name, rows, order_by="pack_id, position"):
        if (path := paths.get(shard)) is None:
            path = paths[shard] = str(store.source_tar(input_root, shard))
        conv, conv_sha = conversations[sid]
        subs.setdefault(pack_id, []).append(SubSample(
            sample_id=sid, shard=shard, key=key, source_path=path, token_len=tokens,
            messages=None, messages_json=conv, json_member=members.get((sid, json_member)) if json_member else None,
            media=[members[(sid, n)] for n in media_members or []],
            extra=[members[(sid, n)] for n in extra_members or []], conversation_sha256=conv_sha, source_stamp=stamp,
        ))
    packs = con.execute("SELECT pack_id, media_type, total_token_len FROM pack_plan WHERE output_shard = ? ORDER BY pack_id",
                        [name]).fetchall()
    return ShardJob(name, [PackJob(pack_id, mt, total, subs[pack_id]) for pack_id, mt, total in packs])


def load_shard_job(work: str, input_root, rows: store.Staged | None, name: str) -> ShardJob:
    """Picklable loader: each writer process opens the catalog read-only and gathers its own shard.
    ``input_root``: a folder (str) or a recipe's roots (dataset name -> folder)."""
    with store.connect(Path(work), read_only=True) as con:
        return shard_job(con, input_root if isinstance(input_root, dict) else Path(input_root), name, rows)


# members as the structs shard_job builds, so both sides feed ShardFingerprint the same values
_MEMBER = """{'name': m.name, 'offset': m."offset", 'size': m.size, 'sha256': m.sha256}"""


def _listed(col: str) -> str:
    return f"""SELECT x.sample_id, list({_MEMBER} ORDER BY x.i) AS {col}
                FROM (SELECT sample_id, unnest({col}_members) AS name, generate_subscripts({col}_members, 1) AS i
                      FROM packed) x JOIN members m USING (sample_id, name)
                GROUP BY x.sample_id"""


# /*only*/: every output shard, or (with a list parameter) some of them
_FINGERPRINT_ROWS = f"""WITH packed AS (SELECT DISTINCT pm.sample_id, s.media_members, s.extra_members
                            FROM pack_members pm JOIN samples s USING (sample_id) /*only_packed*/),
                media AS ({_listed("media")}),
                extra AS ({_listed("extra")})
           SELECT p.output_shard, p.pack_id, p.media_type, p.total_token_len, pm.sample_id, t.total_tokens,
                  s.conv_sha, CASE WHEN m.name IS NOT NULL THEN {_MEMBER} END, md.media, ex.extra,
                  sh.size || ':' || sh.mtime_ns
           FROM pack_plan p JOIN pack_members pm USING (pack_id)
           -- hashed before the joins: carried through them, the conversations were most of the memory (~2.6 KB a sample)
           JOIN (SELECT sample_id, shard, json_member, sha256(conversation) AS conv_sha FROM samples) s USING (sample_id)
           JOIN token_lengths t USING (sample_id) LEFT JOIN media md USING (sample_id)
           LEFT JOIN extra ex USING (sample_id) LEFT JOIN members m ON m.sample_id = s.sample_id AND m.name = s.json_member
           LEFT JOIN shards sh ON sh.shard = s.shard /*only*/
           ORDER BY p.output_shard, p.pack_id, pm.position"""
_ONLY = "output_shard IN (SELECT unnest(?::VARCHAR[]))"


def current_shards(con, out_dir: Path, context: dict, fingerprint=ShardFingerprint,
                   only: set[str] | None = None) -> list[dict]:
    """The output shards already on disk with exactly the planned content (their first pack's
    ``shard_fingerprint``), found with one query over all shards (or the shards ``only``) instead of
    loading each shard's job. ``fingerprint``: the class (or factory) that computes it (index mode's covers
    more)."""
    on_disk = {p.name for p in out_dir.glob("*.tar")} if out_dir.is_dir() else set()
    if only is not None:
        on_disk &= only
    if not on_disk:
        return []
    found: list[dict] = []
    shard = pack = fp = None
    stats = {"packs": 0, "samples": 0}

    def close() -> None:
        if shard in on_disk and (first_pack_meta(out_dir / shard) or {}).get("shard_fingerprint") == fp.hexdigest():
            found.append({"shard": shard, "skipped": True, "bytes": (out_dir / shard).stat().st_size, **stats,
                          "seconds": 0.0, "fingerprint": fp.hexdigest()})

    if only is None:
        cur = con.execute(_FINGERPRINT_ROWS)
    else:
        shards = sorted(on_disk)
        cur = con.execute(_FINGERPRINT_ROWS.replace(
            "/*only_packed*/", f"WHERE pm.pack_id IN (SELECT pack_id FROM pack_plan WHERE {_ONLY})").replace(
            "/*only*/", f"WHERE p.{_ONLY}"), [shards, shards])
    while rows := cur.fetchmany(65536):
        for name, pack_id, media_type, total, sample_id, tokens, conv_sha, json_member, media, extra, stamp in rows:
            if name != shard:
                if shard is not None:
                    close()
                shard, pack, fp, stats = name, None, fingerprint(context), {"packs": 0, "samples": 0}
            if pack_id != pack:
                pack = pack_id
                fp.pack(pack_id, media_type, total)
                stats["packs"] += 1
            fp.sub(sample_id, tokens, conv_sha, json_member, media or [], extra or [], stamp)
            stats["samples"] += 1
    if shard is not None:
        close()
    return found


WRITTEN = "written_shards.json"


def written_key(con, info: PlanInfo, context: dict) -> str:
    """What the writer's record is valid for: this plan, this context, every source shard as scanned and
    every catalog file as written (an edited source, a forced rescan or a recount can keep the plan's
    fingerprint, ids and lengths, yet change the bytes to copy or the conversations)."""
    sources = con.execute("SELECT shard, size, mtime_ns, status FROM shards ORDER BY 1").fetchall()
    files = []
    for f in store.catalog_files(con):
        try:
            st = os.stat(f)
            files.append([f, st.st_size, st.st_mtime_ns])
        except OSError:
            files.append([f, None, None])
    return hashlib.sha256(json.dumps([info.fingerprint, context, sources, files], sort_keys=True, default=str)
                          .encode()).hexdigest()


# A planned output shard's content as DuckDB hashes it: per sample a line with every value ShardFingerprint
# takes (pack, position, tokens, conversation, record/media/extra member names in order, every member's
# place and sha256, the source's size and mtime where a member is unhashed), the context left out (the record
# keeps it apart); the lines' 128-bit md5 XORed per shard. Not equal to the fingerprint, but equal exactly when
# its inputs are (each line holds its pack id and position, so no two lines of a shard are alike): so a
# recorded digest that differs refutes a shard as surely as its fingerprint would. Aggregates that stream: at
# 1M samples 3.4 s and 0.55 GB, where an ordered string_agg ran out of DuckDB's 1 GB and the fingerprint
# query hands every sample to Python (~35 s). Conversations are hashed before the joins, as in
# _FINGERPRINT_ROWS. DIGEST_FORMAT: bumped when the lines change (a record of another format vouches for
# nothing and refutes nothing).
DIGEST_FORMAT = 2
_DIGEST_ROWS = """
WITH mem AS (SELECT sample_id, bit_xor(md5_number_lower(m)) AS lo, bit_xor(md5_number_upper(m)) AS hi,
                    bool_or(unhashed) AS unhashed
             FROM (SELECT sample_id, concat_ws(',', to_json(name), "offset", size, coalesce(sha256, '-')) AS m,
                          sha256 IS NULL AS unhashed
                   FROM members WHERE sample_id IN (SELECT sample_id FROM pack_members /*only_members*/))
             GROUP BY sample_id),
lines AS (SELECT p.output_shard, p.pack_id,
                 concat_ws('|', to_json(p.pack_id), p.media_type, p.total_token_len, pm.position, to_json(pm.sample_id),
                           t.total_tokens, s.conv, to_json(s.json_member), to_json(s.media_members),
                           to_json(s.extra_members), coalesce(mem.lo || ':' || mem.hi, ''),
                           CASE WHEN mem.unhashed THEN coalesce(sh.size || ':' || sh.mtime_ns, '') END) AS line
          FROM pack_plan p JOIN pack_members pm USING (pack_id)
          JOIN (SELECT sample_id, shard, json_member, media_members, extra_members, md5(conversation) AS conv
                FROM samples) s USING (sample_id)
          JOIN token_lengths t USING (sample_id) LEFT JOIN mem USING (sample_id)
          LEFT JOIN shards sh ON sh.shard = s.shard /*only*/)
SELECT output_shard, bit_xor(md5_number_lower(line)) || ':' || bit_xor(md5_number_upper(line)),
       count(DISTINCT pack_id), count(*)
FROM lines GROUP BY 1"""
# What a shard's digest is computed from, found cheaply (0.35 s against 3.1 s at 1M samples): its plan lines
# (pack, position, sample) hashed, and the source shards its samples come from. With the stat stamps of those
# sources' catalog files (size, mtime, inode, ctime), they key the digest: where the key is the one recorded,
# so is the digest.
_DIGEST_INPUTS = """
WITH plan AS (SELECT p.output_shard, bit_xor(md5_number(concat_ws('|', to_json(p.pack_id), p.media_type,
                     p.total_token_len, pm.position, to_json(pm.sample_id))))::VARCHAR AS h,
                     count(DISTINCT p.pack_id) AS packs, count(*) AS samples
              FROM pack_plan p JOIN pack_members pm USING (pack_id) GROUP BY 1),
src AS (SELECT p.output_shard, list(DISTINCT s.shard ORDER BY s.shard) AS shards
        FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN manifest_samples s USING (sample_id) GROUP BY 1)
SELECT output_shard, h, packs, samples, shards FROM plan JOIN src USING (output_shard)"""
_CATALOG_FILES = (("manifest_dir", ("samples.parquet", "members.parquet", "shard.parquet")),
                  ("token_dir", ("token_lengths.parquet",)))


def _stamp(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]  # a copy with its mtime kept still differs


def digest_keys(con) -> dict[str, tuple[str, int, int]]:
    """Per planned output shard: (the key of its digest's inputs, packs, samples); {} for a catalog built
    before it listed its shards' folders."""
    try:
        folders = {r[0]: r[1:] for r in con.execute("SELECT shard, manifest_dir, token_dir FROM catalog_shards").fetchall()}
    except duckdb.CatalogException:
        return {}
    stamps: dict[str, list] = {}
    keys = {}
    for name, plan_hash, packs, samples, sources in con.execute(_DIGEST_INPUTS).fetchall():
        for src in sources:
            if src not in stamps:
                dirs = folders.get(src)
                stamps[src] = dirs and [_stamp(f"{d}/{f}") for d, (_, files) in zip(dirs, _CATALOG_FILES) for f in files]
        key = json.dumps([DIGEST_FORMAT, plan_hash, [[src, stamps[src]] for src in sources]])
        keys[name] = (hashlib.sha256(key.encode()).hexdigest(), packs, samples)
    return keys


def shard_digests(con, record: dict | None = None) -> tuple[dict[str, tuple[str, int, int]], dict[str, str]]:
    """Per planned output shard: (content digest, packs, samples); and the keys of the digests' inputs. A
    digest the writer's ``record`` holds under the same key is taken from it; the others are computed."""
    keys = digest_keys(con)
    kept = {}
    if record is not None and record.get("digest_format") == DIGEST_FORMAT:
        recorded, old_keys = record.get("digests") or {}, record.get("digest_keys") or {}
        kept = {n: (recorded[n], packs, samples) for n, (key, packs, samples) in keys.items()
                if n in recorded and old_keys.get(n) == key}
    if not kept:
        digests = {r[0]: (r[1], r[2], r[3]) for r in con.execute(_DIGEST_ROWS).fetchall()}
    else:
        rest = sorted(set(keys) - set(kept))
        only = f"p.{_ONLY}"
        digests = {r[0]: (r[1], r[2], r[3]) for r in con.execute(
            _DIGEST_ROWS.replace("/*only_members*/", f"pm JOIN pack_plan p USING (pack_id) WHERE {only}")
            .replace("/*only*/", f"WHERE {only}"), [rest, rest]).fetchall()} if rest else {}
        digests.update(kept)
    return digests, {n: k[0] for n, k in keys.items()}


def _context_digest(context: dict) -> str:
    return hashlib.sha256(json.dumps(context, sort_keys=True, default=str).encode()).hexdigest()


def vouched_shards(work: Path, out_dir: Path, context: dict,
                   digests: dict[str, tuple[str, int, int]]) -> tuple[list[dict], set[str]]:
    """What the writer's record says of the planned output shards on disk that it wrote and that were not
    touched since (size, mtime): written under this context with this content digest, a shard is current
    (vouched: its recorded fingerprint stands); with another digest or context it holds other content
    (refuted: rewritten without the fingerprint query, which hands every sample to Python). An incremental
    plan keeps its old packs, so its old shards are vouched for; a full replan's are refuted."""
    record = _record(work)
    if record is None or record.get("digest_format") != DIGEST_FORMAT:
        return [], set()
    same_context = record.get("context") == _context_digest(context)
    recorded = record.get("digests") or {}
    vouched, refuted = [], set()
    for name, (digest, packs, samples) in sorted(digests.items()):
        stamp = record["shards"].get(name)
        if name not in recorded or not _as_left(out_dir, name, stamp):
            continue  # not the writer's as it left it: only the fingerprint can tell
        if same_context and recorded[name] == digest:
            vouched.append({"shard": name, "skipped": True, "bytes": stamp[0], "packs": packs, "samples": samples,
                            "seconds": 0.0, "fingerprint": stamp[2]})
        else:
            refuted.add(name)
    return vouched, refuted


def record_written(work: Path, key: str, out_dir: Path, results: list[dict], context: dict,
                   digests: dict[str, tuple[str, int, int]], digest_keys: dict[str, str]) -> None:
    """Each output shard's content fingerprint as the writer wrote or found it, with the file's (size,
    mtime_ns) then, so the audit need not compute them again (one query over every sample); the hash of
    the Energon index written with them, whose rows the next run may keep for the shards it does not touch;
    (``context``, ``digests``) what vouched_shards checks on the next write; and ``digest_keys``, under which
    the next write takes a shard's digest from this record instead of computing it."""
    shards = {}
    for r in results:
        st = (out_dir / r["shard"]).stat()
        shards[r["shard"]] = [st.st_size, st.st_mtime_ns, r["fingerprint"]]
    index = out_dir / NV_META / "index.sqlite"
    store.atomic_write_text(work / WRITTEN, json.dumps(
        {"key": key, "shards": shards, "index_sha256": file_sha256(index),
         "context": _context_digest(context), "digest_format": DIGEST_FORMAT,
         "digests": {n: digests[n][0] for n in shards if n in digests},
         "digest_keys": {n: digest_keys[n] for n in shards if n in digest_keys}},
        sort_keys=True))


def _record(work: Path) -> dict | None:
    try:
        record = json.loads((work / WRITTEN).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("shards"), dict) else None


def _as_left(out_dir: Path, name: str, stamp: list | None) -> bool:
    """Whether an output shard is still as the writer recorded it (size and mtime)."""
    try:
        st = (out_dir / name).stat()
    except OSError:
        return False
    return stamp is not None and stamp[:2] == [st.st_size, st.st_mtime_ns]


def last_index(work: Path, out_dir: Path, names: set[str]) -> LastIndex | None:
    """The Energon index the last write left, as the writer's record describes it, with the shards of
    ``names`` (found current, not rewritten) whose files are unchanged since (size, mtime): their rows stand
    while the index's hash is the recorded one. Reading 1M tar headers back took 86 s of a 1M-sample
    incremental write."""
    record = _record(work)
    if not names or record is None or not record.get("index_sha256"):  # a first write or a full rewrite
        return None
    kept = frozenset(n for n in names if _as_left(out_dir, n, record["shards"].get(n)))
    if not kept:
        return None
    return LastIndex(record["index_sha256"], sorted(record["shards"]), kept)  # write_energon_meta numbered the tars so


def written_stamps(work: Path, key: str, out_dir: Path, names: list[str]) -> dict[str, list] | None:
    """[size, mtime_ns, fingerprint] of every planned output shard from the writer's record, or None when the
    record is for another plan, context or source state, or a shard is missing or not as the writer left it."""
    record = _record(work)
    if record is None or record.get("key") != key:
        return None
    stamps = {name: record["shards"].get(name) for name in names}
    return stamps if all(_as_left(out_dir, n, stamp) for n, stamp in stamps.items()) else None


def check_sources(con, input_root: Path, shards: list[str]) -> None:
    """Refuse to copy byte ranges out of a shard that is not the one the manifest scanned."""
    recorded = {r[0]: (r[1], r[2], r[3]) for r in con.execute("SELECT shard, size, mtime_ns, status FROM shards").fetchall()}
    problems = []
    for shard in shards:
        path = store.source_tar(input_root, shard)
        try:
            st = path.stat()
        except OSError as e:
            problems.append(f"{shard}: {type(e).__name__}: {e}")
            continue
        size, mtime, status = recorded.get(shard, (None, None, None))
        if (st.st_size, st.st_mtime_ns) != (size, mtime) or status == "changed":
            problems.append(f"{shard}: changed since it was scanned")
    if problems:
        raise SourceChanged("source shards differ from the manifest; rerun manifest/token_lengths/pack_plan for them "
                            "before writing: " + "; ".join(problems[:10]))


def run_write(work: Path, input_root: Path, out_dir: Path, workers: int = 0, progress=None,
              mode: str = "copy") -> WriteSummary:
    """The stage: every planned output shard written or found current. ``mode`` "index" writes byte-range
    indexes into the sources instead of copying media (``core/index_out.py``)."""
    if mode == "index":
        from .index_out import run_write_index

        return run_write_index(work, input_root, out_dir, progress)
    if mode != "copy":
        raise ValueError(f"output mode {mode!r}: expected copy or index")
    t0 = time.perf_counter()
    for root in (input_root.values() if isinstance(input_root, dict) else [input_root]):
        check_paths(Path(root), work, out_dir)
    with store.connect(work, read_only=True) as con:
        info = PlanInfo.load(con)
        check_sources(con, input_root, [s[0] for s in con.execute(
            "SELECT DISTINCT shard FROM pack_members JOIN manifest_samples USING (sample_id)").fetchall()])
        names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
        context = write_context(info)
        key = written_key(con, info, context)
        digests, keys = shard_digests(con, _record(work))
        done, refuted = vouched_shards(work, out_dir, context, digests)
        # the rest of what is on disk (not as the writer left it, or no record of it) by its fingerprint
        done += current_shards(con, out_dir, context, only=set(names) - {r["shard"] for r in done} - refuted)
    skip = {r["shard"] for r in done}
    last = last_index(work, out_dir, skip)
    todo = [n for n in names if n not in skip]
    with store.staged(work, WRITE_ROWS, todo) if len(todo) > 1 else contextlib.nullcontext() as rows:
        root = input_root if isinstance(input_root, dict) else str(input_root)
        results = write_all(out_dir, todo, context, workers=workers, progress=progress,
                            loader=functools.partial(load_shard_job, str(work), root, rows), done=done,
                            plan_fingerprint=info.fingerprint, last=last)
    record_written(work, key, out_dir, results, context, digests, keys)
    first = out_dir / names[0] if names else None
    return WriteSummary(
        output_dir=out_dir, shards=len(results), written=sum(not r["skipped"] for r in results),
        skipped=sum(r["skipped"] for r in results), bytes=sum(r["bytes"] for r in results),
        packs=sum(r["packs"] for r in results), seconds=round(time.perf_counter() - t0, 3), fingerprint=info.fingerprint,
        foreign_files=owned.foreign_files(out_dir, owned.planned_files(names)),
        example_meta=(first_pack_meta(first) or {}) if first is not None else {})
