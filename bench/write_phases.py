"""Where the copy writer's time goes, this code against a baseline copy of the code, on a set bench_write.py
prepared (its --out folder: `set-*` and `work`). A profile by phase, not a timing of the stage as users run it:

    python bench/write_phases.py --baseline-src /tmp/base --data bench/out/write --results bench/results/x.json

Each code in a process of its own, the two in turn (--pairs times); in each, run_write (one writer process) is
run --runs times after one untimed run, with wrappers on a few functions that add up their wall and CPU
seconds; per phase the least of the runs. CPU: the calling thread's (a job writes a shard in a thread while
it prepares the next, so the process's would count both), but the process's for `setup`, `group_table` (DuckDB's
threads) and `energon`, which run alone, and for TOTAL. Wall seconds of overlapping phases overlap too.
The phases nest: `write_shard` holds `preadv`, `writev` and `records json`; `group_table` and `_columns` are
the catalog's rows read for a job; `build_shard` the shard prepared from them (documents, reads, layout,
fingerprint); `setup` the stage's queries before the first shard (and `shard_digests` where it runs beside the
write: its process CPU then counts the writer's too); `energon` the folder's Energon and wids metadata, their
fsyncs and renames included."""

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

REPO = Path(__file__).resolve().parent.parent

PHASES = """
import json, shutil, sys, time
from collections import defaultdict
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from pack_assets.core import store
from pack_assets.core.write import copy, shard, shared
acc = defaultdict(lambda: [0.0, 0.0])
def wrap(mod, name, label, clock=time.thread_time):
    real = getattr(mod, name)
    def timed(*a, **k):
        t, c = time.perf_counter(), clock()
        try:
            return real(*a, **k)
        finally:
            acc[label][0] += time.perf_counter() - t
            acc[label][1] += clock() - c
    setattr(mod, name, timed)
for name in ("check_sources", "written_key", "shard_digests", "current_shards", "refuse_if_full", "shard_samples",
             "piece_shards"):
    wrap(copy, name, "setup", time.process_time)
from pack_assets.core.write import bulk
try:  # a shard prepared a batch of packs at a time (s48): its two passes are what build_shard was
    from pack_assets.core.write import batches
except ImportError:
    batches = None
for mod, name, label in ((copy, "build_shard", "build_shard"), (batches, "fingerprint_text", "build_shard"),
                         (batches, "build_packs", "build_shard"), (copy, "write_shard", "write_shard"),
                         (shard, "_source", "records json"), (shard, "_read", "preadv"),
                         (shard, "writev_all", "writev")):
    if hasattr(mod, name):
        wrap(mod, name, label)
# DuckDB's own threads, and the stage's end: the process's CPU (before the first shard and after the last one
# is written, nothing else runs beside them in the single-job set)
for mod, name, label in ((bulk, "group_table", "group_table"), (store, "group_rows", "group_table"),
                         (shared.OutputFolder, "metadata", "energon")):
    if hasattr(mod, name):
        wrap(mod, name, label, time.process_time)
wrap(bulk, "_columns", "_columns")
inp, work, out = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
runs = []
for i in range(int(sys.argv[5]) + 1):
    acc.clear()
    shutil.rmtree(out, ignore_errors=True)
    t, c = time.perf_counter(), time.process_time()
    copy.run_write(work, inp, out, workers=1)
    acc["TOTAL"] = [time.perf_counter() - t, time.process_time() - c]
    if i:
        runs.append({k: list(v) for k, v in acc.items()})
shutil.rmtree(out, ignore_errors=True)
print(json.dumps({k: {"wall_s": round(min(r[k][0] for r in runs), 4), "cpu_s": round(min(r[k][1] for r in runs), 4)}
                  for k in runs[0]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--data", default="bench/out/write", help="bench_write.py's --out (its set and work folder)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/write_phases_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "write_phases")
    data = Path(args.data).resolve()
    inp = next(p for p in sorted(data.glob("set-*")) if p.is_dir())
    codes = {"this": REPO, "baseline": Path(args.baseline_src).resolve()}
    got: dict[str, list[dict]] = {c: [] for c in codes}
    for pair in range(args.pairs):
        for code, src in (list(codes.items()) if pair % 2 == 0 else list(codes.items())[::-1]):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            proc = subprocess.run([sys.executable, "-c", PHASES, str(src), str(inp), str(data / "work"),
                                   str(data / f"phases-{code}"), str(args.runs)], capture_output=True, text=True,
                                  env=env)
            if proc.returncode:
                raise SystemExit(proc.stderr[-4000:])
            got[code].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(code, json.dumps(got[code][-1]), flush=True)
    phases = sorted({k for runs in got.values() for r in runs for k in r})
    med = {code: {k: {m: round(statistics.median(r[k][m] for r in runs if k in r), 4) for m in ("wall_s", "cpu_s")}
                  for k in phases if any(k in r for r in runs)} for code, runs in got.items()}
    dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
                "config": vars(args), "set": inp.name, "medians": med, "runs": got})
    print(json.dumps(med, indent=1))


if __name__ == "__main__":
    main()
