"""packed_shards in index mode (``output_mode: index``): the plan without a copy of the media.

Each output shard is a tar with, per pack, ``<pack>.json`` (the same document copy mode writes: full
conversations, source records and ``_meta``) and ``<pack>.index.json``: for every media and extra part the
copy would hold, the source shard (path relative to the input root), byte offset, size and sha256, plus each
source shard's size and mtime as scanned and the input root (absolute). A recipe's epochs (several inputs)
record ``roots`` instead (dataset name -> absolute folder); their sources are ``<dataset>/<shard>.tar``, the
first path component naming the dataset, so a single input's index reads as it always did.
``pack_index.json`` at the top lists the shards and every source's stamp. The shards carry ``.tar.idx``, ``.nv-meta/`` and
``wids-index.json`` like copy-mode shards, so Energon and wids open them as they are; the reader
(``pack_assets.reader``) reads the media by ``pread`` from the sources, after checking their stamps.

Everything else is the copy mode's: the same jobs (``write.shard_job``), the same source check before
writing, atomic temp + rename per file, the owned-files record (switching a folder between modes replaces
only the tool's own files), and a rerun keeps a shard whose fingerprint (here also over the input root and
every source stamp, since the index names them) is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from . import owned, store, write
from .plan import PlanInfo
from .safety import check_paths, mkstemp
from .tario import BLOCK, RECORD, first_pack_meta, member_header, padding
from .write import (PackJob, ShardFingerprint, ShardJob, SourceChanged, WriteSummary, _Sources, check_sources,
                    current_shards, pack_document, read_record, shard_job, write_context, write_energon_meta,
                    write_wids_index)

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


def index_context(info: PlanInfo) -> dict:
    """What every index-mode `_meta` carries: the copy mode's context and the mode."""
    return {**write_context(info), "output_mode": "index"}


class IndexFingerprint(ShardFingerprint):
    """The copy mode's fingerprint, plus what the index holds besides: the input root and every source's
    stamp (a touched source gets a new index even when its members hash the same)."""

    def __init__(self, context: dict, root: Root = "") -> None:
        super().__init__(context)
        if isinstance(root, Mapping):  # every dataset's folder: moving one gives new indexes
            self._h.update(f"roots|{json.dumps(dict(sorted(root.items())))}\n".encode())
        else:
            self._h.update(f"root|{root}\n".encode())

    def sub(self, sample_id, token_len, conversation_sha256, json_member, media, extra, source_stamp=None) -> None:
        super().sub(sample_id, token_len, conversation_sha256, json_member, media, extra, source_stamp)
        self._h.update(f"stamp|{source_stamp}\n".encode())


def _stamp(sub) -> dict:
    size, mtime = (sub.source_stamp or ":").split(":")
    return {"size": int(size) if size else None, "mtime_ns": int(mtime) if mtime else None}


def index_document(job: PackJob, context: dict, sources: _Sources, root: Root) -> tuple[bytes, dict]:
    """The pack's JSON (as copy mode writes it) and its byte-range index."""
    doc, media = pack_document(job, context, [read_record(sub, sources) for sub in job.subs])
    stamps, parts = {}, {}
    for out_name, sub, m in media:
        rel = f"{sub.shard}.tar"
        stamps[rel] = _stamp(sub)
        parts[out_name.split(".", 1)[1]] = {"source": rel, "offset": m["offset"], "size": m["size"], "sha256": m["sha256"]}
    where = {"roots": dict(root)} if isinstance(root, Mapping) else {"root": root}
    return doc, {"format": FORMAT, **where, "sources": dict(sorted(stamps.items())), "parts": parts}


def shard_fingerprint(job: ShardJob, context: dict, root: Root) -> str:
    return write.shard_fingerprint(job, context, IndexFingerprint(context, root))


def _member(out, name: str, body: bytes) -> None:
    out.write(member_header(name, len(body)))
    out.write(body)
    out.write(padding(len(body)))


def write_index_shard(out_dir: Path, job: ShardJob, context: dict, root: Root) -> dict:
    """One index-mode output shard, atomically; skipped when one with the same fingerprint is there."""
    t0 = time.perf_counter()
    final = out_dir / job.name
    context = {**context, "shard_fingerprint": shard_fingerprint(job, context, root)}
    stats = {"shard": job.name, "packs": len(job.packs), "samples": sum(len(p.subs) for p in job.packs)}
    if final.exists() and (first_pack_meta(final) or {}).get("shard_fingerprint") == context["shard_fingerprint"]:
        return {**stats, "skipped": True, "bytes": final.stat().st_size, "seconds": time.perf_counter() - t0}
    sources = _Sources()
    fd, tmp = mkstemp(prefix=f".{job.name}.tmp-", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            for pack in job.packs:
                doc, index = index_document(pack, context, sources, root)
                # the record first: first_pack_meta, Energon and the reader find `_meta` where copy mode has it
                _member(out, f"{pack.pack_id}.json", doc)
                _member(out, f"{pack.pack_id}.{INDEX_PART}", json.dumps(index, ensure_ascii=False).encode("utf-8"))
            out.write(b"\0" * (2 * BLOCK))
            out.write(b"\0" * (-out.tell() % RECORD))
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        sources.close()
    return {**stats, "skipped": False, "bytes": written, "seconds": time.perf_counter() - t0}


def planned_files(shards: list[str]) -> set[str]:
    return owned.planned_files(shards) | {INDEX_FILE}


def run_write_index(work: Path, input_root: Path | Mapping, out_dir: Path, progress=None) -> WriteSummary:
    """The packed_shards stage in index mode. One process: no media bytes move, the cost is the records.
    ``input_root``: the input folder, or a recipe's roots (dataset name -> folder) for one of its epochs."""
    t0 = time.perf_counter()
    for r in (input_root.values() if isinstance(input_root, Mapping) else [input_root]):
        check_paths(Path(r), work, out_dir)
    root = recorded_roots(input_root)
    with store.connect(work, read_only=True) as con:
        info = PlanInfo.load(con)
        used = [s[0] for s in con.execute(
            "SELECT DISTINCT shard FROM pack_members JOIN manifest_samples USING (sample_id) ORDER BY 1").fetchall()]
        check_sources(con, input_root, used)
        in_use = set(used)
        stamps = {f"{r[0]}.tar": {"size": r[1], "mtime_ns": r[2]} for r in con.execute(
            "SELECT shard, size, mtime_ns FROM shards ORDER BY 1").fetchall() if r[0] in in_use}
        names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
        context = index_context(info)
        done = current_shards(con, out_dir, context, functools.partial(IndexFingerprint, root=root))
        skip = {r["shard"] for r in done}
        out_dir.mkdir(parents=True, exist_ok=True)
        planned = planned_files(names)
        before = owned.claim(out_dir, planned)  # refuses before the first write when a planned name is not ours
        owned.remove_temp_leftovers(out_dir, planned | set(before))
        results = list(done)
        for i, r in enumerate(results, 1):
            if progress:
                progress(r, i, len(names))
        for name in names:
            if name in skip:
                continue
            results.append(write_index_shard(out_dir, shard_job(con, input_root, name), context, root))
            if progress:
                progress(results[-1], len(results), len(names))
    counts = write_energon_meta(out_dir, names, info.fingerprint)
    write_wids_index(out_dir, counts)
    where = {"input_roots": root} if isinstance(root, Mapping) else {"input_root": root}
    doc = {"format": FORMAT, "tool": "pack_assets", **where, "plan_fingerprint": info.fingerprint,
           "shards": [{"name": n, "packs": counts[n]} for n in names], "sources": stamps}
    store.atomic_write_text(out_dir / INDEX_FILE, json.dumps(doc, indent=1) + "\n")
    owned.finish(out_dir, planned, before)  # only recorded files of an earlier plan (or mode) are deleted
    for r in results:
        if counts[r["shard"]] != r["packs"]:
            raise RuntimeError(f"{r['shard']}: {counts[r['shard']]} samples on disk, {r['packs']} packs planned")
    first = out_dir / names[0] if names else None
    return WriteSummary(
        output_dir=out_dir, shards=len(results), written=sum(not r["skipped"] for r in results),
        skipped=sum(r["skipped"] for r in results), bytes=sum(r["bytes"] for r in results),
        packs=sum(r["packs"] for r in results), seconds=round(time.perf_counter() - t0, 3), fingerprint=info.fingerprint,
        foreign_files=owned.foreign_files(out_dir, planned),
        example_meta=(first_pack_meta(first) or {}) if first is not None else {}, output_mode="index")


# -- reading: the media of an index-mode pack, from its sources ---------------------------------------------


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
            raise IndexSourceChanged(path, f"changed since it was packed (size {st.st_size}, mtime_ns {st.st_mtime_ns}; "
                                           f"indexed {stamp.get('size')}, {stamp.get('mtime_ns')})")
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
