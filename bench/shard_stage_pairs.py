"""The shard stage's CPU per sample of several checkouts, paired: a fresh process per run, the checkouts
alternating (the order reversed every other round); each run warms on the first shard, then does the next
--shards (`shardwork.work_shard`: scan, then count from memory, files written), each shard's user and system
CPU seconds per sample taken by `getrusage` (with --scan-only the scan alone, `scan.scan_shard`, no file written).
Medians and least values per checkout over every shard of every round.

    python -P bench/shard_stage_pairs.py --input <folder of shards> --work <scratch> --code <checkout> \\
        --code <another> [--shards 3] [--rounds 6] [--scan-only] [--results <new file>]

The shards are only read; --work is emptied.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_CHILD = r"""
import gc, json, resource, shutil, sys
from pack_assets.core import scan, store
from pack_assets.core.settings import Settings
from pack_assets.runner import shardwork
inp, work, n, scan_only = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
shutil.rmtree(work, ignore_errors=True)
flat = Settings.from_flat({"input_dir": inp, "work_dir": work, "output_dir": work + "/unused"}).flat()
settings = Settings.from_flat(flat)
keys = shardwork.find(settings).shards

def one(k):  # the shard's samples
    if not scan_only:
        return shardwork.work_shard(flat, k, True)
    gc.disable()  # (as the helpers scan)
    records = scan.scan_shard(store.source_tar(settings.sources, k), k, settings.scan)
    got = [r for r in records if isinstance(r, scan.Sample)]
    gc.enable()
    return len(got)

one(keys[0])
out = []
for k in keys[1 : 1 + n]:
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m = one(k)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.append([(r1.ru_utime - r0.ru_utime) / m * 1e6, (r1.ru_stime - r0.ru_stime) / m * 1e6])
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--code", type=Path, action="append", required=True)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--scan-only", action="store_true", help="only `scan.scan_shard` (every record), no files")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/shard_stage_pairs_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "shard_stage_pairs")
    runs: dict[str, list] = {str(c): [] for c in args.code}
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "input": str(args.input), "scan_only": args.scan_only, "load_avg": [os.getloadavg()], "codes": {}}
    for r in range(args.rounds):
        for code in args.code if r % 2 == 0 else args.code[::-1]:
            argv = [sys.executable, "-P", "-c", _CHILD, str(args.input), str(args.work), str(args.shards),
                    str(int(args.scan_only))]
            proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            runs[str(code)] += json.loads(proc.stdout.strip().splitlines()[-1])
        doc["load_avg"].append(os.getloadavg())
    for code, v in runs.items():
        total = [u + s for u, s in v]
        doc["codes"][code] = {"cpu_us_per_sample_median": round(statistics.median(total), 1),
                              "cpu_us_per_sample_least": round(min(total), 1),
                              "user_median": round(statistics.median(u for u, _ in v), 1),
                              "system_median": round(statistics.median(s for _, s in v), 1),
                              "runs_user_system": [[round(u, 1), round(s, 1)] for u, s in v]}
        print(code, {k: x for k, x in doc["codes"][code].items() if k != "runs_user_system"}, flush=True)
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
