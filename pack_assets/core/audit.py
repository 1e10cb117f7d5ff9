"""audit stage: read the outputs back and prove nothing was lost.

Reads every output shard (not the plan), hashes every media member, and checks it against the plan and
the manifest: every source sample exactly once across packed / dropped / rejected (per shard and in total),
no pack over capacity, no mixed media types, every media (and extra member) byte equal to its source,
``_meta`` consistent, and every packed conversation equal to the current manifest's (nothing stale).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tarfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from . import store
from .tario import iter_pack_parts

# Below this much output a second process costs more (spawn + imports, ~2 s) than it saves.
PARALLEL_MIN_BYTES = 512 << 20


@dataclass
class AuditResult:
    violations: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)  # registered shards the plan could not count yet

    @property
    def ok(self) -> bool:
        """No violation in what was read (says nothing of shards still waiting: see ``verdict``)."""
        return not self.violations

    @property
    def verdict(self) -> str:
        """PASS, FAIL (a violation) or INCOMPLETE (no violation, but shards wait outside the plan)."""
        return "FAIL" if self.violations else "INCOMPLETE" if self.waiting else "PASS"

    def add(self, check: str, detail: str, **where) -> None:
        self.violations.append({"check": check, "detail": detail, **where})


def _shard_expectations(con, name: str):
    """The plan rows of one output shard and what the manifest says about their samples and members."""
    plan = {
        r[0]: {"media_type": r[1], "sample_ids": list(r[2]), "lens": list(r[3]), "total": r[4], "overlong": r[5]}
        for r in con.execute("SELECT pack_id, media_type, sample_ids, sample_token_lens, total_token_len, overlong "
                             "FROM pack_plan WHERE output_shard = ?", [name]).fetchall()
    }
    samples = {r[0]: r[1:] for r in con.execute(
        """SELECT s.sample_id, t.total_tokens, s.media_type, t.n_images + t.n_videos, t.vision_tokens,
                  s.json_member, s.conversation, s.media_members, s.extra_members
           FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN samples s USING (sample_id)
           LEFT JOIN token_lengths t USING (sample_id) WHERE p.output_shard = ?""", [name]).fetchall()}
    members = {(r[0], r[1]): (r[2], r[3]) for r in con.execute(
        """SELECT m.sample_id, m.name, m.sha256, m.size FROM pack_plan p JOIN pack_members pm USING (pack_id)
           JOIN members m USING (sample_id) WHERE p.output_shard = ?""", [name]).fetchall()}
    return plan, samples, members


def _check_current(res: AuditResult, name: str, key: str, doc: dict, meta: dict, samples: dict,
                   members: dict) -> None:
    """Each packed sub-sample against the current manifest: its record member (sha256), normalized
    conversation and member lists; an output older than its source fails here even when the bytes it
    copied are intact."""
    packed = {s.get("sample_id"): s for s in doc.get("samples", []) if isinstance(s, dict)}
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
        elif packed.get(sid, {}).get("messages") != json.loads(conversation or "null"):
            res.add("stale_conversation", f"{sid}: the packed messages differ from the manifest's conversation",
                    shard=name, pack_id=key, sample_id=sid)
        for kind, current in (("media", media_names), ("extra", extra_names)):
            if [m.get("name") for m in src.get(kind, [])] != list(current or []):
                res.add(f"stale_{kind}", f"{sid}: packed {kind} members {[m.get('name') for m in src.get(kind, [])][:5]}"
                        f" are not the current {list(current or [])[:5]}", shard=name, pack_id=key, sample_id=sid)


def _check_pack(res: AuditResult, name: str, key: str, parts: dict, expect: dict | None, samples: dict,
                members: dict, config: dict) -> Counter:
    """One pack read back against its plan row; returns the media and extra members checked and their bytes."""
    max_len, pad = config["max_len"], config.get("pad_multiple", 1)
    counts: Counter = Counter()
    if "json" not in parts:
        res.add("missing_json", f"pack {key} has no json member", shard=name, pack_id=key)
        return counts
    try:
        doc = json.loads(parts["json"])
        meta = doc["_meta"]
    except (ValueError, KeyError, TypeError) as e:
        res.add("bad_json", f"pack {key}: {e}", shard=name, pack_id=key)
        return counts
    if expect is None:
        res.add("unknown_pack", f"pack {key} is not planned for {name}", shard=name, pack_id=key)
        return counts
    if (meta.get("sample_ids"), meta.get("sample_token_lens"), meta.get("total_token_len"), meta.get("media_type"),
            meta.get("pack_id")) != (expect["sample_ids"], expect["lens"], expect["total"], expect["media_type"], key):
        res.add("meta_mismatch", f"pack {key}: _meta differs from pack_plan", shard=name, pack_id=key)
    if sum(expect["lens"]) != expect["total"]:
        res.add("meta_mismatch", f"pack {key}: lengths do not add up to {expect['total']}", pack_id=key)
    padded = -(-expect["total"] // pad) * pad
    if padded > max_len and not (expect["overlong"] and len(expect["sample_ids"]) == 1):
        res.add("over_capacity", f"pack {key}: {padded} tokens (padded) > {max_len}", pack_id=key)
    rows = [samples.get(sid, (None, None, 0, 0)) for sid in expect["sample_ids"]]
    for cap, value, what in (("max_samples_per_pack", len(rows), "samples"),
                             ("max_media_per_pack", sum(r[2] or 0 for r in rows), "media items"),
                             ("max_vision_tokens_per_pack", sum(r[3] or 0 for r in rows), "vision tokens")):
        if config.get(cap) and value > config[cap]:
            res.add("over_cap", f"pack {key}: {value} {what} > {cap} {config[cap]}", pack_id=key)
    for sid, n, row in zip(expect["sample_ids"], expect["lens"], rows):
        if row[0] != n:
            res.add("length_mismatch", f"{sid}: plan {n}, token_lengths {row[0]}", pack_id=key)
        if row[1] != expect["media_type"]:
            res.add("mixed_media", f"{sid} is {row[1]} in a {expect['media_type']} pack", pack_id=key)
    _check_current(res, name, key, doc, meta, samples, members)
    expected_media = set()
    for src in meta.get("sources", []):
        # extra members (neither record nor media) are source bytes too: hashed and counted alike
        for kind, m in [("media", m) for m in src.get("media", [])] + [("extra", m) for m in src.get("extra", [])]:
            part = m["output_name"].split(".", 1)[1]
            expected_media.add(part)
            data = parts.get(part)
            if data is None:
                res.add("missing_media", f"{m['output_name']} is named in _meta but absent", shard=name, pack_id=key)
                continue
            source_sha, source_size = members.get((src["sample_id"], m["name"]), (None, None))
            digest = hashlib.sha256(data).hexdigest()
            counts[kind] += 1
            counts[f"{kind}_bytes"] += len(data)
            if source_size is None:
                res.add("unknown_media", f"{m['name']} of {src['sample_id']} not in members", pack_id=key)
            elif (source_sha is not None and digest != source_sha) or len(data) != source_size:
                res.add("media_hash_mismatch", f"{m['output_name']}: bytes differ from source {m['name']}",
                        shard=name, pack_id=key)
            if m.get("sha256") and m["sha256"] != digest:
                res.add("meta_hash_mismatch", f"{m['output_name']}: sha256 differs from _meta", pack_id=key)
    extra = set(parts) - expected_media - {"json"}
    if extra:
        res.add("extra_member", f"pack {key} has members not in _meta: {sorted(extra)[:5]}", pack_id=key)
    return counts


def _audit_shard(con, out_dir: Path, name: str, config: dict) -> tuple[list[dict], Counter, Counter]:
    """One output shard read back: its violations, the pack keys seen, media/extra members and bytes checked."""
    res, seen, counts = AuditResult(), Counter(), Counter()
    path = out_dir / name
    if not path.exists():
        res.add("missing_shard", f"{name} is in the plan but not in {out_dir}", shard=name)
        return res.violations, seen, counts
    plan, samples, members = _shard_expectations(con, name)
    try:
        for key, parts in iter_pack_parts(path):
            seen[key] += 1
            counts.update(_check_pack(res, name, key, parts, plan.get(key), samples, members, config))
    except (tarfile.TarError, OSError) as e:
        res.add("unreadable_shard", f"{name}: {e}", shard=name)
    return res.violations, seen, counts


_worker_con: duckdb.DuckDBPyConnection | None = None


def _worker_init(work: str) -> None:
    global _worker_con
    _worker_con = store.connect(Path(work), read_only=True)


def _audit_shard_in_worker(out_dir: str, name: str, config: dict):
    return _audit_shard(_worker_con, Path(out_dir), name, config)


def _shard_results(con, out_dir: Path, shards: list[str], config: dict, work: Path | None, workers: int,
                   min_bytes: int):
    """Per-shard audit results in shard order; output shards are independent, so several processes (each
    with its own read-only DuckDB connection) share them when there is enough to read."""
    total = sum((out_dir / n).stat().st_size for n in shards if (out_dir / n).exists())
    workers = min(workers or os.cpu_count() or 1, len(shards))
    if work is None or workers <= 1 or total < min_bytes:
        yield from (_audit_shard(con, out_dir, n, config) for n in shards)
        return
    # spawn, not fork: a forked child would inherit DuckDB's cached instance of this database without its threads
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                             initargs=(str(work),)) as pool:
        yield from pool.map(_audit_shard_in_worker, [str(out_dir)] * len(shards), shards, [config] * len(shards))


def audit(con: duckdb.DuckDBPyConnection, out_dir: Path, config: dict, work: Path | None = None, workers: int = 0,
          min_bytes: int = PARALLEL_MIN_BYTES, trusted: frozenset[str] = frozenset()) -> AuditResult:
    """Read every output shard back, one at a time per process (memory follows the output shard, not the
    dataset), and check it against the plan and the manifest; the plan's own invariants are checked in SQL.
    Given the work directory, output shards are read by ``workers`` processes (0: one per core) once there
    are ``min_bytes`` of them. ``trusted`` shards (unchanged since a clean audit) are not read: their
    planned packs count as seen."""
    res = check_plan(con, config)
    shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
    seen: Counter = Counter()
    if trusted:
        seen.update(p for p, shard in con.execute("SELECT pack_id, output_shard FROM pack_plan").fetchall()
                    if shard in trusted)
    to_read = [n for n in shards if n not in trusted]
    counts: Counter = Counter()
    for violations, shard_seen, c in _shard_results(con, out_dir, to_read, config, work, workers, min_bytes):
        res.violations.extend(violations)
        seen.update(shard_seen)
        counts.update(c)
    for p, n in sorted(seen.items()):
        if n > 1:
            res.add("duplicate_pack", f"pack {p} appears {n} times", pack_id=p)
            res.add("duplicate_sample", f"the samples of pack {p} appear {n} times", pack_id=p)
    con.execute("CREATE OR REPLACE TEMP TABLE audit_seen (pack_id VARCHAR)")
    con.executemany("INSERT INTO audit_seen VALUES (?)", [(p,) for p in seen]) if seen else None
    missing = con.execute("SELECT pack_id, output_shard FROM pack_plan WHERE pack_id NOT IN (SELECT pack_id FROM audit_seen) "
                          "ORDER BY pack_id").fetchall()
    for p, shard in missing[:100]:
        res.add("missing_pack", f"pack {p} of {shard} not found", pack_id=p)
    lost = con.execute("SELECT count(*) FROM pack_members WHERE pack_id NOT IN (SELECT pack_id FROM audit_seen)").fetchone()[0]
    if lost:
        res.add("lost_sample", f"{lost} planned sample(s) are in packs missing from the output")
    # per source shard, from what was read back: every sample read is packed, dropped or rejected
    per_shard = {r[0]: {"read": r[1], "packed": r[2], "dropped": r[3], "rejected": r[4]} for r in con.execute(
        """SELECT s.shard, count(*),
                  count(*) FILTER (WHERE pm.sample_id IS NOT NULL AND pm.pack_id IN (SELECT pack_id FROM audit_seen)),
                  count(*) FILTER (WHERE d.sample_id IS NOT NULL),
                  count(*) FILTER (WHERE s.status = 'rejected')
           FROM samples s LEFT JOIN pack_members pm USING (sample_id) LEFT JOIN dropped d USING (sample_id)
           GROUP BY 1 ORDER BY 1""").fetchall()}
    for shard, c in per_shard.items():
        if c["read"] != c["packed"] + c["dropped"] + c["rejected"]:
            res.add("count_mismatch", f"{shard}: read {c['read']} != packed {c['packed']} + dropped {c['dropped']} "
                    f"+ rejected {c['rejected']}", shard=shard)
    total = {k: sum(c[k] for c in per_shard.values()) for k in ("read", "packed", "dropped", "rejected")}
    res.stats = {
        "samples_read": total["read"],
        "packed": total["packed"],
        "dropped": total["dropped"],
        "rejected": total["rejected"],
        "packs_in_plan": con.execute("SELECT count(*) FROM pack_plan").fetchone()[0],
        "packs_read": sum(seen.values()),
        "output_shards": len(shards),
        "output_shards_trusted": len(shards) - len(to_read),
        "media_members_checked": counts["media"],
        "media_bytes_checked": counts["media_bytes"],
        "extra_members_checked": counts["extra"],
        "extra_bytes_checked": counts["extra_bytes"],
        "violations": len(res.violations),
        "per_shard": per_shard,
    }
    return res


def check_plan(con: duckdb.DuckDBPyConnection, config: dict) -> AuditResult:
    """Invariants of the plan itself, before anything is written: every ok sample in exactly one pack or
    in ``dropped``, one media type per pack, capacity (after padding) and caps held."""
    res = AuditResult()
    pad = config.get("pad_multiple", 1)
    rows = con.execute(
        """SELECT
             (SELECT count(*) FROM samples WHERE status = 'ok'),
             (SELECT count(*) FROM pack_members),
             (SELECT count(DISTINCT sample_id) FROM pack_members),
             (SELECT count(*) FROM dropped),
             (SELECT count(*) FROM (SELECT sample_id FROM pack_members INTERSECT SELECT sample_id FROM dropped)),
             (SELECT count(*) FROM samples s WHERE status = 'ok' AND sample_id NOT IN (SELECT sample_id FROM pack_members)
                AND sample_id NOT IN (SELECT sample_id FROM dropped)),
             (SELECT count(*) FROM pack_plan WHERE ceil(total_token_len / ?) * ? > ? AND NOT (overlong AND len(sample_ids) = 1)),
             (SELECT count(*) FROM (SELECT pm.pack_id FROM pack_members pm JOIN samples s USING (sample_id)
                GROUP BY pm.pack_id HAVING count(DISTINCT s.media_type) > 1))""",
        [pad, pad, config["max_len"]],
    ).fetchone()
    ok, members, distinct, dropped, both, lost, over, mixed = rows
    if members != distinct:
        res.add("duplicate_sample", f"{members - distinct} sample(s) in more than one pack")
    if both:
        res.add("packed_and_dropped", f"{both} sample(s) both packed and dropped")
    if lost:
        res.add("lost_sample", f"{lost} ok sample(s) neither packed nor dropped")
    if over:
        res.add("over_capacity", f"{over} pack(s) over {config['max_len']} tokens")
    if mixed:
        res.add("mixed_media", f"{mixed} pack(s) mix media types")
    cap = config.get("max_samples_per_pack") or 0
    if cap and con.execute("SELECT count(*) FROM pack_plan WHERE len(sample_ids) > ?", [cap]).fetchone()[0]:
        res.add("over_cap", f"packs over {cap} samples")
    res.stats = {"ok_samples": ok, "packed": distinct, "dropped": dropped}
    return res
