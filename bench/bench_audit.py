"""The audit stage alone, cold, this code against a baseline's, in one sitting, in turn.

    python bench/bench_audit.py --work <run>/work --packed <run>/packed --baseline-src /work/main --repeats 2

Over a finished run's folders (e.g. the ones bench_e2e.py leaves): each round runs, for each code (this
checkout, and the package at --baseline-src), in a fresh process with the page cache dropped before it (root;
``--warm``: kept, every file of the run read once before it instead):
the full audit (no record of an earlier clean audit: every output shard read and checked member by member) and
then the default audit after it (scope "all": every output shard unchanged since that clean audit, hashed
against its recorded file digest). ``--prehash``: the second also given the digests computed beforehand in the
same process (`filedigest.EarlyDigests`, as the pack assets start it while the plan and the writer run), timed apart.
Writes a new results file under bench/results (--results). The audit's record (audited_shards.json) is put
back as it was at the end.
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
from common import ResultsFile, drop_caches, machine  # noqa: E402

HERE = Path(__file__).resolve().parents[1]

_ONE = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
from pack_assets import __version__
from pack_assets.core import audit
pool = ProcessPoolExecutor(2)  # as the command's helpers: the recount and the figures run there
work, out, prehash = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
kw = {"pool": pool}
if prehash:
    from pack_assets.core import filedigest
    t = time.perf_counter()
    early = filedigest.EarlyDigests()
    early.start(out, work / audit.AUDITED, __version__)
    for p in sorted(out.glob("*.tar")):
        early.digest(p)  # waits for each
    kw["early"] = early
    pre_s = time.perf_counter() - t
else:
    pre_s = 0.0
t = time.perf_counter()
r = audit.run_audit(work, out, **kw)
print(json.dumps({"audit_s": round(time.perf_counter() - t, 2), "prehash_s": round(pre_s, 2),
                  "process_s": round(time.perf_counter() - t0, 2), "verdict": r.verdict,
                  "trusted": r.stats.get("output_shards_trusted"), "hashed": r.stats.get("output_shards_hashed"),
                  "media_checked": r.stats.get("media_members_checked")}))
"""


def _read_through(*folders: Path) -> None:
    """Every file under ``folders`` read once, so a warm run finds them in the page cache."""
    for folder in folders:
        for p in folder.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    while f.read(1 << 24):
                        pass


def one(src: Path, work: Path, packed: Path, prehash: bool, warm: bool = False) -> dict:
    cold = False if warm else drop_caches()
    if warm:
        _read_through(work, packed)
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    # -P: without it `-c` puts the working folder first on sys.path, and a checkout there shadows PYTHONPATH
    p = subprocess.run([sys.executable, "-P", "-c", _ONE, str(work), str(packed), "1" if prehash else "0"],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    return {**rec, "wall_s": round(time.perf_counter() - t0, 2), "page_cache": "dropped" if cold else "warm"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--packed", required=True)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prehash", action="store_true", help="also this code's default audit given early digests")
    ap.add_argument("--warm", action="store_true", help="page cache kept and filled before each run (not dropped)")
    ap.add_argument("--results")
    args = ap.parse_args()
    results = ResultsFile(args.results, "audit")
    work, packed = Path(args.work), Path(args.packed)
    record = work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    codes = {"this": HERE, "baseline": Path(args.baseline_src)}
    rounds = []
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "output_bytes": sum(p.stat().st_size for p in packed.glob("*.tar")), "baseline_src": args.baseline_src,
           "load_before": os.getloadavg(), "page_cache": "warm" if args.warm else "dropped", "rounds": rounds}
    try:
        for k in range(args.repeats):
            order = ("this", "baseline") if k % 2 == 0 else ("baseline", "this")
            rnd = {}
            for code in order:
                record.unlink(missing_ok=True)
                rnd[f"{code} full"] = one(codes[code], work, packed, False, args.warm)
                rnd[f"{code} default after it"] = one(codes[code], work, packed, False, args.warm)
                if args.prehash and code == "this":
                    rnd["this default, digests taken before"] = one(codes[code], work, packed, True, args.warm)
                print(json.dumps({code: {k2: v for k2, v in rnd.items() if k2.startswith(code)}}), flush=True)
            rnd["load"] = os.getloadavg()
            rounds.append(rnd)
            results.write(doc)
        for label in rounds[0]:
            if label != "load":
                doc[f"median {label} audit_s"] = statistics.median(r[label]["audit_s"] for r in rounds)
        doc["ratio full this/baseline"] = round(
            doc["median this full audit_s"] / doc["median baseline full audit_s"], 3)
        doc["ratio default this/baseline"] = round(
            doc["median this default after it audit_s"] / doc["median baseline default after it audit_s"], 3)
        print(json.dumps({k: v for k, v in doc.items() if k != "rounds"}, indent=1))
        results.write(doc)
    finally:
        if saved is not None:
            record.write_bytes(saved)
        shutil.rmtree(work / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
