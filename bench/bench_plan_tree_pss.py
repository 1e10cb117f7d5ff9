"""The plan stage's whole footprint (issue 41 item 3, session 48): `bench_plan_beside_rss.py pool` (run_plan with
the what-if sweep beside it in two forked helpers, as `pack-assets run` runs it, without Dagster) on a counted work
folder, for each given code in turn, with its process tree sampled by `rss.TreeSampler`: the tree's PSS summed
(shared pages counted once) and RSS summed, and each process's VmHWM (the command's process, and the helpers).

    python -P bench/bench_plan_tree_pss.py <work> <results> LABEL=CODE [LABEL=CODE ...]

``work``: a scratch copy of a counted work folder (its pack_assets.duckdb* and pack_plan.jsonl are deleted before
each run, so each plans from scratch). ``CODE``: a folder holding the `pack_assets` package to measure (this
worktree, or `git archive <commit> pack_assets | tar -x -C <dir>`). The runs are one after the other, never at
once. The helpers here are fresh forks: in `pack-assets run` they have scanned and counted the shards first, so
they start larger there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402
from rss import TreeSampler  # noqa: E402

HERE = Path(__file__).resolve().parent
work, results = Path(sys.argv[1]), ResultsFile(sys.argv[2], "plan_tree_pss")
record: dict = {"issue": "41 item 3", "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": " ".join(sys.argv), "work": str(work), "units": "MB = 1e6 bytes", "runs": {}}
for spec in sys.argv[3:]:
    label, code = spec.split("=", 1)
    for name in ("pack_assets.duckdb", "pack_assets.duckdb.wal", "pack_plan.jsonl", "what_if.json"):
        (work / name).unlink(missing_ok=True)
    sampler = TreeSampler(os.getpid())
    sampler.start()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-P", str(HERE / "bench_plan_beside_rss.py"), "pool", str(work)],
                         env={**os.environ, "PYTHONPATH": code}, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    sampler.stop()
    main = min((p for p, r in sampler.procs.items() if r["parent"] == sampler.root),
               key=lambda p: sampler.procs[p]["first"])
    helpers = sorted((r["hwm"] for p, r in sampler.procs.items() if p != main), reverse=True)
    run = {"code": code, "seconds": round(seconds, 1),
           "tree_pss_peak_mb": max(p for _, p in sampler.pss) // 10**6,
           "tree_rss_summed_peak_mb": max(sum(r.values()) for _, r in sampler.samples) // 10**6,
           "main_vmhwm_mb": sampler.procs[main]["hwm"] // 10**6,
           "helpers_vmhwm_mb": [h // 10**6 for h in helpers],
           "probe": json.loads(out.stdout.strip().splitlines()[-1])}
    record["runs"][label] = run
    print(label, json.dumps({k: v for k, v in run.items() if k != "probe"}), flush=True)
    results.write(record)
