"""Per-stage throughput on synthetic image-text shards, next to the physical limits on the same bytes.

    python bench/bench_stages.py --shards 4 --per-shard 5000 --image-kb 100 --out bench/out

Prints the figures as JSON and writes them to a new bench/results/stages-<shards>x<per-shard>-<kb>k-<images>i_<UTC>.json
(--results); docs/benchmarks.md takes its numbers from there. Warm page cache throughout. The hashing
baselines: `sha256sum` (coreutils; on some machines a build without SHA extensions, several times slower),
Python's hashlib and `openssl dgst -sha256` on the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, hashlib_seconds, machine, make_shards, timed  # noqa: E402

from pack_assets.core import store  # noqa: E402
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile  # noqa: E402
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import (
    PlanConfig,  # noqa: E402
    run_plan,
)
from pack_assets.core.scan import (
    ScanOptions,  # noqa: E402
    run_manifest,
)
from pack_assets.core.write import run_write


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=100)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--images", type=int, default=1, help="images per sample")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/stages-<shards>x"
                                      "<per-shard>-<kb>k-<images>i_<UTC>.json)")
    args = ap.parse_args()
    case = f"{args.shards}x{args.per_shard}-{args.image_kb}k-{args.images}i"
    record = ResultsFile(args.results, f"stages-{case}")
    out = Path(args.out)
    inp = out / f"shards-{case}"
    paths = make_shards(inp, args.shards, args.per_shard, args.image_kb, images=args.images)
    total_bytes = sum(p.stat().st_size for p in paths)
    members = (1 + args.images) * args.shards * args.per_shard
    samples = args.shards * args.per_shard
    res = {"machine": machine(), "samples": samples, "members": members, "bytes": total_bytes}
    files = [str(p) for p in paths]
    timed(["cat", *files], shell=False)  # warm the cache
    res["cat_s"] = timed("cat " + " ".join(files) + " > /dev/null", shell=True)
    res["sha256sum_s"] = timed(["sha256sum", *files])
    res["hashlib_s"] = hashlib_seconds(files)
    if shutil.which("openssl"):
        res["openssl_s"] = timed(["openssl", "dgst", "-sha256", *files])

    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    shards = list(store.find_shards(inp))
    t0 = time.perf_counter()
    for s in shards:
        run_manifest(inp, work, s, ScanOptions(hash_members=True), force=True)
    res["manifest_hash_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in shards:
        run_manifest(inp, out / "work-nohash", s, ScanOptions(hash_members=False), force=True)
    res["manifest_nohash_s"] = time.perf_counter() - t0
    res["manifest_hash_vs_sha256sum"] = res["sha256sum_s"] / res["manifest_hash_s"]
    res["manifest_hash_vs_hashlib"] = res["hashlib_s"] / res["manifest_hash_s"]
    res["manifest_nohash_members_per_s"] = members / res["manifest_nohash_s"]

    profile = load_profile("qwen3-vl")
    run_token_lengths(work, shards[0], profile, force=True)  # load the tokenizer once
    t0 = time.perf_counter()
    for s in shards:
        run_token_lengths(work, s, profile, force=True)
    res["token_lengths_s"] = time.perf_counter() - t0
    res["token_lengths_samples_per_s"] = samples / res["token_lengths_s"]

    t0 = time.perf_counter()
    plan = run_plan(work, shards, PlanConfig(max_len=args.max_len), profile)
    res["plan_s"] = time.perf_counter() - t0
    res["plan_fill"] = plan.fill
    res["plan_packs_over_bound"] = plan.packs_over_bound

    dest = out / "packed"
    shutil.rmtree(dest, ignore_errors=True)
    w = run_write(work, inp, dest)
    res["write_s"] = w.seconds
    res["write_bytes"] = w.bytes
    cp_dest = out / "cp"
    shutil.rmtree(cp_dest, ignore_errors=True)
    cp_dest.mkdir()
    res["cp_s"] = timed(["cp", *files, str(cp_dest)])
    shutil.rmtree(cp_dest, ignore_errors=True)
    cp_dest.mkdir()
    quoted = shlex.quote(str(cp_dest))
    res["cp_sync_s"] = timed(f"cp {shlex.join(files)} {quoted} && sync -f {quoted}", shell=True)  # the writer fsyncs
    res["write_vs_cp"] = (w.bytes / res["write_s"]) / (total_bytes / res["cp_s"])
    res["write_vs_cp_sync"] = (w.bytes / res["write_s"]) / (total_bytes / res["cp_sync_s"])
    shutil.rmtree(cp_dest, ignore_errors=True)

    t0 = time.perf_counter()
    result = run_audit(work, dest)
    res["audit_s"] = time.perf_counter() - t0
    res["audit_ok"] = result.ok
    res["date"], res["load_avg_at_end"] = time.strftime("%Y-%m-%d"), os.getloadavg()
    res = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}
    print(json.dumps(res, indent=1))
    record.write(res)


if __name__ == "__main__":
    main()
