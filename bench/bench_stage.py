"""The rows the writer and the audit read per output shard: one query per shard (before session 29) against
one pass filed by shard for all but the writer's conversations (`store.staged`), and DuckDB's own
`COPY ... PARTITION_BY` of every query, conversations included (tried, not used).

    python bench/bench_stage.py --work /tmp/e2e1m/work --input /tmp/e2e1m/shards  # a new bench/results/stage_<UTC>.json

Needs a planned work folder (e.g. the one bench_e2e.py leaves). Each variant runs in a fresh process, so its
peak RSS (ru_maxrss) is its own; per-shard figures are the median over --sample shards, totals multiply it
by the number of output shards.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

VARIANTS = ("per_shard", "staged", "copy_partition_by")


def measure(variant: str, stage: str, work: Path, inp: Path, sample: int) -> dict:
    from pack_assets.core import audit, expected, store
    from pack_assets.core.write import jobs as write

    queries = write.WRITE_ROWS if stage == "write" else audit.AUDIT_ROWS
    conversations = write.WRITE_CONVERSATIONS if stage == "write" else {}  # the audit stages its own
    con = store.connect(work, read_only=True)
    names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
    picked = names[:: max(1, len(names) // sample)][:sample]

    def load(name: str, rows=None):
        if stage == "write":
            return write.shard_job(con, inp, name, rows)
        return expected.shard_expectations(con, name, rows)

    def per_shard(rows=None) -> list[float]:
        took = []
        for n in picked:
            t = time.perf_counter()
            load(n, rows)
            took.append(time.perf_counter() - t)
        return took

    rec: dict = {"variant": variant, "stage": stage, "output_shards": len(names),
                 "samples": con.execute("SELECT count(*) FROM pack_members").fetchall()[0][0]}
    if variant == "per_shard":
        took = per_shard()
    elif variant == "staged":
        t = time.perf_counter()
        with store.staged(work, queries, names, con) as rows:
            rec["gather_s"] = round(time.perf_counter() - t, 2)
            took = per_shard(rows)
    else:
        folder = Path(tempfile.mkdtemp(dir=work, prefix=".bench-copy-"))
        try:
            t = time.perf_counter()
            for q, sql in {**queries, **conversations}.items():
                target = (folder / q).as_posix()
                con.execute(f"COPY ({sql.replace('{shards}', 'true')}) TO '{target}' "
                            f"(FORMAT parquet, PARTITION_BY (output_shard))")
            rec["gather_s"] = round(time.perf_counter() - t, 2)
            took = []
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if took:
        rec["per_shard_s"] = round(statistics.median(took), 3)
        rec["total_s"] = round(rec.get("gather_s", 0) + rec["per_shard_s"] * len(names), 1)
    rec["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--sample", type=int, default=5, help="output shards timed per variant")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/stage_<UTC>.json)")
    ap.add_argument("--one", nargs=2, metavar=("VARIANT", "STAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    work, inp = Path(args.work).resolve(), Path(args.input).resolve()
    if args.one:
        print(json.dumps(measure(*args.one, work, inp, args.sample)))
        return
    dest = ResultsFile(args.results, "stage")
    records = []
    for stage in ("write", "audit"):
        for variant in VARIANTS:
            proc = subprocess.run([sys.executable, __file__, "--work", str(work), "--input", str(inp), "--sample",
                                   str(args.sample), "--one", variant, stage], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            records.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(records[-1]), flush=True)
    dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "work": str(work), "records": records})


if __name__ == "__main__":
    main()
