"""The full audit (no record of an earlier clean audit: every output shard read and checked member by member, its
file digest recorded) by two code trees in turn, each trial in a fresh process: its wall seconds and the CPU
seconds of the process and of its children (the audit workers, and a pool of two standing in for the command's
helpers: the recount and the figures run there), summed once they have ended. The page cache is kept warm (every
output shard read once before each trial), as after the writer. Each trial's record (`audited_shards.json`:
stamps and file digests) is kept and compared: the two codes must record the same.

    python bench/bench_audit_cpu.py --work <run>/work --packed <run>/packed --code <tree> --baseline <tree> \
        [--repeats 3] [--results <new file>]

A tree is a folder holding ``pack_assets``. On a shared machine compare the CPU seconds (wall seconds also hold
other people's work). The work folder's audit record is put back as it was at the end.

Then, in this process (this checkout's code), the part the change touched, both ways in turn on the same warm
output shards, thread CPU seconds: the walk of every shard (`audit._pack_parts`: every header and member read)
and its file digest, as two reads (`os.pread` per header and member, then `filedigest.file_digest`) and as one
(`filedigest.HashedReads`), the digests compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
s0, c0, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
with ProcessPoolExecutor(2) as pool:
    r = audit.run_audit(work, out, pool=pool)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": round(wall, 2), "main_cpu_s": round(cpu(resource.RUSAGE_SELF) - s0, 2),
                  "children_cpu_s": round(cpu(resource.RUSAGE_CHILDREN) - c0, 2), "verdict": r.verdict,
                  "media_checked": r.stats.get("media_members_checked"), "samples": r.stats.get("samples_read")}))
"""


def _warm(folder: Path) -> None:
    for p in sorted(folder.glob("*.tar")):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def trial(tree: Path, work: Path, packed: Path) -> dict:
    (work / "audited_shards.json").unlink(missing_ok=True)
    _warm(packed)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-P", "-c", TRIAL, str(work), str(packed)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"a trial on {tree} failed:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    record = json.loads((work / "audited_shards.json").read_text())
    got["record_sha256"] = hashlib.sha256(json.dumps(
        {k: record.get(k) for k in ("shards", "digests")}, sort_keys=True).encode()).hexdigest()
    got["digests"] = len(record.get("digests") or {})
    got["cpu_s"] = round(got["main_cpu_s"] + got["children_cpu_s"], 2)
    return got


def read_paths(packed: Path, rounds: int) -> dict:
    """Thread CPU seconds of reading every output shard and taking its digest, the two ways in turn."""
    from pack_assets.core import audit, filedigest

    files = sorted(packed.glob("*.tar"))

    def two_reads(p: Path) -> str | None:
        for _ in audit._pack_parts(p):
            pass
        return filedigest.file_digest(p)

    def one_read(p: Path) -> str | None:
        hashed = filedigest.HashedReads()
        for _ in audit._pack_parts(p, hashed):
            pass
        return hashed.digest

    _warm(packed)
    got: dict[str, list] = {"two_reads": [], "one_read": []}
    digests = set()
    for i in range(rounds):
        ways = [("two_reads", two_reads), ("one_read", one_read)]
        for name, way in ways if i % 2 == 0 else ways[::-1]:
            t = time.thread_time()
            digests.add(tuple(way(p) for p in files))
            got[name].append(round(time.thread_time() - t, 3))
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"shards": len(files), "cpu_s": got, "median": med, "one/two": round(med["one_read"] / med["two_reads"], 3),
            "same_digests": len(digests) == 1 and None not in next(iter(digests))}


def paired_parser(stem: str) -> argparse.ArgumentParser:
    """The arguments of a bench that runs two code trees in turn on one finished run: --work, --packed, --code,
    --baseline, --repeats and --results (default: a new bench/results/<stem>_<UTC>.json)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--packed", required=True, type=Path)
    ap.add_argument("--code", required=True, type=Path)
    ap.add_argument("--baseline", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help=f"a new file or folder (default: a new bench/results/{stem}_<UTC>.json)")
    return ap


def medians(trials: list[dict], what: str) -> dict:
    """Each code's median of ``what`` over its trials, and their ratio."""
    med = {n: statistics.median(t[what] for t in trials if t["code"] == n) for n in ("baseline", "code")}
    return {**med, "code/baseline": round(med["code"] / med["baseline"], 3)}


def main() -> None:
    args = paired_parser("audit_cpu").parse_args()
    out = ResultsFile(args.results, "audit_cpu")
    record = args.work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "work": str(args.work), "packed": str(args.packed), "code": str(args.code),
           "baseline": str(args.baseline), "page_cache": "warm (every output shard read before each trial)",
           "output_bytes": sum(p.stat().st_size for p in args.packed.glob("*.tar")),
           "load_avg_at_start": os.getloadavg(), "trials": []}
    try:
        for i in range(args.repeats):
            order = (("baseline", args.baseline), ("code", args.code))
            for name, tree in order if i % 2 == 0 else order[::-1]:
                doc["trials"].append({"code": name, "repeat": i, **trial(tree, args.work, args.packed)})
                print(json.dumps(doc["trials"][-1]), flush=True)
    finally:
        if saved is not None:
            record.write_bytes(saved)
    doc["load_avg_at_end"] = os.getloadavg()
    summary = {}
    for what in ("wall_s", "cpu_s", "main_cpu_s", "children_cpu_s"):
        summary[what + "_median"] = medians(doc["trials"], what)
    summary["same_record"] = len({t["record_sha256"] for t in doc["trials"]}) == 1
    summary["verdicts"] = sorted({t["verdict"] for t in doc["trials"]})
    doc["summary"] = summary
    doc["read_paths"] = read_paths(args.packed, max(3, args.repeats))
    print(json.dumps({**summary, "read_paths": doc["read_paths"]}, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
