"""Whether the command's two process-wide changes (pack_assets/runner/runenv.py) still pay, each measured in
`pack-assets run` on one small shard, with the change and without it, in the same run, order alternating:

- `cache_alembic_scripts`: how many times alembic loads Dagster's migration scripts in one command, and the
  seconds spent loading them (`ScriptDirectory._load_revisions`, timed inside the command);
- `exit_without_teardown`: the seconds from the command's last line of work to the end of its process
  (os._exit, against the interpreter's own exit and teardown), measured outside it.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-shard", type=int, default=200)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/runenv_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "runenv")
    runs: dict[str, list] = {"alembic_on": [], "alembic_off": [], "teardown_on": [], "teardown_off": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        make_shards(tmp / "in", 1, args.per_shard)
        alembic_once(tmp, tmp / "in", "on", 0)  # warm-up: the Dagster home and the page cache
        for r in range(args.repeats):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                runs[f"alembic_{mode}"].append(alembic_once(tmp, tmp / "in", mode, r))
                runs[f"teardown_{mode}"].append(round(exit_once(tmp, tmp / "in", mode, r), 4))
    median = {k: statistics.median(v if k.startswith("teardown") else [x["seconds"] for x in v])
              for k, v in runs.items()}
    doc = {"machine": machine(), "load_average": os.getloadavg(), "repeats": args.repeats,
           "per_shard": args.per_shard,
           "alembic_loads": {m: [x["loads"] for x in runs[f"alembic_{m}"]] for m in ("on", "off")},
           "alembic_seconds_median": {m: round(median[f"alembic_{m}"], 4) for m in ("on", "off")},
           "teardown_seconds_median": {m: round(median[f"teardown_{m}"], 4) for m in ("on", "off")},
           "runs": runs}
    dest.write(doc)
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
