"""How far the yardstick of issue 41's ratios moves: `cat` then `sha256sum` of a set's shards, several times.

    python -P bench/yardstick.py --input /work/e2e1m/shards --repeats 3 --results bench/results/<new>.json

bench_e2e.py takes its ratio against one `sha256sum` of the input, timed as here (after a `cat` of the same
files, so the page cache holds what it can). On a shared VM that one figure has moved by a quarter from one hour
to the next; this repeats it, so a ratio can be stated against the spread and not against one lucky or unlucky
reading. Writes a new results file (never overwrites one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, yardstick  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, help="a folder of part-*.tar shards")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/yardstick_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "yardstick")
    files = sorted(str(p) for p in Path(args.input).glob("part-*.tar"))
    if not files:
        raise SystemExit(f"no part-*.tar under {args.input}")
    rounds = []
    for i in range(args.repeats):
        rounds.append({"round": i, "utc": time.strftime("%H:%M:%S", time.gmtime()), **yardstick(files),
                       "load_avg": os.getloadavg()})
        print(rounds[-1], flush=True)
    shas = [r["sha256sum_s"] for r in rounds]
    out.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "input": args.input, "files": len(files),
               "bytes": sum(Path(f).stat().st_size for f in files), "rounds": rounds,
               "sha256sum_s": {"min": min(shas), "median": statistics.median(shas), "max": max(shas)}})


if __name__ == "__main__":
    main()
