"""Instructions of one warm `run_write` (one writer process, copy mode) on bench_write.py's set, counted by
valgrind's cachegrind, so load on a shared machine does not move the figure (`perf stat` needs a PMU this VM
kind lacks). User space only: the kernel's copies (pread, writev, fsync) are not counted, the writer's own
work is: Python, DuckDB's queries (all its threads), SQLite, numpy, Arrow.

    python bench/write_instructions.py --data <bench_write.py's --out> --code <checkout> [--code <another>] \\
        --out <scratch> [--runs 2] [--results <new file>]

Each checkout runs twice in a fresh interpreter under cachegrind: run_write once, then 1 + --runs times, each
into an emptied output folder; the difference over --runs is the figure (a warm writer's run: imports, first
calls and caches excluded). Valgrind's CPU has no SHA extensions, so OpenSSL's sha256 (DuckDB's sha256() of the
conversations, the shard fingerprint) runs its plain code there: compare checkouts, not shares.
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
import shutil, sys
from pathlib import Path
from pack_assets.core.write import run_write
inp, work, out, n = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
for _ in range(n):
    shutil.rmtree(out, ignore_errors=True)
    w = run_write(work, inp, out, workers=1)
shutil.rmtree(out, ignore_errors=True)
print("bytes", w.bytes)
"""


def _count(code: Path, inp: Path, work: Path, out: Path, n: int) -> int:
    """Instructions of a fresh interpreter running run_write ``n`` times."""
    cg = out.with_suffix(".cg")
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={cg}",
                           sys.executable, "-P", "-c", _CHILD, str(inp), str(work), str(out), str(n)],
                          env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if not refs:
        raise SystemExit(f"no instruction count in:\n{proc.stderr[-2000:]}")
    cg.unlink(missing_ok=True)
    return int(refs.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="bench_write.py's --out (its set-* and work)")
    ap.add_argument("--code", type=Path, action="append", required=True, help="a checkout (repeat for several)")
    ap.add_argument("--out", type=Path, required=True, help="a scratch folder (emptied)")
    ap.add_argument("--runs", type=int, default=2, help="warm runs counted (the difference's)")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/write_instructions_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "write_instructions")
    data = args.data.resolve()
    inp = next(p for p in sorted(data.glob("set-*")) if p.is_dir())
    sources = sum(1 for _ in inp.glob("*.tar"))
    rows = []
    for code in args.code:
        out = args.out.resolve() / "packed"
        shutil.rmtree(args.out, ignore_errors=True)
        args.out.mkdir(parents=True)
        t = time.perf_counter()
        one = _count(code.resolve(), inp, data / "work", out, 1)
        more = _count(code.resolve(), inp, data / "work", out, 1 + args.runs)
        rows.append({"code": str(code), "instructions_first_run_process": one,
                     "instructions_per_warm_run": (more - one) // args.runs,
                     "seconds": round(time.perf_counter() - t, 1)})
        print(rows[-1], flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    base = rows[0]["instructions_per_warm_run"]
    for r in rows:
        r["to_first_code"] = round(r["instructions_per_warm_run"] / base, 4)
    dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
                "config": {k: str(v) for k, v in vars(args).items()}, "set": inp.name, "source_shards": sources,
                "rows": rows})


if __name__ == "__main__":
    main()
