"""The plan step's what-if sweep (core/report.start_what_if: max lengths 1/4x..2x of the configured one x
{bfd, next_fit}) on N lognormal lengths, this code against a baseline copy of the code, in the same run.

    git archive <commit before> pack_assets | tar -x -C /tmp/base
    python bench/bench_whatif.py --baseline-src /tmp/base --n 1000000 --repeats 3

Each figure is a fresh process that loads the lengths (.npy) and times `simulate` alone (imports and the
load not counted); this code and the baseline alternate and the ratio is taken pair by pair. Both must give
the same packs per (max length, algorithm). Writes a new file under bench/results (--results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import lognormal  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from pack_assets.core.sweep import simulate
lengths = np.load(sys.argv[2])
max_len = int(sys.argv[3])
t = time.perf_counter()
sweep = simulate(lengths, sorted({max_len // 4, max_len // 2, max_len, max_len * 2}), ["bfd", "next_fit"])
print(json.dumps({"seconds": time.perf_counter() - t,
                  "packs": {f"{r['max_len']}/{r['algorithm']}": r["packs"] for r in sweep["results"]}}))
"""


def once(src: Path, path: str, max_len: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(src), path, str(max_len)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(src)})
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/whatif_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "whatif")
    srcs = {"this": REPO, "baseline": Path(args.baseline_src).resolve()}
    runs, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lengths.npy")
        np.save(path, lognormal(args.n, 864, 3669, args.max_len))
        for r in range(args.repeats):
            pair = {v: once(src, path, args.max_len) for v, src in srcs.items()}
            if pair["this"]["packs"] != pair["baseline"]["packs"]:
                raise SystemExit(f"different packs: {pair}")
            ratios.append(round(pair["this"]["seconds"] / pair["baseline"]["seconds"], 3))
            for v, rec in pair.items():
                runs.append({"code": v, "repeat": r, "seconds": round(rec["seconds"], 3), "packs": rec["packs"],
                             "load_avg": os.getloadavg()})
                print(json.dumps(runs[-1]), flush=True)
    secs = {v: round(statistics.median(x["seconds"] for x in runs if x["code"] == v), 3) for v in srcs}
    result = {"machine": machine(), "n": args.n, "max_len": args.max_len, "median_seconds": secs,
              "paired_ratio_this_to_baseline": ratios, "median_ratio": statistics.median(ratios), "runs": runs}
    dest.write(result)
    print(json.dumps({k: result[k] for k in ("median_seconds", "median_ratio")}))


if __name__ == "__main__":
    main()
