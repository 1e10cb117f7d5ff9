"""Planner speed and quality: lognormal lengths like the seed's LVIS table and a 10M run.

    python bench/bench_plan.py --n 10000000
    python bench/bench_plan.py --caps 2048 8192 32768 65536 --n 10000000 --repeats 3

Each run writes a new file under bench/results (--results).

Compares the planner's wall time with numpy loading and stable-argsorting the same lengths (same run).
--caps: whole processes, each fresh: `plan` loads the .npy and runs BFD at the cap, `numpy` loads the same
file and stable-argsorts it; they alternate and the ratio is taken pair by pair. The plan process reports
its peak RSS growth over the loaded lengths (ru_maxrss after assign minus after load), in bytes per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

from pack_assets.core.binpack import ALGORITHMS, assign, lower_bounds  # noqa: E402  (numpy only: a light process)


def lognormal(n: int, median: float, p95: float, cap: int, seed: int = 0) -> np.ndarray:
    sigma = np.log(p95 / median) / 1.6449
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, n).astype(np.int64), 1, None)


def run(lengths: np.ndarray, cap: int, algorithms) -> list[dict]:
    rows = []
    l1, l2 = lower_bounds(lengths, cap)
    for alg in algorithms:
        t0 = time.perf_counter()
        packs = assign(lengths, cap, alg)
        dt = time.perf_counter() - t0
        kept = packs >= 0
        n = int(packs.max()) + 1
        rows.append({"algorithm": alg, "n": len(lengths), "cap": cap, "packs": n, "L1": l1, "L2": l2,
                     "over_L2": n - l2, "fill": round(float(lengths[kept].sum()) / (n * cap), 5),
                     "dropped": int((~kept).sum()), "seconds": round(dt, 3)})
    return rows


def child(kind: str, path: str, cap: int) -> None:
    """One fresh process: load the lengths, then argsort them (numpy) or plan them (plan); prints JSON."""
    lengths = np.load(path)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if kind == "numpy":
        np.argsort(lengths, kind="stable")
        print(json.dumps({"seconds": round(time.perf_counter() - t0, 3)}))
        return
    packs = assign(lengths, cap, "bfd")
    dt = time.perf_counter() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - loaded) * 1024
    print(json.dumps({"seconds": round(dt, 3), "packs": int(packs.max()) + 1,
                      "peak_growth_bytes_per_sample": round(grown / len(lengths), 1)}))


def whole(args: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(proc.stdout.splitlines()[-1])


def caps_run(caps: list[int], n: int, repeats: int, results: ResultsFile) -> None:
    big = lognormal(n, 864, 3668.6, 20_000, seed=2)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "l.npy")
        np.save(path, big)
        for cap in caps:
            pairs = []
            for _ in range(repeats):
                wp, inner = whole(["--child", "plan", "--file", path, "--cap", str(cap)])
                wn, _ = whole(["--child", "numpy", "--file", path, "--cap", str(cap)])
                pairs.append({"plan_s": round(wp, 2), "numpy_s": round(wn, 2), "ratio": round(wp / wn, 2), **inner})
            l1, l2 = lower_bounds(big, cap)
            row = {"n": n, "cap": cap, "L2": l2, "median_ratio": statistics.median(p["ratio"] for p in pairs),
                   "median_plan_s": statistics.median(p["plan_s"] for p in pairs),
                   "median_numpy_s": statistics.median(p["numpy_s"] for p in pairs), "runs": pairs}
            print(json.dumps(row), flush=True)
            rows.append(row)
    results.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
                   "rows": rows})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--caps", type=int, nargs="*", help="whole-process planner vs numpy at these capacities")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/plan_<UTC>.json, "
                                      "plan_caps_<UTC>.json with --caps)")
    ap.add_argument("--child", choices=["plan", "numpy"], help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.file, args.cap)
    dest = ResultsFile(args.results, "plan_caps" if args.caps else "plan")
    if args.caps:
        return caps_run(args.caps, args.n, args.repeats, dest)
    records = [{"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_start": os.getloadavg()}]
    print(json.dumps(records[0]))
    seed = lognormal(99_388, 864, 3668.6, 20_000)
    records += [{"case": "LVIS-like 99,388 @ 20,000", **r} for r in run(seed, 20_000, ALGORITHMS)]
    small = lognormal(1_000_000, 900, 1800, 2048, seed=1)
    records += [{"case": "1M median 900 @ 2,048", **r} for r in run(small, 2048, ALGORITHMS)]
    print("\n".join(json.dumps(r) for r in records[1:]))
    big = lognormal(args.n, 864, 3668.6, 20_000, seed=2)
    with tempfile.TemporaryDirectory() as d:
        np.save(Path(d) / "l.npy", big)
        t0 = time.perf_counter()
        loaded = np.load(Path(d) / "l.npy")
        np.argsort(loaded, kind="stable")
        ref = time.perf_counter() - t0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (r,) = run(big, 20_000, ["bfd"])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    records.append({"case": f"{args.n:,} @ 20,000", **r, "numpy_load_argsort_s": round(ref, 3),
                    "ratio_to_numpy": round(r["seconds"] / ref, 2),
                    "peak_rss_growth_bytes_per_sample": round((after - before) * 1024 / args.n, 1)})
    print(json.dumps(records[-1]))
    dest.write(records)


if __name__ == "__main__":
    main()
