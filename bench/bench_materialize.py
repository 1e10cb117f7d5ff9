"""`dagster asset materialize` of one shard's `manifest` + `token_lengths`, as the README shows it, with the
code location's executor (in process) against Dagster's default one (multiprocess: a process per step), the
same definitions without `executor=` as a code location of its own.

    python bench/bench_materialize.py --repeats 3 --per-shard 200

One small shard, one Dagster home made by an untimed warm-up; each timed command rescans the shard (its
work folder is removed first); the order of the two executors alternates between repeats. Wall seconds
of the whole command, measured outside it. Writes medians, their ratio and every run to a NEW file under
bench/results/ (--results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, make_shards  # noqa: E402

# code location module per executor; `multiprocess` is written into the temporary folder on PYTHONPATH
EXECUTORS = {"in_process": "pack_assets.definitions", "multiprocess": "bench_default_executor"}
DEFAULT_EXECUTOR = """import dagster as dg
import pack_assets.definitions as loc

defs = dg.Definitions(assets=loc.defs.assets, jobs=loc.defs.jobs, sensors=loc.defs.sensors,
                      resources=loc.defs.resources)
"""


def run_once(dagster: str, env: dict, work: Path, module: str) -> float:
    shutil.rmtree(work, ignore_errors=True)
    cmd = [dagster, "asset", "materialize", "-m", module, "--select", "manifest,token_lengths",
           "--partition", "part-00000"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    return round(wall, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-shard", type=int, default=200, help="samples in the shard")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/materialize_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "materialize")
    dagster = str(Path(sys.executable).parent / "dagster")
    with tempfile.TemporaryDirectory(prefix="bench_materialize-") as tmp:
        t = Path(tmp)
        make_shards(t / "in", 1, args.per_shard)
        (t / "home").mkdir()
        (t / f"{EXECUTORS['multiprocess']}.py").write_text(DEFAULT_EXECUTOR)
        env = {**os.environ, "DAGSTER_HOME": str(t / "home"), "PACK_ASSETS_INPUT": str(t / "in"),
               "PACK_ASSETS_WORK": str(t / "work"), "PACK_ASSETS_OUTPUT": str(t / "out"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(t), os.environ.get("PYTHONPATH")]))}
        for module in EXECUTORS.values():  # warm-up: the home's storage, the OS cache
            run_once(dagster, env, t / "work", module)
        runs: dict[str, list[float]] = {name: [] for name in EXECUTORS}
        for r in range(args.repeats):
            for name in (list(EXECUTORS) if r % 2 == 0 else list(EXECUTORS)[::-1]):
                runs[name].append(run_once(dagster, env, t / "work", EXECUTORS[name]))
    medians = {name: statistics.median(v) for name, v in runs.items()}
    out = {"machine": machine(), "load_average": os.getloadavg(), "per_shard": args.per_shard,
           "repeats": args.repeats, "median_s": medians,
           "in_process_over_multiprocess": round(medians["in_process"] / medians["multiprocess"], 3), "runs": runs}
    dest.write(out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
