"""The full audit's start: two code trees in turn, each trial in a fresh process (python -P), the output shards
warm; per trial its wall seconds, the seconds until the first output shard was read back (the `progress`
callback: what the worker processes' start, the plan checks and the staging cost before it), and the CPU
seconds of the process and its children (the audit workers, and a pool of two standing in for the command's
helpers: the recount and the figures). Each trial's record (`audited_shards.json`: stamps and file digests)
must be the same for both codes.

    python -P bench/bench_audit_start.py --work <run>/work --packed <run>/packed --code <tree> \
        --baseline <tree> [--repeats 3] [--results <new file>]

A tree is a folder holding ``pack_assets``. On a shared machine the wall seconds hold other people's work too;
the first-shard seconds are the figure this is for, the CPU seconds say whether the work itself changed. The
work folder's audit record is put back as it was at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_audit_cpu import _warm, medians, paired_parser  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

TRIAL = r"""
import json, resource, sys, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from pack_assets.core import audit
work, out = Path(sys.argv[1]), Path(sys.argv[2])
def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime
first = []
def progress(done, total, members):
    if not first:
        first.append(time.perf_counter())
if __name__ == "__main__":
    with ProcessPoolExecutor(2) as pool:
        pool.submit(int).result()
        s0, c0, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
        r = audit.run_audit(work, out, pool=pool, progress=progress)
        wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": round(wall, 2), "first_shard_s": round(first[0] - t0, 2),
                      "main_cpu_s": round(cpu(resource.RUSAGE_SELF) - s0, 2),
                      "children_cpu_s": round(cpu(resource.RUSAGE_CHILDREN) - c0, 2), "verdict": r.verdict,
                      "violations": len(r.violations), "samples": r.stats.get("samples_read")}))
"""


def trial(tree: Path, work: Path, packed: Path) -> dict:
    (work / "audited_shards.json").unlink(missing_ok=True)
    _warm(packed)
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-P", "-c", TRIAL, str(work), str(packed)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"a trial on {tree} failed:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    record = json.loads((work / "audited_shards.json").read_text())
    got["record_sha256"] = hashlib.sha256(json.dumps(
        {k: record.get(k) for k in ("shards", "digests")}, sort_keys=True).encode()).hexdigest()
    got["cpu_s"] = round(got["main_cpu_s"] + got["children_cpu_s"], 2)
    got["load_avg_1m"] = load
    return got


def main() -> None:
    args = paired_parser("audit_start").parse_args()
    out = ResultsFile(args.results, "audit_start")
    record = args.work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "work": str(args.work), "packed": str(args.packed), "code": str(args.code),
           "baseline": str(args.baseline), "page_cache": "warm (every output shard read before each trial)",
           "output_bytes": sum(p.stat().st_size for p in args.packed.glob("*.tar")), "trials": []}
    try:
        for i in range(args.repeats):
            order = (("baseline", args.baseline), ("code", args.code))
            for name, tree in order if i % 2 == 0 else order[::-1]:
                doc["trials"].append({"code": name, "repeat": i, **trial(tree, args.work, args.packed)})
                print(json.dumps(doc["trials"][-1]), flush=True)
                out.write(doc)
    finally:
        if saved is not None:
            record.write_bytes(saved)
    summary = {}
    for what in ("wall_s", "first_shard_s", "cpu_s", "main_cpu_s", "children_cpu_s"):
        summary[what + "_median"] = medians(doc["trials"], what)
        if what == "first_shard_s":  # paired: each repeat's two trials ran one after the other
            pairs = [[t[what] for t in doc["trials"] if t["repeat"] == i] for i in range(args.repeats)]
            summary["first_shard_s_pairs"] = pairs
    summary["same_record"] = len({t["record_sha256"] for t in doc["trials"]}) == 1
    summary["same_verdicts"] = len({(t["verdict"], t["violations"]) for t in doc["trials"]}) == 1
    doc["summary"] = summary
    print(json.dumps(summary, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
