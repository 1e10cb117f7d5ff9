"""audit stage: read the outputs back and prove nothing was lost.

Reads every output shard (not the plan), hashes every media member, and checks it against the plan and
the manifest: every source sample exactly once across packed / dropped / rejected (per shard and in total),
no pack over capacity, no mixed media types, every media byte equal to its source, ``_meta`` consistent.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from .scan import split_key


@dataclass
class AuditResult:
    violations: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, check: str, detail: str, **where) -> None:
        self.violations.append({"check": check, "detail": detail, **where})


def _read_shard(path: Path):
    """Yield (pack key, {part: bytes}) from an output shard, grouped by WebDataset key."""
    with tarfile.open(path, "r:") as tf:
        key, parts = None, {}
        for ti in tf:
            k, part = split_key(ti.name)
            if k != key and parts:
                yield key, parts
                parts = {}
            key = k
            parts[part] = tf.extractfile(ti).read() if ti.isfile() else None
            tf.members.clear()
        if parts:
            yield key, parts


def audit(con: duckdb.DuckDBPyConnection, out_dir: Path, config: dict) -> AuditResult:
    """``config`` is the plan's configuration (max_len and the caps it promised)."""
    res = AuditResult()
    max_len = config["max_len"]
    plan = {
        r[0]: {"media_type": r[1], "sample_ids": list(r[2]), "lens": list(r[3]), "total": r[4], "shard": r[5],
               "overlong": r[6]}
        for r in con.execute(
            "SELECT pack_id, media_type, sample_ids, sample_token_lens, total_token_len, output_shard, overlong FROM pack_plan"
        ).fetchall()
    }
    media_count = dict(con.execute("SELECT sample_id, n_images + n_videos FROM token_lengths WHERE status = 'ok'").fetchall())
    vision = dict(con.execute("SELECT sample_id, vision_tokens FROM token_lengths WHERE status = 'ok'").fetchall())
    lengths = dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths WHERE status = 'ok'").fetchall())
    mtype = dict(con.execute("SELECT sample_id, media_type FROM samples").fetchall())
    sha = {(r[0], r[1]): (r[2], r[3]) for r in con.execute("SELECT sample_id, name, sha256, size FROM members").fetchall()}
    sample_shard = dict(con.execute("SELECT sample_id, shard FROM samples").fetchall())
    dropped = {r[0] for r in con.execute("SELECT sample_id FROM dropped").fetchall()}
    ok_samples = {r[0] for r in con.execute("SELECT sample_id FROM samples WHERE status = 'ok'").fetchall()}

    expected_shards = sorted({p["shard"] for p in plan.values()})
    seen_packs: Counter = Counter()
    seen_samples: Counter = Counter()
    media_checked = media_bytes = 0
    for name in expected_shards:
        path = out_dir / name
        if not path.exists():
            res.add("missing_shard", f"{name} is in the plan but not in {out_dir}", shard=name)
            continue
        try:
            for key, parts in _read_shard(path):
                seen_packs[key] += 1
                if "json" not in parts:
                    res.add("missing_json", f"pack {key} has no json member", shard=name, pack_id=key)
                    continue
                try:
                    doc = json.loads(parts["json"])
                    meta = doc["_meta"]
                except (ValueError, KeyError) as e:
                    res.add("bad_json", f"pack {key}: {e}", shard=name, pack_id=key)
                    continue
                expect = plan.get(key)
                if expect is None:
                    res.add("unknown_pack", f"pack {key} is not in the plan", shard=name, pack_id=key)
                    continue
                if expect["shard"] != name:
                    res.add("wrong_shard", f"pack {key} belongs in {expect['shard']}", shard=name, pack_id=key)
                if (meta.get("sample_ids"), meta.get("sample_token_lens"), meta.get("total_token_len"),
                        meta.get("media_type"), meta.get("pack_id")) != (
                        expect["sample_ids"], expect["lens"], expect["total"], expect["media_type"], key):
                    res.add("meta_mismatch", f"pack {key}: _meta differs from pack_plan", shard=name, pack_id=key)
                if sum(expect["lens"]) != expect["total"]:
                    res.add("meta_mismatch", f"pack {key}: lengths do not add up to {expect['total']}", pack_id=key)
                padded = -(-expect["total"] // config.get("pad_multiple", 1)) * config.get("pad_multiple", 1)
                if padded > max_len and not (expect["overlong"] and len(expect["sample_ids"]) == 1):
                    res.add("over_capacity", f"pack {key}: {padded} tokens (padded) > {max_len}", pack_id=key)
                for cap, value, what in (
                    ("max_samples_per_pack", len(expect["sample_ids"]), "samples"),
                    ("max_media_per_pack", sum(media_count.get(s, 0) for s in expect["sample_ids"]), "media items"),
                    ("max_vision_tokens_per_pack", sum(vision.get(s, 0) for s in expect["sample_ids"]), "vision tokens"),
                ):
                    if config.get(cap) and value > config[cap]:
                        res.add("over_cap", f"pack {key}: {value} {what} > {cap} {config[cap]}", pack_id=key)
                for sid, n in zip(expect["sample_ids"], expect["lens"]):
                    seen_samples[sid] += 1
                    if lengths.get(sid) != n:
                        res.add("length_mismatch", f"{sid}: plan {n}, token_lengths {lengths.get(sid)}", pack_id=key)
                    if mtype.get(sid) != expect["media_type"]:
                        res.add("mixed_media", f"{sid} is {mtype.get(sid)} in a {expect['media_type']} pack", pack_id=key)
                expected_media = set()
                for src in meta.get("sources", []):
                    for m in src.get("media", []):
                        out_name = m["output_name"]
                        expected_media.add(out_name.split(".", 1)[1])
                        data = parts.get(out_name.split(".", 1)[1])
                        if data is None:
                            res.add("missing_media", f"{out_name} is named in _meta but absent", shard=name, pack_id=key)
                            continue
                        source_sha, source_size = sha.get((src["sample_id"], m["name"]), (None, None))
                        digest = hashlib.sha256(data).hexdigest()
                        media_checked += 1
                        media_bytes += len(data)
                        if source_sha is None:
                            res.add("unknown_media", f"{m['name']} of {src['sample_id']} not in members", pack_id=key)
                        elif digest != source_sha or len(data) != source_size:
                            res.add("media_hash_mismatch", f"{out_name}: sha256 differs from source {m['name']}",
                                    shard=name, pack_id=key)
                        if m.get("sha256") and m["sha256"] != digest:
                            res.add("meta_hash_mismatch", f"{out_name}: sha256 differs from _meta", pack_id=key)
                extra = set(parts) - expected_media - {"json"}
                if extra:
                    res.add("extra_member", f"pack {key} has members not in _meta: {sorted(extra)[:5]}", pack_id=key)
        except (tarfile.TarError, OSError) as e:
            res.add("unreadable_shard", f"{name}: {e}", shard=name)
    for p, n in seen_packs.items():
        if n > 1:
            res.add("duplicate_pack", f"pack {p} appears {n} times", pack_id=p)
    missing_packs = set(plan) - set(seen_packs)
    for p in sorted(missing_packs)[:100]:
        res.add("missing_pack", f"pack {p} of {plan[p]['shard']} not found", pack_id=p)
    for sid, n in seen_samples.items():
        if n > 1:
            res.add("duplicate_sample", f"{sid} is in {n} packs", sample_id=sid)
    packed = set(seen_samples)
    for sid in sorted(ok_samples - packed - dropped)[:100]:
        res.add("lost_sample", f"{sid} is ok but neither packed nor dropped", sample_id=sid)
    for sid in sorted(packed & dropped)[:100]:
        res.add("packed_and_dropped", f"{sid} is both packed and dropped", sample_id=sid)

    per_shard = defaultdict(lambda: Counter())
    for sid, shard in sample_shard.items():
        c = per_shard[shard]
        c["read"] += 1
        if sid in packed:
            c["packed"] += 1
        elif sid in dropped:
            c["dropped"] += 1
        elif sid not in ok_samples:
            c["rejected"] += 1
    for shard, c in per_shard.items():
        if c["read"] != c["packed"] + c["dropped"] + c["rejected"]:
            res.add("count_mismatch", f"{shard}: read {c['read']} != packed {c['packed']} + dropped {c['dropped']} "
                    f"+ rejected {c['rejected']}", shard=shard)
    totals = Counter()
    for c in per_shard.values():
        totals.update(c)
    res.stats = {
        "samples_read": totals["read"],
        "packed": totals["packed"],
        "dropped": totals["dropped"],
        "rejected": totals["rejected"],
        "packs_in_plan": len(plan),
        "packs_read": sum(seen_packs.values()),
        "output_shards": len(expected_shards),
        "media_members_checked": media_checked,
        "media_bytes_checked": media_bytes,
        "violations": len(res.violations),
        "per_shard": {k: dict(v) for k, v in sorted(per_shard.items())},
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
