"""The five stages as functions of paths and plain settings: what the Dagster assets and the CLI call.

tar -> manifest rows -> token lengths -> plan -> packed shards -> audit. Each function reads only what the
stage before it wrote and returns a summary dict (counts, paths, timings) for metadata and printing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import __version__
from . import owned, safety, store
from .audit import PARALLEL_MIN_BYTES, AuditResult, audit, check_plan
from .lookup import LINEAGE_VIEW
from .binpack import lower_bounds
from .plan import Pack, PlanConfig, config_fingerprint, extend_plan, make_plan, plan_jsonl, prune_plan, simulate
from .profiles import ModelProfile
from .records import MANIFEST_FORMAT, ShardInfo
from .scan import ScanOptions, scan_shard
from .tario import first_pack_meta
from .tokens import TokenCounter, count_shard_rows
from .write import PackJob, ShardFingerprint, ShardJob, SubSample, write_all


def _manifest_summary(info: dict, cached: bool) -> dict:
    return {"shard": info["shard"], "status": info["status"], "samples": info["n_samples"], "ok": info["n_ok"],
            "rejected": info["n_rejected"], "members": info["n_members"], "bytes": info["size"],
            "seconds": round(info["seconds"], 3), "cached": cached}


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


def run_manifest(input_root: Path, work: Path, shard: str, options: ScanOptions = ScanOptions(), force: bool = False) -> dict:
    """Scan one shard into ``<work>/manifest/<shard>/``; an unchanged shard (size, mtime) is not rescanned."""
    with store.shard_lock(work, shard):  # a concurrent run of this shard finishes first; then it is current
        return _run_manifest(input_root, work, shard, options, force)


def _run_manifest(input_root: Path, work: Path, shard: str, options: ScanOptions, force: bool) -> dict:
    current = None if force else manifest_is_current(input_root, work, shard)
    if current is not None:
        return _manifest_summary(current, cached=True)
    path = input_root / f"{shard}.tar"
    info = ShardInfo(shard=shard, path=str(path), size=0, mtime_ns=0)
    store.write_manifest(work, shard, scan_shard(path, shard, options, info), info)
    return _manifest_summary(dataclasses.asdict(info), cached=False)


def _token_stamp(work: Path, shard: str, profile: ModelProfile) -> str:
    info = store.read_shard_info(work, shard) or {}
    return json.dumps({"profile": profile.fingerprint, "size": info.get("size"), "mtime_ns": info.get("mtime_ns")})


def token_lengths_are_current(work: Path, shard: str, profile: ModelProfile) -> bool:
    stamp = store.token_dir(work, profile.name, shard) / "stamp.json"
    return stamp.exists() and stamp.read_text() == _token_stamp(work, shard, profile)


def run_token_lengths(work: Path, shard: str, profile: ModelProfile, force: bool = False) -> dict:
    """Count one shard for the profile; counts made from the same manifest and profile are kept."""
    with store.shard_lock(work, shard):  # the manifest read here and the stamp written last stay paired
        return _run_token_lengths(work, shard, profile, force)


def _run_token_lengths(work: Path, shard: str, profile: ModelProfile, force: bool) -> dict:
    t0 = time.perf_counter()
    tdir = store.token_dir(work, profile.name, shard)
    if not force and token_lengths_are_current(work, shard, profile):
        t = pq.read_table(tdir / "token_lengths.parquet", columns=["status", "total_tokens"]).to_pylist()
        ok = [r for r in t if r["status"] == "ok"]
        return {"shard": shard, "profile": profile.name, "counted": len(ok), "rejected": len(t) - len(ok),
                "total_tokens": int(sum(r["total_tokens"] for r in ok)), "seconds": 0.0, "samples_per_second": None,
                "cached": True}
    mdir = store.manifest_dir(work, shard)
    if not (mdir / "samples.parquet").exists():
        raise FileNotFoundError(f"no manifest for shard {shard!r} under {mdir}: materialize `manifest` first")
    samples = pq.read_table(mdir / "samples.parquet").to_pylist()
    members = pq.read_table(mdir / "members.parquet", columns=["sample_id", "name", "size"]).to_pylist()
    media_names = {s["sample_id"]: set(s["media_members"] or []) for s in samples}
    media_bytes: dict[str, int] = {}
    for m in members:
        if m["name"] in media_names.get(m["sample_id"], ()):
            media_bytes[m["sample_id"]] = media_bytes.get(m["sample_id"], 0) + m["size"]
    rows, rejections = count_shard_rows(TokenCounter(profile), samples, media_bytes)
    store.write_token_lengths(work, profile.name, shard, rows, rejections)
    store.atomic_write_text(tdir / "stamp.json", _token_stamp(work, shard, profile))
    ok = [r for r in rows if r["status"] == "ok"]
    seconds = time.perf_counter() - t0
    return {"shard": shard, "profile": profile.name, "counted": len(ok), "rejected": len(rejections),
            "total_tokens": int(sum(r["total_tokens"] for r in ok)), "seconds": round(seconds, 3),
            "samples_per_second": round(len(rows) / seconds, 1) if seconds else None, "cached": False}


def _previous_plan(con, config: PlanConfig, profile: ModelProfile, current: dict[str, int]):
    """The previous plan's packs, drops and fingerprint when an incremental plan may keep them, else
    (None, why not)."""
    # fetchall, not fetchone: a result left unfinished makes DuckDB refuse the register() of run_plan
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'plan_info'").fetchall()[0][0]:
        return None, "full plan: no previous plan"
    info = plan_info(con)
    if PlanConfig(**info["config"]).packing_key() != config.packing_key():
        return None, "full plan: packing settings changed since the previous plan"
    if info["profile_fingerprint"] != profile.fingerprint:
        return None, "full plan: the model profile changed since the previous plan"
    rows = con.execute("SELECT pack_id, media_type, sample_ids, sample_token_lens, total_token_len, output_shard, overlong "
                       "FROM pack_plan ORDER BY pack_id").fetchall()
    packs = [Pack(r[0], r[1], list(r[2]), list(r[3]), r[4], r[5], overlong=r[6]) for r in rows]
    dropped = [{"sample_id": r[0], "total_tokens": r[1], "reason": r[2]}
               for r in con.execute("SELECT sample_id, total_tokens, reason FROM dropped ORDER BY sample_id").fetchall()]
    packs, dropped, pruned = prune_plan(packs, dropped, current)
    fp = info["fingerprint"]
    why = f"incremental: kept {len(packs)} packs"
    if pruned["packs_changed"] or pruned["samples_gone"] or pruned["samples_recounted"]:
        h = hashlib.sha256(fp.encode())  # the kept part differs from the previous plan: so does its fingerprint
        for p in packs:
            h.update(f"{p.pack_id}|{','.join(p.sample_ids)}\n".encode())
        for d in dropped:
            h.update(f"{d['sample_id']}\n".encode())
        fp = h.hexdigest()[:16]
        why += (f", removed {pruned['samples_gone']} gone and {pruned['samples_recounted']} recounted sample(s) "
                f"from {pruned['packs_changed']} pack(s) ({pruned['packs_emptied']} left empty and removed); "
                "recounted samples are planned again as new")
    return (packs, dropped, fp, pruned), why


def run_plan(work: Path, shards: list[str], config: PlanConfig, profile: ModelProfile, allow_missing: bool = False,
             input_root: Path | None = None) -> dict:
    """Plan every given shard; with ``allow_missing``, plan the shards that have counts and report the
    others as waiting (a failed or unfinished shard does not stall the plan of the rest). Given the input
    root, a shard whose tar is gone is removed from the plan (``shards_removed``), and one whose tar changed
    since its scan waits for its rescan (its old counts are stale)."""
    removed: list[str] = []
    if input_root is not None:
        removed = [s for s in shards if not (input_root / f"{s}.tar").is_file()]
        shards = [s for s in shards if s not in set(removed)]
    missing = [s for s in shards if not token_lengths_are_current(work, s, profile)
               or (input_root is not None and manifest_is_current(input_root, work, s) is None)]
    if missing and not allow_missing:
        raise FileNotFoundError(f"{len(missing)} shard(s) have no current token_lengths for profile {profile.name}: "
                                f"{missing[:5]}")
    shards = [s for s in shards if s not in set(missing)]
    if not shards:
        raise FileNotFoundError("no shard has token lengths yet: materialize manifest and token_lengths first")
    work.mkdir(parents=True, exist_ok=True)
    with store.connect(work) as con:
        store.build_catalog(con, work, shards, profile.name)
        t = con.sql(
            "SELECT sample_id, media_type, total_tokens, media_bytes, n_images + n_videos AS n_media, vision_tokens "
            "FROM token_lengths WHERE status = 'ok' ORDER BY sample_id"
        ).to_arrow_table()
        col = lambda name: t.column(name).to_numpy(zero_copy_only=False)  # noqa: E731
        ids, mts, lengths = t.column("sample_id").to_pylist(), t.column("media_type").to_pylist(), col("total_tokens")
        previous, why = _previous_plan(con, config, profile, dict(zip(ids, lengths.tolist()))) if config.incremental \
            else (None, "full plan")
        if previous is None:
            plan = make_plan(ids, mts, lengths, col("media_bytes"), config, profile.name, n_media=col("n_media"),
                             vision_tokens=col("vision_tokens"))
        else:
            old_packs, old_dropped, old_fp, pruned = previous
            planned = {sid for p in old_packs for sid in p.sample_ids} | {d["sample_id"] for d in old_dropped}
            new = np.asarray([sid not in planned for sid in ids], dtype=bool)
            pick = lambda a: np.asarray(a)[new]  # noqa: E731
            fresh = make_plan([i for i, n in zip(ids, new) if n], [m for m, n in zip(mts, new) if n], pick(lengths),
                              pick(col("media_bytes")), config, profile.name, n_media=pick(col("n_media")),
                              vision_tokens=pick(col("vision_tokens")))
            plan = extend_plan(old_packs, old_dropped, fresh, config, old_fp)
            plan.stats.update(pruned)
            kept = np.asarray([sid not in {d["sample_id"] for d in plan.dropped} for sid in ids], dtype=bool)
            bound = sum(lower_bounds(lengths[kept & (np.asarray(mts, dtype=object) == mt)], config.capacity)[1]
                        for mt in set(mts))
            plan.stats.update(lower_bound=bound, packs_over_bound=plan.stats["packs"] - bound)
        plan.stats["planning"] = why
        plan.stats["shards_planned"] = len(shards)
        plan.stats["shards_waiting"] = missing
        plan.stats["shards_removed"] = removed
        sweep = simulate(lengths, sorted({config.max_len // 4, config.max_len // 2, config.max_len, config.max_len * 2}),
                         sorted({config.algorithm, "bfd", "next_fit"}), config.caps, seed=config.seed)
        mtypes = np.asarray(t.column("media_type").to_pylist(), dtype=object)
        from .report import plot_simulation

        sweep["plots"] = plot_simulation(lengths, sweep, work / "plots",
                                         {mt: lengths[mtypes == mt] for mt in sorted(set(mtypes.tolist()))})
        store.atomic_write_text(work / "pack_plan.jsonl", plan_jsonl(plan))
        new_packs = pa.Table.from_pylist(
            [{"pack_id": p.pack_id, "media_type": p.media_type, "sample_ids": p.sample_ids,
              "sample_token_lens": p.sample_token_lens, "total_token_len": p.total_token_len,
              "output_shard": p.output_shard, "overlong": p.overlong} for p in plan.packs],
            schema=pa.schema([("pack_id", pa.string()), ("media_type", pa.string()), ("sample_ids", pa.list_(pa.string())),
                              ("sample_token_lens", pa.list_(pa.int64())), ("total_token_len", pa.int64()),
                              ("output_shard", pa.string()), ("overlong", pa.bool_())]),
        )
        new_dropped = pa.Table.from_pylist(plan.dropped, schema=pa.schema(
            [("sample_id", pa.string()), ("total_tokens", pa.int64()), ("reason", pa.string())]))
        meta = {"fingerprint": plan.fingerprint, "profile": profile.name, "profile_fingerprint": profile.fingerprint,
                "model_dir": profile.model_dir,
                "shards": shards, "config": config.__dict__, "stats": plan.stats, "simulation": sweep}
        # registered under names no table uses (store.connect turns Python replacement scans off)
        con.register("_new_pack_plan", new_packs)
        con.register("_new_dropped", new_dropped)
        try:
            con.execute("BEGIN")
            con.execute("CREATE OR REPLACE TABLE pack_plan AS SELECT * FROM _new_pack_plan")
            con.execute(
                "CREATE OR REPLACE TABLE pack_members AS SELECT pack_id, CAST(i AS INTEGER) - 1 AS position, "
                "sample_ids[i] AS sample_id FROM pack_plan, range(1, len(sample_ids) + 1) AS r(i)"
            )
            con.execute("CREATE OR REPLACE TABLE dropped AS SELECT * FROM _new_dropped")
            con.execute("CREATE OR REPLACE TABLE plan_info AS SELECT ? AS info", [json.dumps(meta)])
            con.execute(LINEAGE_VIEW)
            con.execute("COMMIT")
        finally:
            con.unregister("_new_pack_plan")
            con.unregister("_new_dropped")
        check = check_plan(con, meta["config"])
    return {**plan.stats, "fingerprint": plan.fingerprint, "plan_file": str(work / "pack_plan.jsonl"), "simulation": sweep,
            "plan_violations": check.violations}


def recount(con, info: dict, result: AuditResult, fraction: float) -> None:
    """Count again, from the manifest rows, the samples whose id hashes below ``fraction``."""
    if fraction <= 0:
        return
    from .profiles import ProfileError, resolve_profile

    try:
        profile = resolve_profile(info["profile"].split("@")[0], info.get("model_dir") or None)
    except ProfileError as e:
        result.add("recount_unavailable", str(e))
        return
    if profile.fingerprint != info["profile_fingerprint"]:
        result.add("profile_changed", f"profile {profile.name} files changed since the plan: recount the shards")
        return
    threshold = int(fraction * 2**32)
    rows = con.execute(
        "SELECT s.sample_id, s.conversation, s.image_sizes, s.videos, t.total_tokens FROM samples s "
        "JOIN token_lengths t USING (sample_id) WHERE t.status = 'ok' AND (hash(s.sample_id) % 4294967296) < ?",
        [threshold],
    ).fetchall()
    counts = TokenCounter(profile).count_many(
        (json.loads(r[1]), r[2] or [], json.loads(r[3] or "[]")) for r in rows)
    bad = 0
    for r, c in zip(rows, counts):
        got = None if isinstance(c, Exception) else c["total_tokens"]
        if got != r[4]:
            bad += 1
            if bad <= 100:
                result.add("recount_mismatch", f"{r[0]}: stored {r[4]} tokens, recounted {got}", sample_id=r[0])
    result.stats["recounted"] = len(rows)
    result.stats["recount_fraction"] = fraction


def plan_info(con) -> dict:
    return json.loads(con.execute("SELECT info FROM plan_info").fetchall()[0][0])


def shard_job(con, input_root: Path, name: str) -> ShardJob:
    """Everything the writer needs for one output shard, from the plan and the manifest (one shard at a
    time, so memory follows the output shard size, not the dataset)."""
    subs_rows = con.execute(
        """SELECT pm.pack_id, s.sample_id, s.shard, s.key, s.json_member, s.media_members, s.conversation, t.total_tokens,
                  s.extra_members, sha256(s.conversation), sh.size || ':' || sh.mtime_ns
           FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN samples s USING (sample_id)
           JOIN token_lengths t USING (sample_id) LEFT JOIN shards sh ON sh.shard = s.shard
           WHERE p.output_shard = ? ORDER BY pm.pack_id, pm.position""", [name]).fetchall()
    member_rows = con.execute(
        """SELECT m.sample_id, m.name, m."offset", m.size, m.sha256 FROM pack_plan p JOIN pack_members pm USING (pack_id)
           JOIN members m USING (sample_id) WHERE p.output_shard = ?""", [name]).fetchall()
    members = {(r[0], r[1]): {"name": r[1], "offset": r[2], "size": r[3], "sha256": r[4]} for r in member_rows}
    subs: dict[str, list[SubSample]] = {}
    for pack_id, sid, shard, key, json_member, media_members, conv, tokens, extra_members, conv_sha, stamp in subs_rows:
        subs.setdefault(pack_id, []).append(SubSample(
            sample_id=sid, shard=shard, key=key, source_path=str(input_root / f"{shard}.tar"), token_len=tokens,
            messages=json.loads(conv), json_member=members.get((sid, json_member)) if json_member else None,
            media=[members[(sid, n)] for n in media_members or []],
            extra=[members[(sid, n)] for n in extra_members or []], conversation_sha256=conv_sha, source_stamp=stamp,
        ))
    packs = con.execute("SELECT pack_id, media_type, total_token_len FROM pack_plan WHERE output_shard = ? ORDER BY pack_id",
                        [name]).fetchall()
    return ShardJob(name, [PackJob(pack_id, mt, total, subs[pack_id]) for pack_id, mt, total in packs])


def write_context(info: dict) -> dict:
    """What every output shard's `_meta` carries besides its packs."""
    return {"profile": info["profile"], "profile_fingerprint": info["profile_fingerprint"],
            "config_fingerprint": config_fingerprint(info["config"], info["profile_fingerprint"]),
            "max_len": info["config"]["max_len"],
            "tool": "pack_assets", "tool_version": __version__}


def current_shards(con, out_dir: Path, context: dict) -> list[dict]:
    """The output shards already on disk with exactly the planned content (their first pack's
    ``shard_fingerprint``), found with one query over all shards instead of loading each shard's job."""
    on_disk = {p.name for p in out_dir.glob("*.tar")} if out_dir.is_dir() else set()
    if not on_disk:
        return []
    # members as the structs shard_job builds, so both sides feed ShardFingerprint the same values
    member = """{'name': m.name, 'offset': m."offset", 'size': m.size, 'sha256': m.sha256}"""

    def listed(col: str) -> str:
        return f"""SELECT x.sample_id, list({member} ORDER BY x.i) AS {col}
                    FROM (SELECT sample_id, unnest({col}_members) AS name, generate_subscripts({col}_members, 1) AS i
                          FROM packed) x JOIN members m USING (sample_id, name)
                    GROUP BY x.sample_id"""

    cur = con.execute(
        f"""WITH packed AS (SELECT pm.sample_id, s.media_members, s.extra_members
                            FROM pack_members pm JOIN samples s USING (sample_id)),
                media AS ({listed("media")}),
                extra AS ({listed("extra")})
           SELECT p.output_shard, p.pack_id, p.media_type, p.total_token_len, pm.sample_id, t.total_tokens,
                  sha256(s.conversation), CASE WHEN m.name IS NOT NULL THEN {member} END, md.media, ex.extra,
                  sh.size || ':' || sh.mtime_ns
           FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN samples s USING (sample_id)
           JOIN token_lengths t USING (sample_id) LEFT JOIN media md USING (sample_id)
           LEFT JOIN extra ex USING (sample_id) LEFT JOIN members m ON m.sample_id = s.sample_id AND m.name = s.json_member
           LEFT JOIN shards sh ON sh.shard = s.shard
           ORDER BY p.output_shard, p.pack_id, pm.position""")
    found: list[dict] = []
    shard = pack = fp = None
    stats = {"packs": 0, "samples": 0}

    def close() -> None:
        if shard in on_disk and (first_pack_meta(out_dir / shard) or {}).get("shard_fingerprint") == fp.hexdigest():
            found.append({"shard": shard, "skipped": True, "bytes": (out_dir / shard).stat().st_size, **stats,
                          "seconds": 0.0, "fingerprint": fp.hexdigest()})

    while rows := cur.fetchmany(65536):
        for name, pack_id, media_type, total, sample_id, tokens, conv_sha, json_member, media, extra, stamp in rows:
            if name != shard:
                if shard is not None:
                    close()
                shard, pack, fp, stats = name, None, ShardFingerprint(context), {"packs": 0, "samples": 0}
            if pack_id != pack:
                pack = pack_id
                fp.pack(pack_id, media_type, total)
                stats["packs"] += 1
            fp.sub(sample_id, tokens, conv_sha, json_member, media or [], extra or [], stamp)
            stats["samples"] += 1
    if shard is not None:
        close()
    return found


def load_shard_job(work: str, input_root: str, name: str) -> ShardJob:
    """Picklable loader: each writer process opens the catalog read-only and gathers its own shard."""
    with store.connect(Path(work), read_only=True) as con:
        return shard_job(con, Path(input_root), name)


class SourceChanged(RuntimeError):
    pass


def check_sources(con, input_root: Path, shards: list[str]) -> None:
    """Refuse to copy byte ranges out of a shard that is not the one the manifest scanned."""
    recorded = {r[0]: (r[1], r[2], r[3]) for r in con.execute("SELECT shard, size, mtime_ns, status FROM shards").fetchall()}
    problems = []
    for shard in shards:
        path = input_root / f"{shard}.tar"
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


def run_write(work: Path, input_root: Path, out_dir: Path, workers: int = 0, progress=None) -> dict:
    t0 = time.perf_counter()
    safety.check_paths(input_root, work, out_dir)
    with store.connect(work, read_only=True) as con:
        info = plan_info(con)
        check_sources(con, input_root, [s[0] for s in con.execute(
            "SELECT DISTINCT shard FROM pack_members JOIN manifest_samples USING (sample_id)").fetchall()])
        names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
        context = write_context(info)
        done = current_shards(con, out_dir, context)
    loader = functools.partial(load_shard_job, str(work), str(input_root))
    skip = {r["shard"] for r in done}
    results = write_all(out_dir, [n for n in names if n not in skip], context, workers=workers, progress=progress,
                        loader=loader, done=done,
                        plan_fingerprint=info["fingerprint"])
    seconds = time.perf_counter() - t0
    total = sum(r["bytes"] for r in results)
    foreign = owned.foreign_files(out_dir, owned.planned_files(names))
    return {"output_dir": str(out_dir), "shards": len(results), "written": sum(not r["skipped"] for r in results),
            "foreign_files": foreign,
            "skipped": sum(r["skipped"] for r in results), "bytes": total, "packs": sum(r["packs"] for r in results),
            "seconds": round(seconds, 3), "mb_per_second": round(total / seconds / 1e6, 1) if seconds else None,
            "fingerprint": info["fingerprint"]}


AUDITED = "audited_shards.json"
AUDIT_SCOPES = ("all", "changed")


def _audited(work: Path) -> dict:
    try:
        return json.loads((work / AUDITED).read_text())
    except (OSError, ValueError):
        return {}


def run_audit(work: Path, out_dir: Path, recount_fraction: float = 0.02, workers: int = 0,
              parallel_min_bytes: int = PARALLEL_MIN_BYTES, scope: str = "all") -> tuple[AuditResult, dict]:
    """Read the outputs back and check every invariant; recount a deterministic sample of token lengths.
    scope "changed" reads only the output shards that are new or changed since the last clean audit (same
    size, mtime and content fingerprint as then: trusted, like rsync's quick check); "all" reads every one."""
    if scope not in AUDIT_SCOPES:
        raise ValueError(f"audit scope {scope!r}: expected one of {', '.join(AUDIT_SCOPES)}")
    with store.connect(work, read_only=True) as con:
        info = plan_info(con)
        stamps = {}
        for r in current_shards(con, out_dir, write_context(info)):
            st = (out_dir / r["shard"]).stat()
            stamps[r["shard"]] = [st.st_size, st.st_mtime_ns, r["fingerprint"]]
        before = _audited(work) if scope == "changed" else {}
        trusted = frozenset(n for n, stamp in stamps.items() if before.get(n) == stamp)
        result = audit(con, out_dir, info["config"], work=work, workers=workers, min_bytes=parallel_min_bytes,
                       trusted=trusted)
        recount(con, info, result, recount_fraction)
        result.waiting = list(info["stats"].get("shards_waiting") or [])
        result.stats.update(verdict=result.verdict, shards_waiting=result.waiting)
        from .report import write_report

        report = write_report(con, work, result, info)
    # a clean audit vouches for every current shard; one with violations vouches for none
    store.atomic_write_text(work / AUDITED, json.dumps(stamps if result.ok else {}, sort_keys=True))
    return result, report
