"""The write's refusal up front (`write.space.refuse_if_full`) for the newest output shard, two codes in turn.

    python bench/bench_space.py --work <a planned work folder> --code <src A> --baseline <src B> --repeats 5

Each repeat and code, in a process of its own (``--code`` / ``--baseline``: folders holding each code's
``pack_assets``): `refuse_if_full` for the plan's last output shard (what a rerun that adds one input shard
writes) with the free space reported as 1 byte past the bound it needs (so the planned-bytes query always runs,
as on a disk with less free space than the generous guess), timed; and that shard's planned bytes, which both
codes must give alike. Records: seconds per repeat, the bytes, the 1-minute load average at the start.
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

TIMED = """import json, sys, time
from pathlib import Path
from pack_assets.core import faults, store
from pack_assets.core.write import space
work, out = Path(sys.argv[1]), Path(sys.argv[2])
with store.connect(work, read_only=True) as con:
    last = con.execute("SELECT max(output_shard) FROM pack_plan").fetchone()[0]
    needed = space.planned_bytes(con, [last])
    faults.free_bytes = lambda _: needed  # fits, just: the bound is below it, the generous guess above it
    t = time.perf_counter()
    space.refuse_if_full(work, out, [last], con)
    print(json.dumps({"shard": last, "planned_bytes": needed, "seconds": time.perf_counter() - t}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--code", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", help="a new file (default: a new bench/results/space_<UTC>.json)")
    args = ap.parse_args()
    emit = Results(Path(tempfile.mkdtemp(prefix="bench_space_")), args.results, "space")  # (its scratch copy)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "work": args.work})
    for r in range(args.repeats):
        for which, src in (("A", args.code), ("B", args.baseline)) if r % 2 == 0 else (("B", args.baseline),
                                                                                      ("A", args.code)):
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, "-c", TIMED, args.work, str(Path(args.work) / "_no_output")],
                                  env={**os.environ, "PYTHONPATH": src}, check=True, capture_output=True, text=True)
            emit({"repeat": r, "which": which, "code": src, "load1_at_start": round(load, 2),
                  **json.loads(done.stdout)})


if __name__ == "__main__":
    main()
