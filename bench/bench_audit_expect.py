"""An audit worker's per-sample CPU on one finished run, two code trees in turn (fresh processes, python -P): the
output shard's expectations built from the staged rows (`expected.shard_expectations`), and the whole shard read
back (`audit._audit_shard`, members hashed in line as a worker process does), thread CPU seconds per sample, the
least of ``--best`` passes over the first ``--shards`` output shards (warm: one shard done before). Each code's
expectations and shard outcomes (violations, counts, file digests) are hashed: they must be equal.

    python -P bench/bench_audit_expect.py --work <run>/work --packed <run>/packed --code <tree> --baseline <tree> \
        [--shards 2] [--best 3] [--repeats 4] [--results <new file>]

A tree is a folder holding ``pack_assets``. Thread CPU is what compares on a shared machine (wall seconds also hold
other people's work); the load average is recorded before each trial.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_audit_cpu import medians, paired_parser  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

TRIAL = r"""
import gc, hashlib, json, pickle, sys, time
from pathlib import Path
from pack_assets.core import audit, store
from pack_assets.core.expected import AUDIT_ROWS, shard_expectations
from pack_assets.core.plan import PlanInfo
work, out, n_shards, best_of = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gc.set_threshold(100_000, 50, 100)  # as the command relaxes it (runenv.relax_gc)

def least(fn):
    best = None
    for _ in range(best_of):
        t = time.thread_time()
        got = fn()
        best = min(best or 1e9, time.thread_time() - t)
    return best, got

with store.connect(work, read_only=True) as con:
    config = PlanInfo.load(con).config
    shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
    shards = shards[:n_shards + 1]
    with store.staged(work, AUDIT_ROWS, shards, con) as rows:
        audit._audit_shard(con, out, shards[0], config, rows)  # warm
        shards = shards[1:]
        exp_s, exp = least(lambda: [shard_expectations(con, n, rows) for n in shards])
        shard_s, outcome = least(lambda: [audit._audit_shard(con, out, n, config, rows) for n in shards])
samples = sum(len(s) for _, s, _ in exp)
print(json.dumps({
    "samples": samples, "expectations_us": round(exp_s / samples * 1e6, 3),
    "audit_shard_us": round(shard_s / samples * 1e6, 3),
    "expectations_sha256": hashlib.sha256(pickle.dumps(
        [(sorted(p.items()), sorted(s.items()), sorted(m.items())) for p, s, m in exp])).hexdigest(),
    "outcome_sha256": hashlib.sha256(json.dumps(
        [(v, sorted(seen.items()), sorted(c.items()), d) for v, seen, c, d in outcome], default=str
    ).encode()).hexdigest()}))
"""


def trial(tree: Path, args) -> dict:
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-P", "-c", TRIAL, str(args.work), str(args.packed), str(args.shards),
                           str(args.best)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a trial on {tree} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load_avg_1m": load}


def main() -> None:
    ap = paired_parser("audit_expect")  # --repeats: pairs of trials
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--best", type=int, default=3)
    args = ap.parse_args()
    args.pairs = args.repeats
    out = ResultsFile(args.results, "audit_expect")
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "work": str(args.work),
           "packed": str(args.packed), "code": str(args.code), "baseline": str(args.baseline),
           "shards": args.shards, "best_of": args.best, "trials": []}
    for i in range(args.pairs):
        order = (("baseline", args.baseline), ("code", args.code))
        for name, tree in order if i % 2 == 0 else order[::-1]:
            doc["trials"].append({"code": name, "pair": i, **trial(tree, args)})
            print(json.dumps(doc["trials"][-1]), flush=True)
            out.write(doc)
    summary = {}
    for what in ("expectations_us", "audit_shard_us"):
        pairs = [{t["code"]: t[what] for t in doc["trials"] if t["pair"] == i} for i in range(args.pairs)]
        summary[what] = {**medians(doc["trials"], what),
                         "pair_ratios": [round(p["code"] / p["baseline"], 3) for p in pairs]}
    for what in ("expectations_sha256", "outcome_sha256"):
        summary["same_" + what.split("_")[0]] = len({t[what] for t in doc["trials"]}) == 1
    doc["summary"] = summary
    print(json.dumps(summary, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
