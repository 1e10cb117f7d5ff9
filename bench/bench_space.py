"""The write's refusal up front (`write.space.refuse_if_full`) for the newest output shard, two codes in turn.

    python bench/bench_space.py --work <a planned work folder> --code <src A> --baseline <src B> --repeats 5

Each repeat and code, in a process of its own (``--code`` / ``--baseline``: folders holding each code's
``pack_assets``): `refuse_if_full` for the plan's last output shard (what a rerun that adds one input shard
writes) with the free space reported as exactly the bytes it needs (so the planned-bytes query always runs, as on
a disk with less free space than the generous guess), timed ``--calls`` times in that process after one untimed
call; and that shard's planned bytes, which both codes must give alike. Records: the seconds of each call and
their median, the bytes, the 1-minute load average at the start, and (one more call, profiled by DuckDB: load
does not change them) the rows and Parquet row groups its queries scanned and the bytes they read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, machine  # noqa: E402

TIMED = """import json, os, sys, tempfile, time
from pathlib import Path
from pack_assets.core import faults, store
from pack_assets.core.write import space
work, out = Path(sys.argv[1]), Path(sys.argv[2])


class Profiled:
    # the caller's connection, each query's rows scanned and bytes read summed from DuckDB's own profile
    def __init__(self, con):
        self.con, self.rows, self.bytes, self.groups = con, 0, 0, 0
        self.path = os.path.join(tempfile.mkdtemp(), "q.json")

    def execute(self, sql, params=None):
        self.con.execute("PRAGMA enable_profiling = 'json'")
        self.con.execute(f"PRAGMA profiling_output = '{self.path}'")
        result = self.con.execute(sql, params) if params is not None else self.con.execute(sql)
        outer = self

        class Fetched:
            def fetchone(self):
                row = result.fetchone()
                outer.con.execute("PRAGMA disable_profiling")
                d = json.load(open(outer.path))
                outer.rows += d["query"]["total_rows_scanned"]
                outer.groups += d["query"]["total_row_groups_scanned"]
                outer.bytes += d["io"]["total_bytes_read"]
                return row
        return Fetched()


with store.connect(work, read_only=True) as con:
    last = con.execute("SELECT max(output_shard) FROM pack_plan").fetchone()[0]
    needed = space.planned_bytes(con, [last])
    faults.free_bytes = lambda _: needed  # fits, just: the bound is below it, the generous guess above it
    space.refuse_if_full(work, out, [last], con)  # (untimed: the first call binds the catalog's views)
    seconds = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        space.refuse_if_full(work, out, [last], con)
        seconds.append(round(time.perf_counter() - t, 4))
    profiled = Profiled(con)
    space.refuse_if_full(work, out, [last], profiled)
    print(json.dumps({"shard": last, "planned_bytes": needed, "seconds": seconds,
                      "median_s": sorted(seconds)[len(seconds) // 2], "rows_scanned": profiled.rows,
                      "row_groups_scanned": profiled.groups, "bytes_read": profiled.bytes}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--code", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--results", help="a new file (default: a new bench/results/space_<UTC>.json)")
    args = ap.parse_args()
    emit = Results(Path(tempfile.mkdtemp(prefix="bench_space_")), args.results, "space")  # (its scratch copy)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "work": args.work})
    for r in range(args.repeats):
        for which, src in (("A", args.code), ("B", args.baseline)) if r % 2 == 0 else (("B", args.baseline),
                                                                                      ("A", args.code)):
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, "-P", "-c", TIMED, args.work, str(Path(args.work) / "_no_output"),
                                   str(args.calls)],
                                  env={**os.environ, "PYTHONPATH": src}, check=True, capture_output=True, text=True)
            emit({"repeat": r, "which": which, "code": src, "load1_at_start": round(load, 2),
                  **json.loads(done.stdout)})


if __name__ == "__main__":
    main()
