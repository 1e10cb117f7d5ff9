"""This code's `run_write` against a baseline's in ONE process, warm, alternating run by run: each code's
`pack_assets` package copied under another name (the package imports itself relatively), so both run with the
same interpreter state, the same page cache and the same moment's load. A paired CPU figure for a shared
machine, where fresh processes per run (bench_write.py) move by ±20 % from one to the next.

    python bench/write_pair.py --baseline-src /tmp/base --data <bench_write.py's --out> --rounds 12 \\
        --results bench/results/x.json

One writer process (workers=1) on bench_write's set, each run into an emptied folder; one untimed run of each
first. Per run: process CPU (DuckDB's threads, the fsync and prefetch threads included), the calling thread's
CPU and wall. Ratios: of the medians, of the least, and the median of the round-by-round ratios. A first run in
a fresh process (imports, first calls) is not measured here: bench_write.py measures that."""

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
from common import ResultsFile, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, shutil, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import pa_this.core.write as this
import pa_base.core.write as base
inp, work, out, rounds = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
codes = {"this": this.run_write, "baseline": base.run_write}
got = {k: [] for k in codes}
for r in range(rounds + 1):
    for k in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
        shutil.rmtree(out, ignore_errors=True)
        c, t, w = time.process_time(), time.thread_time(), time.perf_counter()
        codes[k](work, inp, out, workers=1)
        if r:
            got[k].append({"cpu_s": time.process_time() - c, "thread_cpu_s": time.thread_time() - t,
                           "wall_s": time.perf_counter() - w})
shutil.rmtree(out, ignore_errors=True)
print(json.dumps(got))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--this-src", default=str(REPO), help="the code measured (default: this checkout)")
    ap.add_argument("--data", required=True, help="bench_write.py's --out (its set-* and work)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/write_pair_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "write_pair")
    data = Path(args.data).resolve()
    inp = next(p for p in sorted(data.glob("set-*")) if p.is_dir())
    scratch = data / "pair"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    for name, src in (("pa_this", args.this_src), ("pa_base", args.baseline_src)):
        shutil.copytree(Path(src) / "pack_assets", scratch / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, str(scratch), str(inp), str(data / "work"),
                           str(scratch / "out"), str(args.rounds)], capture_output=True, text=True, env=env)
    shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = {}
    for m in ("cpu_s", "thread_cpu_s", "wall_s"):
        a, b = [r[m] for r in got["this"]], [r[m] for r in got["baseline"]]
        summary[m] = {"this_median": round(statistics.median(a), 4), "baseline_median": round(statistics.median(b), 4),
                      "ratio_of_medians": round(statistics.median(a) / statistics.median(b), 3),
                      "ratio_of_least": round(min(a) / min(b), 3),
                      "median_of_round_ratios": round(statistics.median(x / y for x, y in zip(a, b)), 3)}
    dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_start": load,
                "load_avg_at_end": os.getloadavg(), "config": vars(args), "set": inp.name, "summary": summary,
                "runs": got})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
