"""Planner speed and quality: lognormal lengths like the seed's LVIS table and a 10M run.

    python bench/bench_plan.py --n 10000000

Compares the planner's wall time with numpy loading and stable-argsorting the same lengths (same run).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

from pack_assets.core.plan import ALGORITHMS, assign, lower_bounds  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    args = ap.parse_args()
    print(json.dumps({"machine": machine()}))
    seed = lognormal(99_388, 864, 3668.6, 20_000)
    for r in run(seed, 20_000, ALGORITHMS):
        print(json.dumps({"case": "LVIS-like 99,388 @ 20,000", **r}))
    small = lognormal(1_000_000, 900, 1800, 2048, seed=1)
    for r in run(small, 2048, ALGORITHMS):
        print(json.dumps({"case": "1M median 900 @ 2,048", **r}))
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
    print(json.dumps({"case": f"{args.n:,} @ 20,000", **r, "numpy_load_argsort_s": round(ref, 3),
                      "ratio_to_numpy": round(r["seconds"] / ref, 2),
                      "peak_rss_growth_bytes_per_sample": round((after - before) * 1024 / args.n, 1)}))


if __name__ == "__main__":
    main()
