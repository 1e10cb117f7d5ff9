"""Cost at 1×, 4× and 16× input size: fresh `pack-assets run` on nested subsets of one shard set (the 4× set
holds the 1× shards, and so on; hard links, no copies), with per-stage seconds and peak memory.

    python bench/bench_scale.py --base 25000 --factors 1 4 16 --out bench/out/scale

Prints JSON lines and writes them to <out>/results.json and to a new results file (--results; default
bench/results/scale_<UTC>.json); bench/plots.py draws them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import run  # noqa: E402
from common import Results, machine, make_shards, require_free  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=int, default=25_000, help="samples at 1x")
    ap.add_argument("--factors", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--per-shard", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=15)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--out", default="bench/out/scale")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/scale_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    emit = Results(out, args.results, "scale")
    out.mkdir(parents=True, exist_ok=True)
    biggest = args.base * max(args.factors)
    need = 2.2 * biggest * (args.image_kb * 1024 + 600)
    require_free(out, need)
    all_shards = make_shards(out / "shards", biggest // args.per_shard, args.per_shard, args.image_kb, seed=11)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "base": args.base, "image_kb": args.image_kb,
          "per_shard": args.per_shard})
    exe = str(Path(sys.executable).parent / "pack-assets")
    for factor in args.factors:
        n_shards = args.base * factor // args.per_shard
        inp, run_dir = out / f"in-{factor}x", out / f"run-{factor}x"
        shutil.rmtree(inp, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        inp.mkdir()
        for p in all_shards[:n_shards]:
            os.link(p, inp / p.name)
        cmd = [exe, "run", "--input", str(inp), "--max-len", str(args.max_len), "--work", str(run_dir / "work"),
               "--output", str(run_dir / "packed"), "--dagster-home", str(run_dir / "dagster_home"), "--json"]
        seconds, summary, peak = run(cmd)
        rec = {"factor": factor, "samples": summary["samples"], "shards": n_shards,
               "bytes": sum(p.stat().st_size for p in all_shards[:n_shards]), "full_run_s": round(seconds, 1),
               "stage_seconds": summary["stage_seconds"], "peak_rss_bytes": peak, "packs": summary["packs"],
               "lower_bound": summary["lower_bound"], "violations": summary["violations"]}
        emit(rec)
        shutil.rmtree(run_dir, ignore_errors=True)  # the next size needs the disk
    results = emit.records
    first = results[1]
    for rec in results[1:]:
        rec["seconds_per_1k_samples"] = round(rec["full_run_s"] / rec["samples"] * 1000, 3)
        rec["vs_linear"] = round(rec["full_run_s"] / (first["full_run_s"] * rec["factor"] / first["factor"]), 3)
    emit.save()
    print(json.dumps([{k: r.get(k) for k in ("factor", "seconds_per_1k_samples", "vs_linear")} for r in results[1:]]))


if __name__ == "__main__":
    main()
