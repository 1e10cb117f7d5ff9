"""audit stage: read the outputs back and prove nothing was lost.

Reads every output shard (not the plan), hashes every media member, and checks it against the plan and
the manifest: every source sample exactly once across packed / dropped / rejected (per shard and in total),
no pack over capacity, no mixed media types, every media (and extra member) byte equal to its source,
``_meta`` consistent, and every packed conversation equal to the current manifest's (nothing stale).
An index-mode output (``core/indexmode.py``) is checked the same way, its media read from the source
ranges its index names, after the sources' stamps (``source_changed``, ``bad_index`` besides).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import multiprocessing
import os
import queue
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa

from .. import __version__
from . import faults, filedigest, packdoc, store
from .aside import run_aside
from .blend import check_blend
from .counting import drift
from .coverage import not_counted
from .cpad import pack_padded_len
from .expected import AUDIT_ROWS, ShardTexts, shard_expectations
from .handback import hand_back
from .indexmode import INDEX_PART, SourceFiles, is_index_folder
from .outcomes import per_shard
from .plan import PlanConfig, PlanInfo
from .plancheck import check_plan
from .reasons import ReasonError
from .recipe import expected_copies
from .recount import recount
from .report import audit_figures, write_report
from .results import AuditResult
from .settings import AUDIT_SCOPES
from .tario import iter_entries, split_key
from .write.current import current_stamps

# Below this much output a second process costs more (spawn and imports) than it saves, and the output shards
# are read by threads instead (measured: docs/benchmarks.md).
PARALLEL_MIN_BYTES = 1 << 30


def _check_current(res: AuditResult, name: str, key: str, packed: dict, meta: dict, samples: dict,
                   members: dict, texts: ShardTexts) -> None:
    """Each packed sub-sample against the current manifest: its record member (sha256), normalized
    conversation (``packed``: sample id -> its messages, `packdoc.SAME` where the text is the manifest's) and
    member lists; an output older than its source fails here even when the bytes it copied are intact."""
    for src in meta.get("sources", []):
        sid = src.get("sample_id")
        row = samples.get(sid)
        if row is None or len(row) < 8:
            continue  # a sample the plan does not hold: meta_mismatch says so
        json_name, conversation, media_names, extra_names = row[4:8]
        jm = src.get("json_member") or {}
        current_sha = members.get((sid, json_name), (None, None))[0] if json_name else None
        if jm.get("name") != json_name or (current_sha is not None and jm.get("sha256") != current_sha):
            res.add("stale_conversation", f"{sid}: the packed record {jm.get('name')} ({jm.get('sha256')}) is not "
                    f"the current {json_name} ({current_sha})", shard=name, pack_id=key, sample_id=sid)
        elif packed.get(sid) is not packdoc.SAME and packed.get(sid) != json.loads(texts(sid, conversation) or "null"):
            res.add("stale_conversation", f"{sid}: the packed messages differ from the manifest's conversation",
                    shard=name, pack_id=key, sample_id=sid)
        for kind, current in (("media", media_names), ("extra", extra_names)):
            if [m.get("name") for m in src.get(kind, [])] != list(current or []):
                packed_names = [m.get("name") for m in src.get(kind, [])]
                res.add(f"stale_{kind}", f"{sid}: packed {kind} members {packed_names[:5]} are not the current "
                        f"{list(current or [])[:5]}", shard=name, pack_id=key, sample_id=sid)


def _read_doc(data: bytes, samples: dict) -> tuple[dict, dict]:
    """A pack document's ``_meta`` and each sample's messages: walked in the writer's layout (`packdoc`), the
    conversations that are the manifest's text left unparsed; parsed whole where the layout differs. Raises
    what `json.loads` and a missing ``_meta`` raise."""
    walked = packdoc.walk(data, lambda sid: row[5] if (row := samples.get(sid)) is not None and len(row) >= 8
                          else None)
    if walked is not None:
        return walked
    doc = json.loads(data)
    if not isinstance(doc.get("_meta"), dict):
        raise TypeError("its _meta is not an object")
    return doc["_meta"], {s.get("sample_id"): s.get("messages") for s in doc.get("samples", []) if isinstance(s, dict)}


def _check_pack(res: AuditResult, name: str, key: str, parts: dict, expect: dict | None, samples: dict,
                members: dict, texts: ShardTexts, config: PlanConfig, digests: dict | None = None) -> Counter:
    """One pack read back against its plan row; returns the media and extra members checked and their bytes.
    `digests`: sha256 hex of parts already hashed (`_hashed`); the others are hashed here."""
    max_len, pad = config.max_len, config.pad_multiple
    if "json" not in parts:
        res.add("missing_json", f"pack {key} has no json member", shard=name, pack_id=key)
        return Counter()
    try:
        meta, packed = _read_doc(parts["json"], samples)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        res.add("bad_json", f"pack {key}: {e}", shard=name, pack_id=key)
        return Counter()
    if expect is None:
        res.add("unknown_pack", f"pack {key} is not planned for {name}", shard=name, pack_id=key)
        return Counter()
    if (meta.get("sample_ids"), meta.get("sample_token_lens"), meta.get("total_token_len"), meta.get("media_type"),
            meta.get("pack_id")) != (expect["sample_ids"], expect["lens"], expect["total"], expect["media_type"], key):
        res.add("meta_mismatch", f"pack {key}: _meta differs from pack_plan", shard=name, pack_id=key)
    if sum(expect["lens"]) != expect["total"]:
        res.add("meta_mismatch", f"pack {key}: lengths do not add up to {expect['total']}", pack_id=key)
    padded = -(-pack_padded_len(expect["lens"], config.multiple) // pad) * pad  # sub-samples padded, then the pack
    if padded > max_len and not (expect["overlong"] and len(expect["sample_ids"]) == 1):
        res.add("over_capacity", f"pack {key}: {padded} tokens (padded) > {max_len}", pack_id=key)
    rows = [samples.get(sid, (None, None, 0, 0)) for sid in expect["sample_ids"]]
    for cap, value, what in (("max_samples_per_pack", len(rows), "samples"),
                             ("max_media_per_pack", sum(r[2] or 0 for r in rows), "media items"),
                             ("max_vision_tokens_per_pack", sum(r[3] or 0 for r in rows), "vision tokens")):
        if getattr(config, cap) and value > getattr(config, cap):
            res.add("over_cap", f"pack {key}: {value} {what} > {cap} {getattr(config, cap)}", pack_id=key)
    for sid, n, row in zip(expect["sample_ids"], expect["lens"], rows):
        if row[0] != n:
            res.add("length_mismatch", f"{sid}: plan {n}, token_lengths {row[0]}", pack_id=key)
        if config.pack_per_media_type and row[1] != expect["media_type"]:
            res.add("mixed_media", f"{sid} is {row[1]} in a {expect['media_type']} pack", pack_id=key)
    _check_current(res, name, key, packed, meta, samples, members, texts)
    return _check_media(res, name, key, parts, meta, members, digests or {})


def _check_media(res: AuditResult, name: str, key: str, parts: dict, meta: dict, members: dict,
                 digests: dict) -> Counter:
    """Every media and extra member of a pack against its source's size and sha256; returns the counts."""
    counts = {"media": 0, "media_bytes": 0, "extra": 0, "extra_bytes": 0}
    expected_media = set()
    for src in meta.get("sources", []):
        # extra members (neither record nor media) are source bytes too: hashed and counted alike
        for kind in ("media", "extra"):
            for m in src.get(kind, ()):
                output_name = m["output_name"]
                part = output_name.split(".", 1)[1]
                expected_media.add(part)
                data = parts.get(part)
                if data is None:
                    res.add("missing_media", f"{output_name} is named in _meta but absent", shard=name, pack_id=key)
                    continue
                source_sha, source_size = members.get((src["sample_id"], m["name"]), (None, None))
                digest = digests.get(part) or hashlib.sha256(data).hexdigest()
                counts[kind] += 1
                counts[f"{kind}_bytes"] += len(data)
                if source_size is None:
                    res.add("unknown_media", f"{m['name']} of {src['sample_id']} not in members", pack_id=key)
                elif (source_sha is not None and digest != source_sha) or len(data) != source_size:
                    res.add("media_hash_mismatch", f"{output_name}: bytes differ from source {m['name']}",
                            shard=name, pack_id=key)
                if m.get("sha256") and m["sha256"] != digest:
                    res.add("meta_hash_mismatch", f"{output_name}: sha256 differs from _meta", pack_id=key)
    extra = set(parts) - expected_media - {"json"}
    if extra:
        res.add("extra_member", f"pack {key} has members not in _meta: {sorted(extra)[:5]}", pack_id=key)
    return Counter({k: n for k, n in counts.items() if n})


def _pack_parts(path: Path, hashed: filedigest.HashedReads | None = None):
    """(pack key, {part name: bytes}) for each pack of an output shard, as `tario.iter_pack_parts` gives
    them, read with the scan's header reader (`iter_entries`): tarfile's header objects cost more than hashing
    small members. ``hashed``: the reads come from it (large chunks, hashed as read), and it is finished once
    the last pack is given (its ``digest``, the shard's file digest, from this one read). A broken archive
    raises tarfile.ReadError after the packs before the break."""
    with open(path, "rb") as f:
        fd, key, parts = f.fileno(), None, {}
        if hashed is not None:
            hashed.begin(fd)
        pread = os.pread if hashed is None else hashed.pread
        try:
            for e in iter_entries(f, os.fstat(fd).st_size, pread=pread):
                if e.kind == "break":
                    raise tarfile.ReadError(e.detail)
                k, part = split_key(e.name)
                if k != key and parts:
                    yield key, parts
                    parts = {}
                key = k
                parts[part] = pread(fd, e.size, e.offset) if e.kind == "file" else None
        except ReasonError as e:
            raise tarfile.ReadError(e.detail) from None
        if parts:
            yield key, parts
        if hashed is not None:
            hashed.finish()


def _digests(parts: dict) -> dict[str, str]:
    return {part: hashlib.sha256(data).hexdigest() for part, data in parts.items()
            if part != "json" and data is not None}


def _hashed(packs, hasher: ThreadPoolExecutor):
    """(key, parts, digests) for each pack of `packs`: its members are hashed by `hasher`'s thread while this
    one checks the pack before (sha256 and pread release the GIL: the two overlap on two cores). An index
    pack's media are read from its sources when it is checked: they are hashed then, as before."""
    def done(key, parts, ahead):
        return key, parts, ahead and ahead.result()

    last = None
    try:
        for key, parts in packs:
            ahead = None if INDEX_PART in parts else hasher.submit(_digests, parts)
            if last is not None:
                yield done(*last)
            last = key, parts, ahead
    except Exception:  # a broken archive: the packs read before the break are checked first, as in line
        if last is not None:
            yield done(*last)
        raise
    if last is not None:
        yield done(*last)


def _audit_shard(con, out_dir: Path, name: str, config: PlanConfig, rows: store.Staged | None = None,
                 hasher: ThreadPoolExecutor | None = None, held_to: str | None = None
                 ) -> tuple[list[dict], Counter, Counter, str | None]:
    """One output shard read back: its violations, the pack keys seen, media/extra members and bytes checked,
    and when it passed, its file's digest (`filedigest`: the next audit may hash it instead of checking it).
    `hasher`: a thread that hashes each pack's members ahead (`_hashed`). ``held_to``: the memory limit ``con``'s
    own DuckDB is held to (an audit worker's), lifted while it reads texts (`expected.ShardTexts`)."""
    res, seen, counts = AuditResult(), Counter(), Counter()
    path = out_dir / name
    if not path.exists():
        res.add("missing_shard", f"{name} is in the plan but not in {out_dir}", shard=name)
        return res.violations, seen, counts, None
    plan, samples, members = shard_expectations(con, name, rows)
    texts = ShardTexts(con, name, held_to)
    hashed = filedigest.HashedReads()  # the file digest from the same read as the checks, not a second one
    packs = _pack_parts(path, hashed)
    try:
        with SourceFiles() as sources:
            for key, parts, digests in _hashed(packs, hasher) if hasher else ((k, p, None) for k, p in packs):
                seen[key] += 1
                if INDEX_PART in parts:
                    parts = _resolve_index(res, name, key, parts, sources)
                counts.update(_check_pack(res, name, key, parts, plan.get(key), samples, members, texts, config,
                                          digests))
    except (tarfile.TarError, OSError) as e:
        res.add("unreadable_shard", f"{name}: {e}", shard=name)
    return res.violations, seen, counts, None if res.violations else hashed.digest


def _resolve_index(res: AuditResult, name: str, key: str, parts: dict, sources: SourceFiles) -> dict:
    """An index-mode pack's parts with its media read back from the source ranges (re-hashed by
    _check_media like copied ones): a changed or missing source is a violation, its parts stay absent
    (missing_media), and the index must name the very ranges `_meta` records."""
    try:
        index = json.loads(parts[INDEX_PART])
        ranges = {p: (r["source"], r["offset"], r["size"]) for p, r in index["parts"].items()}
        meta = json.loads(parts["json"])["_meta"]
    except (ValueError, KeyError, TypeError) as e:
        res.add("bad_index", f"pack {key}: unreadable index ({type(e).__name__}: {e})", shard=name, pack_id=key)
        return {k: v for k, v in parts.items() if k != INDEX_PART}
    for src in meta.get("sources", []):
        for m in src.get("media", []) + src.get("extra", []):
            part = m["output_name"].split(".", 1)[1]
            if ranges.get(part) != (f"{src['shard']}.tar", m["offset"], m["size"]):
                res.add("bad_index", f"pack {key}: index range of {part} {ranges.get(part)} is not _meta's "
                        f"{src['shard']}.tar @ {m['offset']}+{m['size']}", shard=name, pack_id=key)
    problems: list[str] = []
    try:
        resolved = sources.resolve(parts, problems)
    except ValueError as e:  # a source that names no recorded root (dataset)
        res.add("bad_index", f"pack {key}: {e}", shard=name, pack_id=key)
        return {k: v for k, v in parts.items() if k != INDEX_PART}
    for p in problems:
        res.add("source_changed", f"pack {key}: {p}", shard=name, pack_id=key)
    return resolved


_worker_con: duckdb.DuckDBPyConnection | None = None
WORKER_DUCKDB_MEMORY = "256MB"  # an audit worker's DuckDB (store.MEMORY_ENV, when set, bounds it instead)


def _worker_init(work: str, gc_thresholds: tuple[int, ...]) -> None:
    global _worker_con
    gc.set_threshold(*gc_thresholds)  # as the parent collects (the CLI's are relaxed: runenv.relax_gc)
    # its queries read one output shard's staged rows and plan rows (its texts, where needed, streamed): a cache
    # of the catalog's blocks, up to 1 GB, held nothing
    _worker_con = store.connect(Path(work), read_only=True, memory=WORKER_DUCKDB_MEMORY)


def _audit_shard_in_worker(out_dir: str, name: str, config: PlanConfig, rows: store.Staged | None):
    return _audit_shard(_worker_con, Path(out_dir), name, config, rows, held_to=WORKER_DUCKDB_MEMORY)


def _shard_results(con, out_dir: Path, shards: list[str], config: PlanConfig, work: Path | None, workers: int,
                   min_bytes: int, rows: store.Staged | None = None):
    """Per-shard audit results in shard order; output shards are independent, so several threads or
    processes (each with its own DuckDB cursor or read-only connection) share them."""
    total = sum((out_dir / n).stat().st_size for n in shards if (out_dir / n).exists())
    if is_index_folder(out_dir):  # what is read and hashed is the sources' media, not the small index
        total += con.execute("SELECT coalesce(sum(m.size), 0) FROM pack_members JOIN members m USING (sample_id)"
                             ).fetchone()[0]
    workers = min(workers or os.cpu_count() or 1, len(shards))
    if workers <= 1:
        # shard by shard here: with a core to spare, a second thread hashes each pack while this one checks
        # the pack before (a small gain on a one-shard run; the workers below already keep every core busy)
        with (ThreadPoolExecutor(1, thread_name_prefix="audit-sha256") if (os.cpu_count() or 1) > 1
              else contextlib.nullcontext()) as hasher:
            yield from (_audit_shard(con, out_dir, n, config, rows, hasher) for n in shards)
        return
    if work is None or total < min_bytes:
        # threads, each with its own DuckDB cursor: most of a shard's time is pread and sha256, which release
        # the GIL, and threads cost no spawn and no imports (a process pays both before its first byte)
        cursors = queue.SimpleQueue()  # made here, in this thread: one per worker, lent per shard
        for _ in range(workers):
            cur = con.cursor()
            cur.execute("SET python_enable_replacements = false")  # a cursor does not inherit it (store.connect)
            cursors.put(cur)

        def one(name: str):
            cur = cursors.get()
            try:
                return _audit_shard(cur, out_dir, name, config, rows)
            finally:
                cursors.put(cur)

        try:
            with ThreadPoolExecutor(workers) as pool:
                yield from pool.map(one, shards)
        finally:
            while not cursors.empty():
                cursors.get().close()
        return
    # spawn, not fork: a forked child would inherit DuckDB's cached instance of this database without its threads
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                             initargs=(str(work), gc.get_threshold())) as pool:
        yield from pool.map(_audit_shard_in_worker, [str(out_dir)] * len(shards), shards, [config] * len(shards),
                            [rows] * len(shards))


def _per_dataset(con: duckdb.DuckDBPyConnection, repeats: dict[str, float]) -> dict[str, dict]:
    """A blend's counts per dataset (core/blend.py): source samples read, rejected, ok; the copies its draw
    gives (⌊r⌋·ok + the seeded share); copies read back in packs and copies dropped."""
    rows = con.execute(
        """WITH src AS (SELECT split_part(shard, '/', 1) AS dataset, count(*) AS read,
                               count(*) FILTER (WHERE status = 'rejected') AS rejected,
                               count(*) FILTER (WHERE status = 'ok') AS ok FROM samples GROUP BY 1),
                pk AS (SELECT dataset, count(*) AS packed FROM pack_members
                       WHERE pack_id IN (SELECT pack_id FROM audit_seen) GROUP BY 1),
                dr AS (SELECT dataset, count(*) AS dropped FROM dropped GROUP BY 1)
           SELECT dataset, read, rejected, ok, coalesce(packed, 0), coalesce(dropped, 0)
           FROM src LEFT JOIN pk USING (dataset) LEFT JOIN dr USING (dataset) ORDER BY 1""").fetchall()
    return {r[0]: {"read": r[1], "rejected": r[2], "ok": r[3], "repeat": repeats.get(r[0]),
                   "expected": expected_copies(r[3], repeats.get(r[0], 0.0)), "packed": r[4], "dropped": r[5]}
            for r in rows}


def _mark_seen(con: duckdb.DuckDBPyConnection, pack_ids) -> None:
    """The packs an audit found in the outputs, as a temporary table (audit_seen) its SQL checks join against."""
    con.execute("CREATE OR REPLACE TEMP TABLE audit_seen (pack_id VARCHAR)")  # (also ends a result left open)
    # one registered column, not executemany: a row per INSERT took seconds for the packs of 1M samples
    with store.columns_relation(con, "audit_seen_rows", [list(pack_ids)], pa.schema([("pack_id", pa.string())])) \
            as rel:
        con.execute(f"INSERT INTO audit_seen {rel}")


def _check_seen(con: duckdb.DuckDBPyConnection, res: AuditResult, seen: Counter) -> None:
    """The packs read back (`seen`) against the plan: each once, none missing, no planned sample lost."""
    for p, n in sorted(seen.items()):
        if n > 1:
            res.add("duplicate_pack", f"pack {p} appears {n} times", pack_id=p)
            res.add("duplicate_sample", f"the samples of pack {p} appear {n} times", pack_id=p)
    _mark_seen(con, seen)
    missing = con.execute("SELECT pack_id, output_shard FROM pack_plan "
                          "WHERE pack_id NOT IN (SELECT pack_id FROM audit_seen) ORDER BY pack_id").fetchall()
    for p, shard in missing[:100]:
        res.add("missing_pack", f"pack {p} of {shard} not found", pack_id=p)
    lost = con.execute("SELECT count(*) FROM pack_members WHERE pack_id NOT IN (SELECT pack_id FROM audit_seen)"
                       ).fetchone()[0]
    if lost:
        res.add("lost_sample", f"{lost} planned sample(s) are in packs missing from the output")


def _check_counts(res: AuditResult, per_shard: dict[str, dict], per_dataset: dict[str, dict]) -> None:
    """Every source sample in exactly one outcome, per shard (a blend: per dataset, copies included)."""
    for shard, c in per_shard.items():
        if c["read"] != c["packed"] + c["dropped"] + c["rejected"] + c["split"]:
            res.add("count_mismatch", f"{shard}: read {c['read']} != packed {c['packed']} + dropped {c['dropped']} "
                    f"+ rejected {c['rejected']} + split {c['split']} (into {c['pieces']})", shard=shard)
    for name, c in per_dataset.items():
        if c["read"] != c["ok"] + c["rejected"] or c["expected"] != c["packed"] + c["dropped"]:
            res.add("count_mismatch", f"dataset {name}: read {c['read']} = ok {c['ok']} + rejected {c['rejected']}; "
                    f"copies drawn {c['expected']} (repeat {c['repeat']}) = packed {c['packed']} + dropped "
                    f"{c['dropped']}")


# the command's DuckDB for the plan's checks and the staging of the rows the audit reads, while side helpers recount
# and draw beside it: at 10M samples each filled the catalog's 1GB, the audit stage's peak; past this they spill
# (docs/benchmarks.md)
BESIDE_MEMORY = "512MB"


@contextlib.contextmanager
def _staged(con, work: Path | None, to_read: list[str]) -> Iterator[store.Staged | None]:
    """The rows of every output shard to read, staged at once (`store.staged`) with ``con``'s DuckDB held to
    BESIDE_MEMORY (or the catalog's limit when set, store.MEMORY_ENV); None for one shard or no work folder."""
    if work is None or len(to_read) <= 1:
        yield None
        return
    with contextlib.ExitStack() as stack:
        with store.held_to(con, store.memory_limit(BESIDE_MEMORY)):
            rows = stack.enter_context(store.staged(work, AUDIT_ROWS, to_read, con))
        yield rows


def audit(con: duckdb.DuckDBPyConnection, out_dir: Path, config: PlanConfig, work: Path | None = None, workers: int = 0,
          min_bytes: int = PARALLEL_MIN_BYTES, trusted: frozenset[str] = frozenset(),
          repeats: dict[str, float] | None = None, progress: Callable[[int, int, int], None] | None = None,
          digests: dict[str, str] | None = None) -> AuditResult:
    """Read every output shard back, one at a time per process (memory follows the output shard, not the
    dataset), and check it against the plan and the manifest; the plan's own invariants are checked in SQL.
    Output shards are read by ``workers`` threads (0: one per core), or processes given the work directory
    once there are ``min_bytes`` of them. ``trusted`` shards (unchanged since a clean audit) are not read: their
    planned packs count as seen. ``repeats``: a blend's plan (dataset -> repeat), counted per dataset.
    ``progress(shards read, shards to read, members re-hashed)`` after each output shard. ``digests``: given
    each shard's file digest that was read and passed."""
    with store.held_to(con, store.memory_limit(BESIDE_MEMORY)):
        res = AuditResult(violations=check_plan(con, config) if repeats is None else check_blend(con, config, repeats))
    shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
    seen: Counter = Counter()
    if trusted:
        seen.update(p for p, shard in con.execute("SELECT pack_id, output_shard FROM pack_plan").fetchall()
                    if shard in trusted)
    to_read = [n for n in shards if n not in trusted]
    counts: Counter = Counter()
    with _staged(con, work, to_read) as rows:
        hand_back()  # what the staging freed, before the workers start beside this process
        for done, (name, (violations, shard_seen, c, digest)) in enumerate(
                zip(to_read, _shard_results(con, out_dir, to_read, config, work, workers, min_bytes, rows)), 1):
            if digest is not None and digests is not None:
                digests[name] = digest
            res.violations.extend(violations)
            seen.update(shard_seen)
            counts.update(c)
            if progress:
                progress(done, len(to_read), counts["media"] + counts["extra"])
    hand_back()
    _check_seen(con, res, seen)
    per_dataset = _per_dataset(con, repeats) if repeats is not None else {}
    # a blend holds copies, so its samples add up per dataset (read = ok + rejected, copies = packed + dropped)
    shard_counts = per_shard(con) if repeats is None else {}
    _check_counts(res, shard_counts, per_dataset)
    counted = (per_dataset or shard_counts).values()
    total = {k: sum(c.get(k, 0) for c in counted) for k in ("read", "packed", "dropped", "rejected", "split", "pieces")}
    res.stats = {
        "samples_read": total["read"],
        "packed": total["packed"],
        "dropped": total["dropped"],
        "rejected": total["rejected"],
        "split": total["split"],  # source samples split into pieces (core/split.py), every piece read back
        "split_pieces": total["pieces"],
        "packs_in_plan": con.execute("SELECT count(*) FROM pack_plan").fetchone()[0],
        "packs_read": sum(seen.values()),
        "output_shards": len(shards),
        "output_shards_trusted": len(shards) - len(to_read),
        "media_members_checked": counts["media"],
        "media_bytes_checked": counts["media_bytes"],
        "extra_members_checked": counts["extra"],
        "extra_bytes_checked": counts["extra_bytes"],
        "violations": len(res.violations),
        "output_mode": "index" if is_index_folder(out_dir) else "copy",
        "per_shard": shard_counts,
        **({"per_dataset": per_dataset} if repeats is not None else {}),
    }
    return res


# -- the stage: audit the outputs, recount a sample of lengths, write the report ----------------------------

AUDITED = filedigest.AUDITED


@functools.cache
def _counting_versions() -> dict[str, str | None]:
    """The packages a recount's result (and which samples it picks) depends on besides the profile's files."""
    from importlib import metadata

    found = {}
    for name in ("transformers", "tokenizers", "tiktoken", "torch", "torchvision", "pillow", "av", "duckdb"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _versions_aside(pool: Executor | None) -> Callable[[], dict[str, str | None]]:
    """`_counting_versions` looked up by ``pool`` while the outputs are read back (importlib.metadata is slow in
    a process that has not looked yet), unless this process knows them already."""
    if _counting_versions.cache_info().currsize:
        return _counting_versions
    return run_aside(pool, _counting_versions).result


@faults.names_full_disk(faults.WORK)
def run_audit(work: Path, out_dir: Path, recount_fraction: float = 0.02, workers: int = 0,
              parallel_min_bytes: int = PARALLEL_MIN_BYTES, scope: str = "all", check_samples: int = 0,
              progress: Callable[[int, int, int], None] | None = None, pool: Executor | None = None,
              digests: bool = True, early: filedigest.EarlyDigests | None = None) -> AuditResult:
    """Read the outputs back and check every invariant; recount a deterministic sample of token lengths;
    write audit_report.md. scope "changed" reads only the output shards that are new or changed since the
    last clean audit (same size, mtime and content fingerprint as then: trusted, like rsync's quick check);
    "all" reads every one, an unchanged one only to hash it against the digest that audit recorded
    (`filedigest`). ``check_samples``: also recount that many samples per shard with the model's real
    processor (core/counting/drift.py), each difference a violation. ``progress``: as `audit`'s. ``pool``: where the
    recount and the report's figures run while the outputs are read back (the command's helpers), else here.
    ``digests=False`` (`pack-assets verify`): scope "all" checks every shard in full, none by its file digest.
    ``early``: the unchanged shards' digests taken while the plan and the writer ran, each used only for a file
    nobody has written since (`filedigest.EarlyDigests`)."""
    if scope not in AUDIT_SCOPES:
        raise ValueError(f"audit scope {scope!r}: expected one of {', '.join(AUDIT_SCOPES)}")
    versions = _versions_aside(pool)
    hand_back()  # what the stages before freed (a run's command process holds their heaps)
    with store.connect(work, read_only=True) as con:
        info = PlanInfo.load(con)
        store.check_plan_tables(con)
        figures = audit_figures(con, work, info.config.max_len, pool)  # drawn while the outputs are read back
        stamps = current_stamps(con, work, out_dir, info)
        before, recounted, recorded = filedigest.audited(work / AUDITED, versions(), __version__)
        recorded = recorded if digests else {}
        unchanged = [n for n, stamp in stamps.items() if before.get(n) == stamp]
        # "changed": the stamps alone (rsync's quick check); "all": each unchanged shard hashed, and vouched for
        # only where its bytes are the very bytes the last clean audit passed
        hashed = ({n: recorded[n] for n in unchanged if n in recorded} if scope == "changed"
                  else filedigest.vouched(out_dir, unchanged, recorded, workers, early))
        trusted = frozenset(unchanged if scope == "changed" else hashed)
        blend = info.stats.get("blend")
        recounting = recount(con, info, recount_fraction, trusted if recounted >= recount_fraction else frozenset(),
                             pool)
        checking = drift.audit_check(con, info.model_profile, check_samples) if check_samples else None
        result = audit(con, out_dir, info.config, work=work, workers=workers, min_bytes=parallel_min_bytes,
                       trusted=trusted, repeats=blend["repeats"] if blend else None, progress=progress,
                       digests=hashed)
        result.stats["output_shards_hashed"] = 0 if scope == "changed" else len(trusted)
        if blend:
            result.stats["blend"] = blend
        recounting(result)
        if checking is not None:
            checking(result)
        result.waiting = not_counted(con, info.stats, info.shards)  # the input's, not only the registered ones
        result.stats.update(verdict=result.verdict, shards_waiting=result.waiting)
        report = write_report(con, work, result, info, figures)
    result.report = Path(report["path"])
    result.plots = report["plots"]
    # a clean audit vouches for every current shard; one with violations vouches for none
    store.atomic_write_text(work / AUDITED, json.dumps(
        {"shards": stamps, "recount_fraction": recount_fraction, "versions": versions(),
         "digests": {n: d for n, d in hashed.items() if n in stamps}, "tool_version": __version__}
        if result.ok else {},
        sort_keys=True))
    return result
