"""packed_shards in index mode (``output_mode: index``): the plan without a copy of the media.

Each output shard is a tar with, per pack, ``<pack>.json`` (the same document copy mode writes: full
conversations, source records and ``_meta``) and ``<pack>.index.json``, the byte ranges in the source shards
(the format: ``core/indexmode.py``). ``pack_index.json`` at the top lists the shards and every source's stamp.
The shards carry ``.tar.idx``, ``.nv-meta/`` and ``wids-index.json`` like copy-mode shards, so Energon and
wids open them as they are; the reader (``pack_assets.reader``) reads the media by ``pread`` from the sources,
after checking their stamps.

Everything else is the copy mode's: the same jobs, the same source check before writing, atomic temp + rename
per file, the owned-files record (switching a folder between modes replaces only the tool's own files), and
a rerun keeps a shard whose fingerprint (here also over the input root and every source stamp, since the
index names them) is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from .. import faults, owned, store
from ..indexmode import FORMAT, INDEX_FILE, INDEX_PART, Root, recorded_roots
from ..plan import PlanInfo
from ..safety import mkstemp, replace
from ..tario import BLOCK, RECORD, first_pack_meta, member_header, padding
from .fingerprints import ShardFingerprint, current_shards, shard_fingerprint
from .jobs import PackJob, ShardJob, ShardResult, pack_document, shard_job
from .shared import OutputFolder, Progress, WriteSummary, check_roots, check_sources, planned_shards, write_context
from .syscalls import Sources, read_record


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


def index_document(job: PackJob, context: dict, sources: Sources, root: Root) -> tuple[bytes, dict]:
    """The pack's JSON (as copy mode writes it) and its byte-range index."""
    doc, media = pack_document(job, context, [read_record(sub, sources) for sub in job.subs])
    stamps, parts = {}, {}
    for out_name, sub, m in media:
        rel = f"{sub.shard}.tar"
        stamps[rel] = _stamp(sub)
        parts[out_name.split(".", 1)[1]] = {"source": rel, "offset": m["offset"], "size": m["size"],
                                            "sha256": m["sha256"]}
    where = {"roots": dict(root)} if isinstance(root, Mapping) else {"root": root}
    return doc, {"format": FORMAT, **where, "sources": dict(sorted(stamps.items())), "parts": parts}


def _member(out, name: str, body: bytes) -> None:
    out.write(member_header(name, len(body)))
    out.write(body)
    out.write(padding(len(body)))


def write_index_shard(out_dir: Path, job: ShardJob, context: dict, root: Root) -> ShardResult:
    """One index-mode output shard, atomically; skipped when one with the same fingerprint is there."""
    t0 = time.perf_counter()
    final = out_dir / job.name
    context = {**context, "shard_fingerprint": shard_fingerprint(job, context, IndexFingerprint(context, root))}
    if final.exists() and (first_pack_meta(final) or {}).get("shard_fingerprint") == context["shard_fingerprint"]:
        return ShardResult(job.name, True, final.stat().st_size, len(job.packs), job.samples, time.perf_counter() - t0)
    sources = Sources()
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
        replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        sources.close()
    return ShardResult(job.name, False, written, len(job.packs), job.samples, time.perf_counter() - t0)


def planned_files(shards: list[str]) -> set[str]:
    return owned.planned_files(shards) | {INDEX_FILE}


@faults.names_full_disk({"out_dir": ("output", "--output"), **faults.WORK})
def run_write_index(work: Path, input_root: Path | Mapping, out_dir: Path, workers: int = 0,
                    progress: Progress | None = None) -> WriteSummary:
    """The packed_shards stage in index mode. One process (``workers`` is the copy mode's, taken for the same
    call): no media bytes move, the cost is the records. ``input_root``: the input folder, or a recipe's roots
    (dataset name -> folder) for one of its epochs."""
    t0 = time.perf_counter()
    check_roots(input_root, work, out_dir)
    root = recorded_roots(input_root)
    with store.connect(work, read_only=True) as con:
        info = PlanInfo.load(con)
        in_use = set(check_sources(con, input_root))
        stamps = {f"{r[0]}.tar": {"size": r[1], "mtime_ns": r[2]} for r in con.execute(
            "SELECT shard, size, mtime_ns FROM shards ORDER BY 1").fetchall() if r[0] in in_use}
        names = planned_shards(con)
        context = index_context(info)
        done = current_shards(con, out_dir, context, functools.partial(IndexFingerprint, root=root))
        folder = OutputFolder(out_dir, planned_files(names))
        results = _write_shards(con, input_root, out_dir, names, done, context, root, progress)
    meta = folder.metadata(names, info.fingerprint)
    where = {"input_roots": root} if isinstance(root, Mapping) else {"input_root": root}
    doc = {"format": FORMAT, "tool": "pack_assets", **where, "plan_fingerprint": info.fingerprint,
           "shards": [{"name": n, "packs": meta.counts[n]} for n in names], "sources": stamps}
    store.atomic_write_text(out_dir / INDEX_FILE, json.dumps(doc, indent=1) + "\n")
    folder.finish(meta, results)  # only recorded files of an earlier plan (or mode) are deleted
    return WriteSummary.of(out_dir, folder.planned, names, results, time.perf_counter() - t0, info.fingerprint,
                           mode="index")


def _write_shards(con, input_root, out_dir: Path, names: list[str], done: list[ShardResult], context: dict,
                  root: Root, progress: Progress | None) -> list[ShardResult]:
    """Every planned shard not among ``done`` (found current) written, in name order."""
    skip = {r.shard for r in done}
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
    return results
