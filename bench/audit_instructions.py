"""Instructions per sample of an audit worker's read of one output shard (`audit._audit_shard`: the tar walk and
file digest, the pack documents, the checks, every member hashed in line; not the shard's expectations, built
beforehand), counted by valgrind's cachegrind, so load on a shared machine does not move the figure (`perf stat`
has no PMU on this VM kind).

    python bench/audit_instructions.py --work <run>/work --packed <run>/packed --code <checkout> \\
        [--code <another>] [--results <new file>]

Over a finished run's folders (bench_e2e.py's). For each checkout, the second output shard's expectations are
built (`expected.shard_expectations` from the staged rows, DuckDB's work: slow under valgrind) and pickled; then
two fresh interpreters under cachegrind load them, one reading nothing, one reading the shard back with them: the
difference over the shard's samples is the figure, and the outcome (violations, packs, counts, file digest) is
hashed: the checkouts must agree. ``--digests-ahead``: the members' sha256 (the contract, the same work in every
checkout) taken beforehand and given in the packs' order as the worker's hasher thread gives them, not counted.
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

_PREP = r"""
import pickle, sys
from pathlib import Path
from pack_assets.core import audit, store
from pack_assets.core.expected import AUDIT_ROWS, shard_expectations
from pack_assets.core.plan import PlanInfo
work, to = Path(sys.argv[1]), sys.argv[2]
with store.connect(work, read_only=True) as con:
    config = PlanInfo.load(con).config
    shards = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()][:2]
    with store.staged(work, AUDIT_ROWS, shards, con) as rows:
        expectations = shard_expectations(con, shards[1], rows)
digests = [audit._digests(parts) for _, parts in audit._pack_parts(Path(sys.argv[3]) / shards[1])]
with open(to, "wb") as f:
    pickle.dump((shards[1], expectations, config, digests), f)
"""

_CHILD = r"""
import gc, hashlib, json, pickle, sys
from pathlib import Path
from pack_assets.core import audit
out, held, more, ahead = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
with open(held, "rb") as f:
    name, expectations, config, digests = pickle.load(f)
audit.shard_expectations = lambda con, name, rows=None: expectations  # as staged, built beforehand


class Ahead:  # the members' digests taken beforehand, given in the packs' order as a hasher thread gives them
    def __init__(self, digests):
        self.digests = iter(digests)

    def submit(self, fn, parts):
        return self

    def result(self):
        return next(self.digests)


gc.set_threshold(100_000, 50, 100)  # as the command relaxes it (runenv.relax_gc)
if more:
    v, seen, c, d = audit._audit_shard(None, out, name, config, hasher=Ahead(digests) if ahead else None)
    print("outcome", hashlib.sha256(json.dumps([v, sorted(seen.items()), sorted(c.items()), d],
                                               default=str).encode()).hexdigest())
print("samples", len(expectations[1]))
"""


def _count(code: Path, held: Path, packed: Path, more: bool, cg: Path, ahead: bool) -> tuple[int, int, str | None]:
    """(instructions, the shard's samples, its outcome's hash) of a fresh interpreter."""
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={cg}",
                           sys.executable, "-P", "-c", _CHILD, str(packed), str(held), "1" if more else "0",
                           "1" if ahead else "0"],
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
    ap.add_argument("--digests-ahead", action="store_true",
                    help="the members' sha256 taken beforehand, not counted (the same work in every checkout)")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/audit_instructions_<UTC>.json)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    out = ResultsFile(args.results, "audit_instructions")
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "work": str(args.work), "packed": str(args.packed), "load_avg_at_start": os.getloadavg(),
                 "members_hashed": "beforehand, not counted" if args.digests_ahead else "in line, counted",
                 "codes": []}
    cg, held = Path(f"/tmp/audit_instructions_{os.getpid()}.cg"), Path(f"/tmp/audit_instructions_{os.getpid()}.pkl")
    for code in args.code:
        env = {**os.environ, "PYTHONPATH": str(code.resolve())}
        subprocess.run([sys.executable, "-P", "-c", _PREP, str(args.work.resolve()), str(held),
                        str(args.packed.resolve())], env=env, check=True)
        one, n, _ = _count(code.resolve(), held, args.packed.resolve(), False, cg, args.digests_ahead)
        two, _, outcome = _count(code.resolve(), held, args.packed.resolve(), True, cg, args.digests_ahead)
        held.unlink()
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
