"""The audit stage's memory, this code against a baseline's, in one sitting: each process's peak RSS and the tree's PSS.

    python bench/bench_audit_rss.py --work <run>/work --packed <run>/packed --baseline-src /work/main \
        --results bench/results/audit_rss_<name>.json

Over a finished run's folders (e.g. `pack-assets run` over 100 or 200 shards of /work/bench10m/shards: output
shards of ~1,000 packs of ~313 tiny samples, the 10M run's shape per output shard): for each code (this checkout,
the package at --baseline-src), in turn, a fresh process (python -P) runs the full audit (no record of an
earlier clean audit: every output shard read and checked) as the command does: its recount and figures in a pool
of two helper processes started before it, the output shards read by two spawned audit worker processes
(``--mode processes``, as at 10M where the output is over a GB) or two threads. `bench/rss.py`'s TreeSampler
samples the tree every 0.2 s: per kind of process (main, audit workers, helpers) the largest RSS seen, the
largest VmHWM (the kernel's exact high-water mark), and the whole tree's RSS and PSS summed at their peak.
Also the audit's verdict and seconds (a shared machine: seconds are provisional). The audit's record
(audited_shards.json) is put back as it was at the end.
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
from rss import TreeSampler  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
MODES = {"processes": {"workers": 2, "parallel_min_bytes": 0}, "threads": {"workers": 2, "parallel_min_bytes": 1 << 62}}

_ONE = """
import json, os, sys, time
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
from pack_assets.core import audit
pool = ProcessPoolExecutor(2)  # the command's helpers: the recount and the report's figures run there
list(pool.map(abs, range(8)))  # started before the audit: told apart from its workers by pid
helpers = sorted(pool._processes)
work, out, kw = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({"helpers": helpers}), flush=True)
t = time.perf_counter()
r = audit.run_audit(work, out, pool=pool, **kw)
print(json.dumps({"audit_s": round(time.perf_counter() - t, 2), "verdict": r.verdict,
                  "violations": len(r.violations), "samples": r.stats["samples_read"],
                  "packs_read": r.stats["packs_read"], "recounted": r.stats.get("recounted")}), flush=True)
pool.shutdown()
"""

GB = 1 << 30


def one(src: Path, work: Path, packed: Path, kw: dict) -> dict:
    """One full audit in a fresh process, its tree sampled."""
    (work / "audited_shards.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    p = subprocess.Popen([sys.executable, "-P", "-c", _ONE, str(work), str(packed), json.dumps(kw)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = TreeSampler(os.getpid())  # this process's children: the audit's process and all below it
    sampler.start()
    out, err = p.communicate()
    sampler.stop()
    if p.returncode != 0:
        raise SystemExit(err[-3000:])
    lines = [json.loads(x) for x in out.strip().splitlines() if x.startswith("{")]
    helpers = set(lines[0]["helpers"])
    kind = {pid: "main" if pid == p.pid else "helpers" if pid in helpers else "audit workers"
            for pid in sampler.procs}
    largest: dict[str, int] = {}
    for _, rss in sampler.samples:
        for pid, r in rss.items():
            largest[kind[pid]] = max(largest.get(kind[pid], 0), r)
    hwm: dict[str, int] = {}
    for pid, rec in sampler.procs.items():
        hwm[kind[pid]] = max(hwm.get(kind[pid], 0), rec["hwm"])
    return {**lines[-1],
            "largest_rss_gb": {k: round(v / GB, 3) for k, v in sorted(largest.items())},
            "largest_hwm_gb": {k: round(v / GB, 3) for k, v in sorted(hwm.items())},
            "tree_rss_gb": round(max((sum(r.values()) for _, r in sampler.samples), default=0) / GB, 3),
            "tree_pss_gb": round(max((v for _, v in sampler.pss), default=0) / GB, 3),
            "processes": {k: sum(1 for v in kind.values() if v == k) for k in sorted(set(kind.values()))}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--packed", required=True)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--mode", choices=sorted(MODES), default="processes")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--results")
    args = ap.parse_args()
    results = ResultsFile(args.results, "audit_rss")
    work, packed = Path(args.work), Path(args.packed)
    record = work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    codes = {"this": HERE, "baseline": Path(args.baseline_src)}
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "baseline_src": args.baseline_src, "mode": args.mode, "settings": MODES[args.mode],
                 "output_shards": len(list(packed.glob("*.tar"))),
                 "output_bytes": sum(p.stat().st_size for p in packed.glob("*.tar")),
                 "load_before": os.getloadavg(), "rounds": []}
    try:
        for k in range(args.repeats):
            rnd = {}
            for code in ("this", "baseline") if k % 2 == 0 else ("baseline", "this"):
                rnd[code] = one(codes[code], work, packed, MODES[args.mode])
                print(json.dumps({code: rnd[code]}), flush=True)
            rnd["load"] = os.getloadavg()
            doc["rounds"].append(rnd)
            results.write(doc)
    finally:
        if saved is not None:
            record.write_bytes(saved)
        else:
            record.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
