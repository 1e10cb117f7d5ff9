"""The cyclic collector's passes during a helper's shards (runner/shardwork.py `work_shard`), for two codes: per
shard, each pass's generation, how many objects that generation held when it began (what the pass walks: a count,
the same on a loaded machine as on a quiet one) and its CPU seconds, beside the shard's own CPU seconds.

    python bench/bench_gc_pass.py --input <shards> --code <this checkout> --baseline <main's> --shards 4 \\
        [--results <new file>]

Each code runs in its own fresh interpreter (`python -P`, the code first on sys.path), the shards one after the
other in that process, as a helper takes them; the first shard (which loads the tokenizer) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_RUN = """
import gc, json, shutil, sys, time
import pack_assets
from pack_assets.core.settings import Settings
from pack_assets.runner.shardwork import find, work_shard
inp, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
shutil.rmtree(work, ignore_errors=True)
s = Settings.from_flat({"input_dir": inp, "work_dir": work, "output_dir": work + "/unused"})
todo = find(s, force=True)
passes, began = [], []
def on_pass(phase, info):
    if phase == "start":
        began.append((len(gc.get_objects(info["generation"])), time.process_time()))
    else:
        objects, t = began.pop()
        passes.append({"generation": info["generation"], "objects": objects,
                       "cpu_s": round(time.process_time() - t, 4)})
gc.callbacks.append(on_pass)
out = []
for key in todo.todo[:n]:
    passes.clear()
    t = time.process_time()
    samples = work_shard(s.flat(), key, True)
    out.append({"shard": key, "samples": samples, "cpu_s": round(time.process_time() - t, 3), "passes": list(passes)})
print(json.dumps({"package": pack_assets.__file__, "shards": out}))
"""


def run(code: Path, inp: Path, work: Path, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.run([sys.executable, "-P", "-c", _RUN, str(inp), str(work), str(n)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(rec["package"]).resolve().is_relative_to(code.resolve()):
        raise SystemExit(f"imported {rec['package']}, not the code under {code}")
    return rec


def summary(rec: dict) -> dict:
    later = rec["shards"][1:]
    walked = [sum(p["objects"] for p in s["passes"]) for s in later]
    return {"first_shard": rec["shards"][0],
            "later_shards": {"cpu_s": [s["cpu_s"] for s in later], "objects_walked": walked,
                             "pass_cpu_s": [round(sum(p["cpu_s"] for p in s["passes"]), 4) for s in later]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--baseline", required=True, type=Path)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path("bench/out/gc_pass"), help="scratch for the work folders")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/gc_pass_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "gc_pass")
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_avg_at_start": os.getloadavg(), "input": str(args.input), "shards": args.shards,
           "codes": {"this": str(args.code), "baseline": str(args.baseline)}}
    for name, code in (("baseline", args.baseline), ("this", args.code)):
        doc[name] = summary(run(code, args.input.resolve(), args.work.resolve() / name, args.shards))
        print(name, json.dumps(doc[name]["later_shards"]), flush=True)
    doc["load_avg_at_end"] = os.getloadavg()
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
