"""The plan stage as the pack_plan asset runs it (`defs/assets._planned`: `plan.run_plan` with the what-if sweep
started beside it by `report.WhatIfBeside` through the command's helper processes), without Dagster, in a fresh
process on a scanned and counted work folder: RSS and VmHWM (MB) after each step, and each step's sampled peak.

    python bench/bench_plan_beside_rss.py pool <work> [results]  # or: alone (run_plan only), inline (what-if, no pool)

It plans from scratch when the work folder has no catalog (delete pack_assets.duckdb* and pack_plan.jsonl of a
scratch copy first). Prints one JSON line last and, given ``results`` (a new file or a folder), writes it there
(bench/common.py's `ResultsFile`; issue 41's figures: bench/results/plan_rss_i41_s47_10m.json).
"""
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan_rss import told  # noqa: E402
from common import ResultsFile  # noqa: E402

from pack_assets.core import plan, report, store
from pack_assets.core.counting.profiles import resolve_profile
from pack_assets.core.settings import PlanConfig
from pack_assets.runner.procs import Helpers

mode, work = sys.argv[1], Path(sys.argv[2])
results = ResultsFile(sys.argv[3], "plan_beside_rss") if len(sys.argv) > 3 else None


def status(key):
    lines = Path("/proc/self/status").read_text().splitlines()
    return next(int(x.split()[1]) for x in lines if x.startswith(key)) // 1000

phase, peaks, marks, t0 = ["start"], {}, [], time.perf_counter()
def sampler():
    while True:
        r = status("VmRSS:")
        peaks[phase[0]] = max(peaks.get(phase[0], 0), r)
        time.sleep(0.05)

def say(step):
    marks.append((step, status("VmRSS:"), status("VmHWM:"), round(time.perf_counter() - t0, 1)))
    print(marks[-1], flush=True)
    phase[0] = "after " + step

helpers = Helpers(2) if mode != "alone" else None  # forked while this process is single-threaded, as the command


def entered(name):
    phase[0] = name


for name in ("ok_lengths", "split_overlong", "make_plan", "check_plan"):
    told(plan, name, say, entered)
for name in ("build_catalog", "save_plan"):
    told(store, name, say, entered)
told(report, "start_what_if", say, entered)
threading.Thread(target=sampler, daemon=True).start()
shards = sorted(p.name for p in (work / "manifest").iterdir() if p.is_dir())
cfg, prof = PlanConfig(max_len=16384), resolve_profile("qwen3-vl", None, False, "")
say("start")
if mode == "alone":
    s = plan.run_plan(work, shards, cfg, prof, allow_missing=True)
else:
    pool = helpers.pool if mode == "pool" else None
    w = report.WhatIfBeside(work, cfg, pool)
    s = plan.run_plan(work, shards, cfg, prof, allow_missing=True, on_lengths=w.start)
    phase[0] = "finish"
    w.finish(s.fingerprint)
say("run_plan")
record = {"mode": mode, "samples": s.stats["samples"], "packs": s.packs, "fingerprint": s.fingerprint,
          "marks": marks, "phase_peaks_mb": peaks}
print(json.dumps(record))
if results:
    results.write(record)
if helpers:
    helpers.close()
