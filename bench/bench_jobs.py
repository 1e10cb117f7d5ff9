"""Whole `pack-assets run` processes at --jobs 1 vs 2 (and more) over a few shard counts, to set
`pack_assets.runner.runenv.JOBS_FROM_SHARDS`, the shard count from which the default goes to one process per core.

    python bench/bench_jobs.py --shards 2 4 8 16 --jobs 1 2 --repeats 5 --per-shard 500

Each timed run is a fresh work and output directory (every shard needs a run) against a Dagster home made
by one untimed warm-up run per shard count; the order of the --jobs values alternates between repeats so
drift on the machine does not favour one. Wall seconds are the whole process, measured outside it.
Writes medians and every run to a new file under bench/results (--results); run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, make_shards  # noqa: E402


def run_once(exe: str, inp: Path, out: Path, jobs: int, max_len: int) -> dict:
    for d in ("work", "packed"):
        shutil.rmtree(out / d, ignore_errors=True)
    cmd = [exe, "run", "--input", str(inp), "--max-len", str(max_len), "--work", str(out / "work"),
           "--output", str(out / "packed"), "--dagster-home", str(out / "dagster_home"), "--jobs", str(jobs), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    s = json.loads(proc.stdout)
    return {"wall_s": round(wall, 2), "summary_s": s["seconds"], "jobs_used": s["jobs"],
            "shard_runs": s["shard_runs"], "stage_seconds": s["stage_seconds"]}


def threshold(medians: dict[int, dict[int, float]], parallel: int) -> int | None:
    """The smallest shard count from which --jobs `parallel` beats 1 at every larger count measured."""
    best = None
    for n in sorted(medians, reverse=True):
        if medians[n][parallel] < medians[n][1]:
            best = n
        else:
            break
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--per-shard", type=int, default=500, help="samples per shard")
    ap.add_argument("--image-kb", type=int, default=15)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--out", default="bench/out/jobs", help="shards, work and output directories")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/jobs_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "jobs")
    if 1 not in args.jobs:
        raise SystemExit("--jobs must include 1, the baseline")
    out = Path(args.out)
    exe = str(Path(sys.executable).parent / "pack-assets")
    runs, medians = [], {}
    for n in args.shards:
        inp = out / f"shards{n}"
        make_shards(inp, n, args.per_shard, args.image_kb, seed=n)
        case = out / f"run{n}"
        run_once(exe, inp, case, 1, args.max_len)  # warm-up: Dagster home, partitions, page cache
        walls: dict[int, list[float]] = {j: [] for j in args.jobs}
        for r in range(args.repeats):
            for j in (args.jobs if r % 2 == 0 else args.jobs[::-1]):
                rec = {"shards": n, "jobs": j, "repeat": r, **run_once(exe, inp, case, j, args.max_len)}
                print(json.dumps(rec), flush=True)
                runs.append(rec)
                walls[j].append(rec["wall_s"])
        medians[n] = {j: round(statistics.median(w), 2) for j, w in walls.items()}
        print(json.dumps({"shards": n, "median_wall_s": medians[n]}), flush=True)
    parallel = max(args.jobs)
    result = {
        "machine": machine(), "date": time.strftime("%Y-%m-%d"),
        "config": {k: getattr(args, k) for k in ("shards", "jobs", "repeats", "per_shard", "image_kb", "max_len")},
        "median_wall_s": {str(n): {str(j): m for j, m in v.items()} for n, v in medians.items()},
        "fastest_jobs": {str(n): min(v, key=v.get) for n, v in medians.items()},
        # JOBS_FROM_SHARDS should be this (None: one process was never slower at any count measured)
        f"jobs_{parallel}_wins_from_shards": threshold(medians, parallel),
        "runs": runs,
    }
    dest.write(result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
