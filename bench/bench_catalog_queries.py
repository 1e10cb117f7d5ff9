"""The whole-catalog pieces of the plan, write and audit stages at scale, this code against a baseline copy of the
code, each piece in a fresh process (python -P), the two codes alternating in each round:

    python -P bench/bench_catalog_queries.py --work <a counted, planned work folder> --lengths <lengths.npy> \
        --baseline-src <dir holding the baseline's pack_assets> --rounds 1 --results bench/results/<new file>

- ``sweep``: the what-if sweep (`sweep.simulate`, max lengths 4,096-32,768 x {bfd, next_fit}) on the lengths in
  ``--lengths`` (e.g. the 10M run's, one int64 per sample): its process's VmHWM over what it held before, and CPU.
- ``digests``: the writer's catalog digests of every output shard (`write.record.shard_digests`, no record): CPU,
  wall and VmHWM (at the catalog's DuckDB limit).
- ``staging``: the audit's rows staged for every output shard (`store.staged` of `expected.AUDIT_ROWS`) as the
  code's `audit.audit` stages them (held to its `BESIDE_MEMORY` where the code has one, else the catalog's 1GB);
  its answer is the count of staged samples rows (one per planned sample; the codes' queries differ).

Each piece's result is compared between the codes (the packs per max length and algorithm; the digests; the
staged rows' count), so a faster piece that gives other answers shows. CPU is the process's (DuckDB's threads
included). Writes a new file under bench/results (--results).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

PIECE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
piece, work, lengths = sys.argv[2], Path(sys.argv[3]), sys.argv[4]

def hwm():
    return int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM")).split()[1]) * 1024

out = {}
if piece == "sweep":
    import numpy as np
    from pack_assets.core.binpack import Caps
    from pack_assets.core.sweep import simulate
    held = np.load(lengths)
    before, t, c = hwm(), time.perf_counter(), time.process_time()
    r = simulate(held, [4096, 8192, 16384, 32768], ["bfd", "next_fit"], Caps(), 0)
    out["answer"] = [[x["max_len"], x["algorithm"], x["packs"], x["dropped"], x["max_samples_per_pack"]]
                     for x in r["results"]]
else:
    from pack_assets.core import store
    con = store.connect(work, read_only=True)
    before, t, c = hwm(), time.perf_counter(), time.process_time()
    if piece == "digests":
        from pack_assets.core.write.record import shard_digests
        digests, _ = shard_digests(con, None)
        out["answer"] = sorted([n, *d] for n, d in digests.items())
    else:
        from pack_assets.core import audit
        from pack_assets.core.expected import AUDIT_ROWS
        shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
        staged = getattr(audit, "_staged", None)
        with (staged(con, work, shards) if staged is not None else store.staged(work, AUDIT_ROWS, shards, con)) as rows:
            out["wall_s_staged"] = round(time.perf_counter() - t, 2)
            files = sorted((rows.root / "samples").rglob("*.parquet"))
            count = "SELECT count(*) FROM read_parquet('{}')"
            out["answer"] = {"samples_rows": sum(con.execute(count.format(f)).fetchall()[0][0] for f in files)}
        out["queries"] = sorted(AUDIT_ROWS)
out.update(wall_s=round(time.perf_counter() - t, 2), cpu_s=round(time.process_time() - c, 2),
           hwm_before_mib=round(before / 2**20, 1), hwm_mib=round(hwm() / 2**20, 1))
print(json.dumps(out))
"""


def one(src: str, piece: str, work: str, lengths: str) -> dict:
    done = subprocess.run([sys.executable, "-P", "-c", PIECE, src, piece, work, lengths], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pieces", default="sweep,digests,staging")
    ap.add_argument("--results")
    args = ap.parse_args()
    results, records = ResultsFile(args.results, "catalog_queries"), []
    records.append({"machine": machine(), "work": args.work, "lengths": args.lengths,
                    "baseline_src": args.baseline_src})
    results.write(records)
    codes = {"this": str(REPO), "baseline": args.baseline_src}
    for r in range(args.rounds):
        for piece in args.pieces.split(","):
            order = ["this", "baseline"] if r % 2 == 0 else ["baseline", "this"]
            got = {code: one(codes[code], piece, args.work, args.lengths) for code in order}
            same = got["this"].pop("answer") == got["baseline"].pop("answer")
            row = {"round": r, "piece": piece, "same_answer": same,
                   **{f"{code}_{k}": v for code in order for k, v in got[code].items()},
                   "this_to_baseline_cpu": round(got["this"]["cpu_s"] / got["baseline"]["cpu_s"], 3)}
            records.append(row)
            results.write(records)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
