"""Soak: I/O errors injected for real (Debian's libfiu, `fiu-run -x`) into one stage of each run, seeded.

    PYTHONPATH=. python bench/soak_io_faults.py [--runs 100] [--seed 40] [--results FILE]

Each run draws (from the seed) a stage, a set of libfiu failure points (reads, writes, fsyncs or all), a
probability and an errno (EIO; ENOSPC for some write runs) and runs the pipeline under `fiu-run -x` with
them on during that stage (tests/io_fault_harness.py; `--batch` runs per process), in fresh folders; then a
plain rerun without faults.
Verdicts: ``pass_equal`` or ``clear_error`` are fine; ``pass_wrong_bytes``, ``unclear_error``, ``crash``,
``hang``, a visible temp file and a rerun that does not give the clean run's bytes are violations. Needs
no root; needs `apt-get install fiu-utils`. Writes a NEW results file (refuses to overwrite).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import io_fault_harness as h  # noqa: E402
from common import ResultsFile, machine  # noqa: E402
from conftest import small_dataset  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--batch", type=int, default=10, help="runs per harness process")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/io_faults_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "io_faults")
    if not h.fiu_available():
        sys.exit("fiu-run not found: apt-get install fiu-utils")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        inp = small_dataset(root / "in", n_shards=3, per_shard=10)
        assert h.stages(inp, root / "clean" / "work", root / "clean" / "out", 1) == 0
        clean = h.snapshot(root / "clean" / "work", root / "clean" / "out")
        rng = random.Random(args.seed)
        faults = [h.draw(rng, i) for i in range(args.runs)]
        runs = []
        for batch in range(0, len(faults), args.batch):  # one process (one start under libfiu) per batch
            todo = faults[batch:batch + args.batch]
            t = time.time()
            results = h.faulty_runs(inp, root / "runs", todo)
            for fault in todo:
                folder = root / "runs" / f"r{fault['run']}"
                verdict = h.judge(results[fault["run"]], inp, clean, folder / "work", folder / "out")
                runs.append({**fault, **verdict})
                print(json.dumps(runs[-1]), flush=True)
            print(f"batch of {len(todo)}: {time.time() - t:.0f} s", flush=True)
    tally = collections.Counter(r["outcome"] for r in runs)
    violations = [r for r in runs if r["outcome"] not in ("pass_equal", "clear_error") or r["rerun"] != "equal"
                  or r["temp_left_visible"]]
    summary = {"runs": len(runs), "seed": args.seed, "outcomes": dict(tally), "violations": len(violations),
               "reruns_equal": sum(r["rerun"] == "equal" for r in runs),
               "starts_redone": sum(r["starts"] - 1 for r in runs),
               "by_stage": {s: dict(collections.Counter(r["outcome"] for r in runs if r["stage"] == s))
                            for s in h.STAGES},
               "seconds": round(time.time() - t0), "machine": machine(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "violating_runs": violations, "all": runs}
    dest.write(summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("all", "violating_runs")}, indent=1))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
