"""Whether the command's process-wide changes (pack_assets/runner/runenv.py) still pay, each measured in
`pack-assets run` on one small shard, with the change and without it, in the same run, order alternating:

- `cache_alembic_scripts`: how many times alembic loads Dagster's migration scripts in one command, and the
  seconds spent loading them (`ScriptDirectory._load_revisions`, timed inside the command);
- `exit_without_teardown`: the seconds from the command's last line of work to the end of its process
  (os._exit, against the interpreter's own exit and teardown), measured outside it;
- `share_sqlite_engines`: the SQLAlchemy engines made in the command's process and its CPU seconds;
- `pyarrow_without_pandas`: whether the helper processes import pandas, and their CPU seconds (with the
  writer's processes: every child the command waited for).

    python bench/bench_runenv.py --repeats 3

Each command works in a fresh work and output folder, the Dagster home made by an untimed warm-up. Writes the
medians and every run to a NEW file under bench/results/ (--results)."""

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

# run in the command's process: count alembic's script loads; ``off`` turns the change under test off
ALEMBIC = """import sys, time
from alembic.script import ScriptDirectory
spent = []
load = ScriptDirectory._load_revisions
def counted(self):
    t = time.perf_counter()
    yield from load(self)
    spent.append(time.perf_counter() - t)
ScriptDirectory._load_revisions = counted
from pack_assets.runner import runenv
if sys.argv[1] == "off":
    runenv.cache_alembic_scripts = lambda: None
from pack_assets.cli import main
code = main(sys.argv[2:])
print(json.dumps({"loads": len(spent), "seconds": sum(spent)}), file=sys.stderr)
"""
EXIT = """import sys, time
import pack_assets.cli as cli
real = cli.exit_without_teardown if sys.argv[1] == "on" else sys.exit
def marked(code):
    print(f"EXITING {time.time():.6f}", file=sys.stderr, flush=True)
    real(code)
cli.exit_without_teardown = marked
sys.argv = ["pack-assets"] + sys.argv[2:]
cli.main()
"""

# run as the command (argv from sys.argv, so the CLI's process-wide changes apply); ``off`` turns both
# changes under test off; what the process and its children used, printed just before it leaves
ENGINES = """import json, resource, sys
import sqlalchemy
made = []
init = sqlalchemy.engine.Engine.__init__
def counted(self, *a, **k):
    made.append(1)
    init(self, *a, **k)
sqlalchemy.engine.Engine.__init__ = counted
import pack_assets.cli as cli
from pack_assets.runner import procs, runenv
if sys.argv[1] == "off":
    runenv.share_sqlite_engines = lambda: None
    cli.pyarrow_without_pandas = lambda: None
helper_init = procs._helper_init
def init_helper(*a):
    helper_init(*a)
    from multiprocessing import util
    util.Finalize(None, lambda: print("HELPER_PANDAS", "pandas" in sys.modules, file=sys.stderr, flush=True),
                  exitpriority=0)
procs._helper_init = init_helper
leave = cli.exit_without_teardown
def measured(code):
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print("USED " + json.dumps({"engines": len(made), "command_cpu_s": round(me.ru_utime + me.ru_stime, 3),
                                "children_cpu_s": round(kids.ru_utime + kids.ru_stime, 3)}), file=sys.stderr)
    leave(code)
cli.exit_without_teardown = measured
sys.argv = ["pack-assets"] + sys.argv[2:]
cli.main()
"""


def _command(tmp: Path, shards: Path, k: int) -> list[str]:
    for d in ("work", "out"):
        shutil.rmtree(tmp / f"{d}{k}", ignore_errors=True)
    return ["run", "--input", str(shards), "--work", str(tmp / f"work{k}"), "--output", str(tmp / f"out{k}"),
            "--max-len", "4096", "--dagster-home", str(tmp / "dh")]


def alembic_once(tmp: Path, shards: Path, mode: str, k: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", "import json\n" + ALEMBIC, mode, *_command(tmp, shards, k)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def exit_once(tmp: Path, shards: Path, mode: str, k: int) -> float:
    proc = subprocess.run([sys.executable, "-c", EXIT, mode, *_command(tmp, shards, k)], capture_output=True,
                          text=True)
    ended = time.time()
    marked = [ln for ln in proc.stderr.splitlines() if ln.startswith("EXITING ")]
    if proc.returncode != 0 or not marked:
        raise RuntimeError(f"the command failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return ended - float(marked[-1].split()[1])


def engines_once(tmp: Path, shards: Path, mode: str, k: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", ENGINES, mode, *_command(tmp, shards, k)], capture_output=True,
                          text=True)
    used = [ln for ln in proc.stderr.splitlines() if ln.startswith("USED ")]
    if proc.returncode != 0 or not used:
        raise RuntimeError(f"the command failed ({proc.returncode}): {proc.stderr[-2000:]}")
    pandas = [ln.split()[1] == "True" for ln in proc.stderr.splitlines() if ln.startswith("HELPER_PANDAS ")]
    return {**json.loads(used[-1][5:]), "helpers_with_pandas": sum(pandas), "helpers": len(pandas)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-shard", type=int, default=200)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/runenv_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "runenv")
    runs: dict[str, list] = {"alembic_on": [], "alembic_off": [], "teardown_on": [], "teardown_off": [],
                             "engines_on": [], "engines_off": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        make_shards(tmp / "in", 1, args.per_shard)
        alembic_once(tmp, tmp / "in", "on", 0)  # warm-up: the Dagster home and the page cache
        for r in range(args.repeats):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                runs[f"alembic_{mode}"].append(alembic_once(tmp, tmp / "in", mode, r))
                runs[f"teardown_{mode}"].append(round(exit_once(tmp, tmp / "in", mode, r), 4))
                runs[f"engines_{mode}"].append(engines_once(tmp, tmp / "in", mode, r))
    median = {k: statistics.median(v if k.startswith("teardown") else [x["seconds"] for x in v])
              for k, v in runs.items() if not k.startswith("engines")}
    used = {m: {k: statistics.median(x[k] for x in runs[f"engines_{m}"]) for k in runs[f"engines_{m}"][0]}
            for m in ("on", "off")}
    doc = {"machine": machine(), "load_average": os.getloadavg(), "repeats": args.repeats,
           "per_shard": args.per_shard,
           "alembic_loads": {m: [x["loads"] for x in runs[f"alembic_{m}"]] for m in ("on", "off")},
           "alembic_seconds_median": {m: round(median[f"alembic_{m}"], 4) for m in ("on", "off")},
           "teardown_seconds_median": {m: round(median[f"teardown_{m}"], 4) for m in ("on", "off")},
           "engines_and_pandas_median": used,
           "runs": runs}
    dest.write(doc)
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
