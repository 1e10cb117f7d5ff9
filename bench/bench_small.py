"""Small sets end to end: whole `pack-assets run` processes of this checkout (A) against a baseline copy of
the code (B, e.g. `git archive <commit> pack_assets | tar -x -C /tmp/base`), in the same run, in turn.

    python bench/bench_small.py --baseline-src /tmp/base --repeats 5

Cases: 6,000 image-text samples in 4 shards (~136 KB per image, ~0.86 GB) and one shard of 1,500 samples
(Qwen2.5-VL, max_len 8,192). Each timed run is a fresh process with a fresh work and output directory
against a Dagster home made by one untimed warm-up run per case and code (every shard needs a run); A and B
alternate, A B B A A B ..., and the ratio A/B is taken pair by pair, so neither drift on a shared machine
nor going first in a pair (files the page cache dropped in between are read again) favours one. Wall seconds are
measured outside the process (start-up and imports included). Writes every run,
the medians and the paired ratios to a new file under bench/results (--results). The tokenizer's rank-table cache
(PACK_ASSETS_CACHE) is the user's, filled by the warm-up run, unless --cold-cache gives every run an empty one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, make_shards  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CASES = {"4 shards x 1,500": (4, 1500), "1 shard x 1,500": (1, 1500)}


def run_once(src: Path, inp: Path, out: Path, args) -> dict:
    """One whole `python -m pack_assets.cli run` with `src` first on PYTHONPATH; wall seconds from outside."""
    for d in ("work", "packed"):
        shutil.rmtree(out / d, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    # every run builds the tokenizer's rank table again (core/counting/tokenizers.py), as a first run does
    if args.cold_cache:
        cache = out / "rank_cache"
        shutil.rmtree(cache, ignore_errors=True)
        env["PACK_ASSETS_CACHE"] = str(cache)
    cmd = [sys.executable, "-m", "pack_assets.cli", "run", "--input", str(inp), "--max-len", str(args.max_len),
           "--profile", args.profile, "--work", str(out / "work"), "--output", str(out / "packed"),
           "--dagster-home", str(out / "dagster_home"), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    s = json.loads(proc.stdout)
    return {"wall_s": round(wall, 2), "summary_s": s["seconds"], "stage_seconds": s["stage_seconds"],
            "samples": s["samples"], "packs": s["packs"], "verdict": s["verdict"]}


def bench_case(name: str, inp: Path, out: Path, srcs: dict[str, Path], args) -> dict:
    walls: dict[str, list[float]] = {v: [] for v in srcs}
    runs, ratios = [], []
    for v, src in srcs.items():
        (out / v).mkdir(parents=True, exist_ok=True)
        run_once(src, inp, out / v, args)  # warm-up: Dagster home, partitions, page cache
    for r in range(args.repeats):
        pair = {}
        # A B, then B A: the first run of a pair can pay for files the page cache dropped in between
        for v, src in (list(srcs.items()) if r % 2 == 0 else list(srcs.items())[::-1]):
            rec = {"case": name, "code": v, "repeat": r, **run_once(src, inp, out / v, args)}
            print(json.dumps(rec), flush=True)
            runs.append(rec)
            walls[v].append(rec["wall_s"])
            pair[v] = rec["wall_s"]
        ratios.append(round(pair["this"] / pair["baseline"], 3))
    return {"case": name, "median_wall_s": {v: round(statistics.median(w), 2) for v, w in walls.items()},
            "min_wall_s": {v: min(w) for v, w in walls.items()}, "paired_ratio_this_to_baseline": ratios,
            "median_ratio": round(statistics.median(ratios), 3), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--image-kb", type=int, default=136)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--profile", default="qwen2.5-vl")
    ap.add_argument("--out", default="bench/out/small")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/small_<UTC>.json)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="an empty PACK_ASSETS_CACHE for every run (default: the user's, filled by the warm-up)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "small")
    out = Path(args.out).resolve()
    srcs = {"this": REPO, "baseline": Path(args.baseline_src).resolve()}
    cases = []
    for name, (n, per) in CASES.items():
        inp = out / f"set{n}"
        make_shards(inp, n, per, args.image_kb, seed=n)
        cases.append(bench_case(name, inp, out / f"run{n}", srcs, args))
        print(json.dumps({k: v for k, v in cases[-1].items() if k != "runs"}), flush=True)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
              "config": {k: getattr(args, k) for k in ("repeats", "image_kb", "max_len", "profile", "baseline_src",
                                                      "cold_cache")},
              "cases": cases}
    dest.write(result)


if __name__ == "__main__":
    main()
