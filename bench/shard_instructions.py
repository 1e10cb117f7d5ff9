"""Instructions per sample of one helper's shard work (`shardwork.work_shard`: scan, then count from memory),
counted by valgrind's cachegrind, so load on a shared machine does not move the figure. `perf stat -e
instructions` needs a hardware PMU, which this VM kind does not expose ("<not supported>").

    python bench/shard_instructions.py --input <folder of shards> --code <checkout> [--code <another>] \\
        --work <scratch> [--results <new file>]

Each checkout runs twice in a fresh interpreter under cachegrind: the first shard alone (imports, the tokenizer,
the first shard), then the first two; the difference over the second shard's samples is the figure (a warm
helper's shard). Valgrind's CPU has no SHA extensions, so OpenSSL's sha256 runs its plain code there: the
hashing's share is larger than on the host (compare checkouts, not shares). The shards are only read.
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
from pack_assets.core.settings import Settings
from pack_assets.runner import shardwork
inp, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
flat = Settings.from_flat({"input_dir": inp, "work_dir": work, "output_dir": work + "/unused"}).flat()
print("samples", sum(shardwork.work_shard(flat, k, True) for k in shardwork.find(Settings.from_flat(flat)).shards[:n]))
"""


def _count(code: Path, inp: Path, work: Path, n: int) -> tuple[int, int]:
    """(instructions, samples) of a fresh interpreter doing the first ``n`` shards."""
    shutil.rmtree(work, ignore_errors=True)
    out = work.with_suffix(".cg")
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                           sys.executable, "-P", "-c", _CHILD, str(inp), str(work), str(n)],
                          env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    samples = re.search(r"^samples (\d+)$", proc.stdout, re.M)
    if not refs or not samples:
        raise SystemExit(f"no instruction count or sample count in:\n{proc.stderr[-2000:]}\n{proc.stdout[-500:]}")
    out.unlink(missing_ok=True)
    return int(refs.group(1).replace(",", "")), int(samples.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True, help="a folder of shards (read only); the first two are used")
    ap.add_argument("--code", type=Path, action="append", required=True, help="a checkout (repeat for several)")
    ap.add_argument("--work", type=Path, required=True, help="a scratch folder (emptied)")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/shard_instructions_<UTC>.json)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    out = ResultsFile(args.results, "shard_instructions")
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "input": str(args.input), "load_avg_at_start": os.getloadavg(), "codes": []}
    for code in args.code:
        one, n1 = _count(code.resolve(), args.input.resolve(), args.work / "one", 1)
        two, n2 = _count(code.resolve(), args.input.resolve(), args.work / "two", 2)
        rec = {"code": str(code), "instructions_first_shard": one, "instructions_two_shards": two,
               "second_shard_samples": n2 - n1, "instructions_per_sample": round((two - one) / (n2 - n1))}
        doc["codes"].append(rec)
        print(rec, flush=True)
    base = doc["codes"][0]["instructions_per_sample"]
    for rec in doc["codes"][1:]:
        rec["against_first"] = round(rec["instructions_per_sample"] / base, 4)
    doc["load_avg_at_end"] = os.getloadavg()
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
