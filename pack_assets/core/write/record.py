"""The writer's record (``<work>/written_shards.json``): what it wrote or found current, so the next write
and the audit need not prove it again. Per output shard its fingerprint with the file's size and mtime then,
and a content digest that DuckDB computes from the catalog (streaming aggregates, no sample in Python), keyed
by what it was computed from; the hash of the Energon index written with them; the context they were written
under. A shard on disk as the writer left it is vouched for (or refuted) by its digest alone; any doubt falls
back to the fingerprint (`fingerprints.current_shards`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import duckdb

from .. import store
from ..catalogview import within
from ..owned import NV_META
from ..plan import PlanInfo
from ..safety import file_sha256
from .energon import LastIndex
from .fingerprints import ONLY
from .jobs import ShardResult

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
# takes (pack, position, tokens, conversation, record/media/extra member names in order, every member's place
# and sha256, the source's size and mtime where a member is unhashed), the context left out (the record keeps
# it apart); the lines' 128-bit md5 XORed per shard. Not equal to the fingerprint, but equal exactly when its
# inputs are (each line holds its pack id and position, so no two lines of a shard are alike): so a recorded
# digest that differs refutes a shard as surely as its fingerprint would. Aggregates that stream (an ordered
# string_agg ran out of DuckDB's memory at 1M samples, and the fingerprint query hands every sample to Python:
# docs/benchmarks.md). Conversations are hashed before the joins, as in the fingerprint query; they and the member
# lists are the manifest's own (the `samples` view's join adds only a status, not hashed). DIGEST_FORMAT:
# bumped when the lines change (a record of another format vouches for nothing and refutes nothing). Each line's
# and member's md5 is computed once (`md5_number`, 128 bits), its halves taken from it: its high 64 bits are what
# `md5_number_lower` gives and its low 64 bits `md5_number_upper`'s (DuckDB's names), so the digests are those of
# format 2 when each was computed twice, in half the query's CPU (docs/benchmarks.md, issue 41).
DIGEST_FORMAT = 2
_DIGEST_ROWS = """
WITH mem AS (SELECT sample_id, (x >> 64)::UBIGINT || ':' || (x & $low)::UBIGINT AS lo_hi, unhashed
             FROM (SELECT sample_id, bit_xor(md5_number(m)) AS x, bool_or(unhashed) AS unhashed
                   FROM (SELECT sample_id, concat_ws(',', to_json(name), "offset", size, coalesce(sha256, '-')) AS m,
                                sha256 IS NULL AS unhashed
                         FROM members WHERE sample_id IN (SELECT sample_id FROM pack_members /*only_members*/))
                   GROUP BY sample_id)),
lines AS (SELECT p.output_shard, p.pack_id,
                 concat_ws('|', to_json(p.pack_id), p.media_type, p.total_token_len, pm.position, to_json(pm.sample_id),
                           t.total_tokens, s.conv, to_json(s.json_member), to_json(s.media_members),
                           to_json(s.extra_members), coalesce(mem.lo_hi, ''),
                           CASE WHEN mem.unhashed THEN coalesce(sh.size || ':' || sh.mtime_ns, '') END) AS line
          FROM pack_plan p JOIN pack_members pm USING (pack_id)
          JOIN (SELECT sample_id, shard, json_member, media_members, extra_members, md5(conversation) AS conv
                FROM manifest_samples /*only_ids*/) s USING (sample_id)
          JOIN (SELECT * FROM token_lengths /*only_ids*/) t USING (sample_id) LEFT JOIN mem USING (sample_id)
          LEFT JOIN shards sh ON sh.shard = s.shard /*only*/)
SELECT output_shard, (x >> 64)::UBIGINT || ':' || (x & $low)::UBIGINT, packs, samples
FROM (SELECT output_shard, bit_xor(md5_number(line)) AS x, count(DISTINCT pack_id) AS packs, count(*) AS samples
      FROM lines GROUP BY 1)""".replace("$low", "18446744073709551615::UHUGEINT")
# What a shard's digest is computed from, found far more cheaply than the digest itself: its plan lines
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
    return _keyed(con)[0]


def _keyed(con) -> tuple[dict[str, tuple[str, int, int]], dict[str, set[str]]]:
    """`digest_keys`, and per planned output shard the catalog folders of the source shards it draws from."""
    try:
        rows = con.execute("SELECT shard, manifest_dir, token_dir FROM catalog_shards").fetchall()
    except duckdb.CatalogException:
        return {}, {}
    folders = {r[0]: r[1:] for r in rows}
    stamps: dict[str, list] = {}
    keys, where = {}, {}
    for name, plan_hash, packs, samples, sources in con.execute(_DIGEST_INPUTS).fetchall():
        for src in sources:
            if src not in stamps:
                dirs = folders.get(src)
                stamps[src] = dirs and [_stamp(f"{d}/{f}") for d, (_, files) in zip(dirs, _CATALOG_FILES)
                                        for f in files]
        key = json.dumps([DIGEST_FORMAT, plan_hash, [[src, stamps[src]] for src in sources]])
        keys[name] = (hashlib.sha256(key.encode()).hexdigest(), packs, samples)
        where[name] = {d for src in sources for d in folders.get(src) or ("?",)}  # "?": no folder known
    return keys, where


def shard_digests(con, record: dict | None = None) -> tuple[dict[str, tuple[str, int, int]], dict[str, str]]:
    """Per planned output shard: (content digest, packs, samples); and the keys of the digests' inputs. A
    digest the writer's ``record`` holds under the same key is taken from it; the others are computed, from
    the catalog files of the source shards they draw from only (an append: one new output shard's few sources
    of all, whose rows the views would read whole: docs/benchmarks.md, issue 41)."""
    keys, where = _keyed(con)
    kept = {}
    if record is not None and record.get("digest_format") == DIGEST_FORMAT:
        recorded, old_keys = record.get("digests") or {}, record.get("digest_keys") or {}
        kept = {n: (recorded[n], packs, samples) for n, (key, packs, samples) in keys.items()
                if n in recorded and old_keys.get(n) == key}
    if not kept:
        digests = {r[0]: (r[1], r[2], r[3]) for r in con.execute(_DIGEST_ROWS).fetchall()}
    else:
        rest = sorted(set(keys) - set(kept))
        only = f"p.{ONLY}"
        members = f"pm JOIN pack_plan p USING (pack_id) WHERE {only}"
        # the other shards' samples left out before the joins, not after them (an append: one shard of all)
        folders = set().union(*(where[n] for n in rest)) if rest else set()
        sql = within(con, _DIGEST_ROWS, None if "?" in folders else folders)
        digests = {r[0]: (r[1], r[2], r[3]) for r in con.execute(
            sql.replace("/*only_members*/", members)
            .replace("/*only_ids*/", f"WHERE sample_id IN (SELECT sample_id FROM pack_members {members})")
            .replace("/*only*/", f"WHERE {only}"), [rest] * 4).fetchall()} if rest else {}
        digests.update(kept)
    return digests, {n: k[0] for n, k in keys.items()}


def _context_digest(context: dict) -> str:
    return hashlib.sha256(json.dumps(context, sort_keys=True, default=str).encode()).hexdigest()


def vouched_shards(work: Path, out_dir: Path, context: dict,
                   digests: dict[str, tuple[str, int, int]]) -> tuple[list[ShardResult], set[str]]:
    """What the writer's record says of the planned output shards on disk that it wrote and that were not
    touched since (size, mtime): written under this context with this content digest, a shard is current
    (vouched: its recorded fingerprint stands); with another digest or context it holds other content
    (refuted: rewritten without the fingerprint query, which hands every sample to Python). An incremental
    plan keeps its old packs, so its old shards are vouched for; a full replan's are refuted."""
    record = load_record(work)
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
            vouched.append(ShardResult(name, True, stamp[0], packs, samples, 0.0, stamp[2]))
        else:
            refuted.add(name)
    return vouched, refuted


def vouchable(record: dict | None, out_dir: Path, names: list[str]) -> bool:
    """Whether the writer's ``record`` could vouch for (or refute) one of these output shards: one whose digest
    it holds is on disk as it left it (`vouched_shards` passes over every other shard)."""
    if record is None or record.get("digest_format") != DIGEST_FORMAT:
        return False
    recorded = record.get("digests") or {}
    return any(_as_left(out_dir, n, record["shards"].get(n)) for n in names if n in recorded)


def record_written(work: Path, key: str, out_dir: Path, results: list[ShardResult], context: dict,
                   digests: dict[str, tuple[str, int, int]], digest_keys: dict[str, str]) -> None:
    """Each output shard's content fingerprint as the writer wrote or found it, with the file's (size,
    mtime_ns) then, so the audit need not compute them again (one query over every sample); the hash of
    the Energon index written with them, whose rows the next run may keep for the shards it does not touch;
    (``context``, ``digests``) what vouched_shards checks on the next write; and ``digest_keys``, under which
    the next write takes a shard's digest from this record instead of computing it."""
    shards = {}
    for r in results:
        st = (out_dir / r.shard).stat()
        shards[r.shard] = [st.st_size, st.st_mtime_ns, r.fingerprint]
    index = out_dir / NV_META / "index.sqlite"
    store.atomic_write_text(work / WRITTEN, json.dumps(
        {"key": key, "shards": shards, "index_sha256": file_sha256(index),
         "context": _context_digest(context), "digest_format": DIGEST_FORMAT,
         "digests": {n: digests[n][0] for n in shards if n in digests},
         "digest_keys": {n: digest_keys[n] for n in shards if n in digest_keys}},
        sort_keys=True))


def load_record(work: Path) -> dict | None:
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
    while the index's hash is the recorded one (reading every tar header back was most of an incremental
    write at 1M samples)."""
    record = load_record(work)
    if not names or record is None or not record.get("index_sha256"):  # a first write or a full rewrite
        return None
    kept = frozenset(n for n in names if _as_left(out_dir, n, record["shards"].get(n)))
    if not kept:
        return None
    return LastIndex(record["index_sha256"], sorted(record["shards"]), kept)  # write_energon_meta numbered the tars so


def written_stamps(work: Path, key: str, out_dir: Path, names: list[str]) -> dict[str, list] | None:
    """[size, mtime_ns, fingerprint] of every planned output shard from the writer's record, or None when the
    record is for another plan, context or source state, or a shard is missing or not as the writer left it."""
    record = load_record(work)
    if record is None or record.get("key") != key:
        return None
    stamps = {name: record["shards"].get(name) for name in names}
    return stamps if all(_as_left(out_dir, n, stamp) for n, stamp in stamps.items()) else None


def left_as_written(work: Path, out_dir: Path) -> Callable[[str], bool]:
    """Whether an output shard (by name) is as this work folder's last write left it (size and mtime in the
    writer's record): what the run's preflight trusts without reading the shard."""
    shards = (load_record(work) or {}).get("shards", {})
    return lambda name: _as_left(out_dir, name, shards.get(name))
