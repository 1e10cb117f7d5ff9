"""The shard stage alone (scan + count, on the command's helper processes, as `pack-assets run` hands them the
shards) against `sha256sum` and Python's hashlib of the same bytes, in the same run; with ``--baseline`` also
another checkout's code on the same input, the two alternating, and their files compared (they must match).

    python bench/bench_shard_stage.py --data bench/out/shard_stage --shards 20 --per-shard 5000 --image-kb 15 \\
        --baseline /path/to/main --repeats 2     # a new bench/results/shard_stage_<UTC>.json

Makes the input under <data>/shards if it is not there (bench/common.py make_shards: one JPEG of --image-kb
per sample, the e2e benchmark's shape; ``--images 0``: text-only samples, the same texts). Each stage run is a
fresh process with a fresh work folder: the helpers
forked as the command forks them (one per core, or --jobs), every shard scanned and counted (force). With
--drop-caches (root) the page cache is dropped before each timed step (never on a machine others measure on);
each record says whether it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_shard_stage import compare  # noqa: E402
from common import ResultsFile, drop_caches, hashlib_seconds, machine, make_shards, require_free, timed  # noqa: E402

# run in a fresh interpreter with the code under test first on sys.path: the helpers, the shards, the wait
_STAGE = """
import json, resource, sys, time
import pack_assets
from pack_assets.core.settings import Settings
from pack_assets.runner import shardwork
from pack_assets.runner.procs import Helpers
inp, work, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = Settings.from_flat({"input_dir": inp, "work_dir": work, "output_dir": work + "/unused"})
t0 = time.perf_counter()
todo = shardwork.find(s, force=True)
failed = []
with Helpers(shardwork.helpers_for(todo, jobs)) as helpers:
    shardwork.start(todo, s, helpers, force=True)
    todo.wait(list(todo.todo), lambda key, n, err: failed.append(f"{key}: {err}") if err else None)
seconds = time.perf_counter() - t0
cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": seconds, "helpers_cpu_s": cpu.ru_utime + cpu.ru_stime, "shards": len(todo.todo),
                  "helpers": helpers.n, "failed": failed, "package": pack_assets.__file__}))
"""


def stage(code: Path, inp: Path, work: Path, jobs: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    # -P: `python -c` puts the working folder first on sys.path, so run from a checkout it would import that
    # checkout's package whatever PYTHONPATH says (both codes the same one)
    proc = subprocess.run([sys.executable, "-P", "-c", _STAGE, str(inp), str(work), str(jobs)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(rec["package"]).resolve().is_relative_to(code):
        raise SystemExit(f"the stage imported {rec['package']}, not the code under {code}")
    if rec["failed"]:
        raise SystemExit(f"{code}: shards failed: {rec['failed'][:3]}")
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="bench/out/shard_stage", help="scratch: <data>/shards and the work folders")
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--per-shard", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=15)
    ap.add_argument("--images", type=int, default=1, help="images per sample (0: text-only samples)")
    ap.add_argument("--jobs", type=int, default=0, help="helper processes (0: one per core, as the command)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--code", type=Path, help="the checkout timed as 'this' (default: the one holding this script)")
    ap.add_argument("--baseline", type=Path, help="another checkout (its folder, holding pack_assets/) to time too")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before each timed step (root)")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/shard_stage_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "shard_stage")
    data = Path(args.data).resolve()
    inp = data / "shards"
    require_free(data, 2.5 * args.shards * args.per_shard * (args.image_kb * 1024 + 1500))
    files = make_shards(inp, args.shards, args.per_shard, args.image_kb, seed=7, images=args.images)
    if sorted(inp.glob("*.tar")) != sorted(files):  # the stage scans the whole folder: only these shards in it
        raise SystemExit(f"{inp} holds other shards than the {len(files)} asked for: use another --data")
    here = (args.code or Path(__file__).resolve().parents[1]).resolve()
    codes = {"this": here, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "load_avg_at_start": os.getloadavg(), "samples": args.shards * args.per_shard,
                 "bytes": sum(p.stat().st_size for p in files), "shards": len(files), "image_kb": args.image_kb,
                 "images_per_sample": args.images,
                 "codes": {k: str(v) for k, v in codes.items()}, "runs": []}
    runs = doc["runs"]
    for r in range(args.repeats):
        cold = args.drop_caches and drop_caches()
        runs.append({"what": "sha256sum", "repeat": r, "cache_dropped": cold,
                     "seconds": round(timed(["sha256sum", *map(str, files)]), 2)})
        cold = args.drop_caches and drop_caches()
        runs.append({"what": "hashlib.sha256", "repeat": r, "cache_dropped": cold,
                     "seconds": round(hashlib_seconds(files), 2)})
        for name, code in (codes.items() if r % 2 == 0 else reversed(codes.items())):
            cold = args.drop_caches and drop_caches()
            rec = stage(code, inp, data / f"work_{name}", args.jobs)
            runs.append({"what": f"shard stage, {name}", "repeat": r, "cache_dropped": cold,
                         "seconds": round(rec["seconds"], 2), "helpers_cpu_s": round(rec["helpers_cpu_s"], 2),
                         "helpers": rec["helpers"], "cpu_us_per_sample": round(1e6 * rec["helpers_cpu_s"]
                                                                               / doc["samples"], 1)})
            print(json.dumps(runs[-1]), flush=True)
        out.write(doc)
    med = {w: statistics.median(x["seconds"] for x in runs if x["what"] == w) for w in {x["what"] for x in runs}}
    doc["median_seconds"] = med
    # the helpers' CPU per sample: on a shared machine steadier than wall time
    cpu = {w: statistics.median(x["cpu_us_per_sample"] for x in runs if x["what"] == w) for w in med if "stage" in w}
    doc["median_cpu_us_per_sample"] = cpu
    doc["ratios"] = {f"{w} / sha256sum": round(s / med["sha256sum"], 3) for w, s in med.items() if "stage" in w}
    doc["ratios"].update({f"{w} / hashlib": round(s / med["hashlib.sha256"], 3) for w, s in med.items()
                          if "stage" in w})
    if "baseline" in codes:
        doc["ratios"]["this / baseline"] = round(med["shard stage, this"] / med["shard stage, baseline"], 3)
        doc["ratios"]["this / baseline, helpers' CPU"] = round(cpu["shard stage, this"]
                                                               / cpu["shard stage, baseline"], 3)
        problems = compare(data / "work_baseline", data / "work_this", "qwen3-vl")
        doc["same_files_as_baseline"] = not problems
        doc["differences"] = problems[:5]
    doc["load_avg_at_end"] = os.getloadavg()
    print(json.dumps({k: doc[k] for k in ("median_seconds", "median_cpu_us_per_sample", "ratios")}, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
