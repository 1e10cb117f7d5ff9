"""The plan stage of the rerun after adding one shard (issue 41 item 4, session 48), without Dagster: `run_plan`
(incremental) on the first N-1 shards of a counted work folder, then on all N (the append: timed, with its steps),
then once more with nothing new; for each given code, in fresh processes, the codes alternating, repeated.

    python -P bench/bench_rerun_plan.py <counted work> <N> <scratch> <results> LABEL=CODE [LABEL=CODE ...]

``counted work``: a work folder whose shards are scanned and counted (e.g. a copy of /work/cat10m): each run's
work folder in ``scratch`` links its first N shards' manifest and token_lengths folders (read only: the plan
writes its catalog and pack_plan.jsonl beside them). ``CODE``: a folder holding the `pack_assets` package.
Every figure: seconds of `run_plan` (and its process's CPU seconds, DuckDB's threads included) and of its steps
(cumulative per step name).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

REPEATS = int(os.environ.get("REPEATS", "2"))
# one process per plan: the steps wrapped to time them (those a code lacks are skipped)
DRIVER = """import functools, json, sys, time
from pathlib import Path
from pack_assets.core import incremental, plan, plancheck, store
from pack_assets.core.counting.profiles import resolve_profile
from pack_assets.core.settings import PlanConfig
spent = {}
def timed(mod, name):
    f = getattr(mod, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[name] = spent.get(name, 0) + time.perf_counter() - t
    setattr(mod, name, g)
for name in ("ok_lengths", "make_plan", "_appended", "check_plan", "_saved", "_planned", "split_overlong",
             "plannable", "_append_base"):
    timed(plan, name)
for name in ("appendable", "new_samples", "append_plan_file", "manifest_stamps", "every_length", "appended_rows"):
    timed(incremental, name)
timed(plancheck, "_appended_checks")
for name in ("build_catalog", "save_plan"):
    timed(store, name)
work, n = Path(sys.argv[1]), int(sys.argv[2])
shards = sorted(p.name for p in (work / "manifest").iterdir())[:n]
t, cpu = time.perf_counter(), time.process_time()
profile = resolve_profile("qwen3-vl", None, False, "")
s = plan.run_plan(work, shards, PlanConfig(max_len=16384, incremental=True), profile)
print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
                  "planning": s.stats["planning"],
                  "packs": s.packs, "fingerprint": s.fingerprint, "violations": len(s.violations),
                  "steps": {k: round(v, 2) for k, v in sorted(spent.items())}}))
"""


def linked(src: Path, dst: Path, n: int) -> None:
    """A work folder whose first ``n`` shards' manifest and token_lengths folders are links into ``src``."""
    shutil.rmtree(dst, ignore_errors=True)
    shards = sorted(p.name for p in (src / "manifest").iterdir() if p.is_dir())[:n]
    for part in ("manifest", *(f"token_lengths/{p.name}" for p in (src / "token_lengths").iterdir())):
        (dst / part).mkdir(parents=True)
        for s in shards:
            if (src / part / s).exists():
                (dst / part / s).symlink_to(src / part / s)


def plan_once(code: str, work: Path, n: int) -> dict:
    out = subprocess.run([sys.executable, "-P", "-c", DRIVER, str(work), str(n)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": code}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    src, n, scratch = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    results = ResultsFile(sys.argv[4], "rerun_plan")
    codes = dict(spec.split("=", 1) for spec in sys.argv[5:])
    record = {"issue": "41 item 4", "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(sys.argv), "load1_at_start": os.getloadavg()[0], "shards": n, "runs": []}
    for k in range(REPEATS):
        for label, code in codes.items():
            work = scratch / f"rerun_{label}"
            linked(src, work, n)
            run = {"label": label, "repeat": k, "first": plan_once(code, work, n - 1),
                   "add_one": plan_once(code, work, n), "nothing_new": plan_once(code, work, n)}
            record["runs"].append(run)
            print(label, k, json.dumps({x: run[x] for x in ("add_one", "nothing_new")}), flush=True)
            results.write(record)
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
