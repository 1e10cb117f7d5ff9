"""The blend planner on small recipes (3,000-8,000 packs): which packing meets the three targets (windows of
256 packs within ±10 % of each dataset's token share, drift ≤ 1.25, packs within +0.1 % of the L2 lower
bound) where `mix` is 0.2-0.5 % over the bound.

    python bench/bench_blend_small.py          # writes a new bench/results/blend_small_<UTC>.json

Data: "test", tests/test_blend.py's blend (6,000 `chat` of mean 300 tokens, repeat 1.0; 1,500 `ocr` of mean
2,500, repeat 2.5; 3,000 `caption` of mean 600, repeat 0.5; max_len 4,096), epochs 0-3; "bench30k@4096" and
"bench30k@8192", bench_blend.py's three datasets at 30,000 samples and max_len 4,096 / 8,192, epoch 0. Per
case and approach, `make_blend_plan`, the median of ``--repeats`` timed runs; the figures are computed from
the plan's packs in output order (bench_blend.quality). Approaches: `mix`, `bfd`, `mixfill` (the recipe
default) and `mixfill` with its re-pack threshold at 0.98 and 1.0 instead of 0.995.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_blend import MIX as bench_mix  # noqa: E402
from bench_blend import quality  # noqa: E402
from bench_blend import rows as bench_rows  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_blend import synthetic_rows  # noqa: E402  the test's blend, one definition

from pack_assets.core import binpack, blend  # noqa: E402
from pack_assets.core.plan import PlanConfig  # noqa: E402

SPEC = [("chat", 6000, 300), ("ocr", 1500, 2500), ("caption", 3000, 600)]  # tests/test_blend.py synthetic_rows
REPEATS = {"chat": 1.0, "ocr": 2.5, "caption": 0.5}


def rows(seed: int = 0) -> dict:
    return synthetic_rows(SPEC, seed)


# (label, algorithm, mixfill's re-pack threshold)
APPROACHES = [("mix", "mix", 0.995), ("bfd", "bfd", 0.995), ("mixfill (default)", "mixfill", 0.995),
              ("mixfill, re-pack under 0.98", "mixfill", 0.98), ("mixfill, re-pack under 1.0", "mixfill", 1.0)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per approach and epoch (median)")
    ap.add_argument("--out", help="a new file or folder (default: a new bench/results/blend_small_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.out, "blend_small")
    cases = [("test", rows(), 4096, list(range(args.epochs))), ("bench30k@4096", bench_rows(30_000), 4096, [0]),
             ("bench30k@8192", bench_rows(30_000), 8192, [0])]
    names = list(REPEATS)
    threshold = binpack.MIXFILL_REPACK_BELOW
    results = []
    try:
        for case, r, max_len, epochs in cases:
            for label, algorithm, repack in APPROACHES:
                binpack.MIXFILL_REPACK_BELOW = repack
                for k in epochs:
                    secs = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        plan = blend.make_blend_plan(r, REPEATS, PlanConfig(max_len=max_len, algorithm=algorithm), k)
                        secs.append(time.perf_counter() - t0)
                    q = quality(plan, names)
                    q.pop("window_share_error_single_input_order")
                    worst = max(q["window_share_error"].values())
                    row = {"case": case, "approach": label, "epoch": k,
                           "seconds_median": round(statistics.median(secs), 3),
                           **q, "worst_window_share_error": worst,
                           "targets_met": bool(q["over_bound_fraction"] <= 0.001 and worst <= blend.SHARE_TOLERANCE
                                               and q["drift"] <= blend.DRIFT_LIMIT)}
                    results.append(row)
                    print(json.dumps({x: row[x] for x in ("case", "approach", "epoch", "packs", "lower_bound",
                                                           "over_bound_fraction", "worst_window_share_error", "drift",
                                                           "seconds_median", "targets_met")}), flush=True)
    finally:
        binpack.MIXFILL_REPACK_BELOW = threshold
    out = {"machine": machine(), "load_before": os.getloadavg(), "command": " ".join(["python"] + sys.argv),
           "test_spec": SPEC, "bench_mix": bench_mix, "repeats": REPEATS, "results": results}
    print(f"wrote {dest.write(out)}")


if __name__ == "__main__":
    main()
