"""Instructions per sample of an audit worker's read of one output shard (`audit._audit_shard`: the tar walk and
file digest, the pack documents, the checks, every member hashed in line), counted by valgrind's cachegrind, so
load on a shared machine does not move the figure (`perf stat` has no PMU on this VM kind).

    python bench/audit_instructions.py --work <run>/work --packed <run>/packed --code <checkout> \\
        [--code <another>] [--results <new file>]

Over a finished run's folders (bench_e2e.py's). Each checkout runs twice in a fresh interpreter under cachegrind:
the rows of the first three output shards staged (`store.staged`) and the first shard read back (warm), then
nothing more, or the second shard too; the difference over the second shard's samples is the figure, and each
run's outcome of the second shard (violations, packs, counts, file digest) is hashed: the checkouts must agree.
Valgrind's CPU has no SHA extensions, so OpenSSL's sha256 runs its plain code there: the hashing's share is larger
than on the host (compare checkouts, not shares). The output shards are only read.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_CHILD = r"""
import gc, hashlib, json, sys
from pathlib import Path
from pack_assets.core import audit, store
from pack_assets.core.expected import AUDIT_ROWS
from pack_assets.core.plan import PlanInfo
work, out, more = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
gc.set_threshold(100_000, 50, 100)  # as the command relaxes it (runenv.relax_gc)
with store.connect(work, read_only=True) as con:
    config = PlanInfo.load(con).config
    shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()][:3]
    samples = con.execute("SELECT count(*) FROM pack_plan p JOIN pack_members pm USING (pack_id) "
                          "WHERE output_shard = ?", [shards[1]]).fetchone()[0]
    with store.staged(work, AUDIT_ROWS, shards, con) as rows:
        audit._audit_shard(con, out, shards[0], config, rows)
        if more:
            v, seen, c, d = audit._audit_shard(con, out, shards[1], config, rows)
            print("outcome", hashlib.sha256(json.dumps([v, sorted(seen.items()), sorted(c.items()), d],
                                                       default=str).encode()).hexdigest())
print("samples", samples)
"""


def _count(code: Path, work: Path, packed: Path, more: bool, cg: Path) -> tuple[int, int, str | None]:
    """(instructions, the second shard's samples, its outcome's hash) of a fresh interpreter."""
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={cg}",
                           sys.executable, "-P", "-c", _CHILD, str(work), str(packed), "1" if more else "0"],
                          env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    samples = re.search(r"^samples (\d+)$", proc.stdout, re.M)
    outcome = re.search(r"^outcome (\w+)$", proc.stdout, re.M)
    if not refs or not samples:
        raise SystemExit(f"no instruction count or sample count in:\n{proc.stderr[-2000:]}\n{proc.stdout[-500:]}")
    cg.unlink(missing_ok=True)
    return int(refs.group(1).replace(",", "")), int(samples.group(1)), outcome and outcome.group(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True, help="a finished run's work folder (only read)")
    ap.add_argument("--packed", type=Path, required=True, help="its output folder (only read)")
    ap.add_argument("--code", type=Path, action="append", required=True, help="a checkout (repeat for several)")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/audit_instructions_<UTC>.json)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    out = ResultsFile(args.results, "audit_instructions")
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "work": str(args.work), "packed": str(args.packed), "load_avg_at_start": os.getloadavg(),
                 "codes": []}
    cg = Path(f"/tmp/audit_instructions_{os.getpid()}.cg")
    for code in args.code:
        one, n, _ = _count(code.resolve(), args.work.resolve(), args.packed.resolve(), False, cg)
        two, _, outcome = _count(code.resolve(), args.work.resolve(), args.packed.resolve(), True, cg)
        rec = {"code": str(code), "instructions_first_shard": one, "instructions_two_shards": two,
               "second_shard_samples": n, "instructions_per_sample": round((two - one) / n),
               "second_shard_outcome_sha256": outcome}
        doc["codes"].append(rec)
        print(rec, flush=True)
        out.write(doc)
    base = doc["codes"][0]
    for rec in doc["codes"][1:]:
        rec["against_first"] = round(rec["instructions_per_sample"] / base["instructions_per_sample"], 4)
        rec["same_outcome_as_first"] = rec["second_shard_outcome_sha256"] == base["second_shard_outcome_sha256"]
    doc["load_avg_at_end"] = os.getloadavg()
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
