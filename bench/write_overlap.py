"""How a writer's job overlaps its shards, three ways in one process on a set bench_write.py prepared (its --out
folder: `set-*` and `work`), one writer process, in turn round after round (each first in one round of three):

- `sync_behind`: this code's `copy._overlapped` (the job writes each shard, a thread fsyncs and renames it
  while the next is prepared);
- `in_line`: each shard prepared, written and synced one after the other (`shard.write_shard`);
- `thread_writes`: session 46's first overlap (a thread writes the whole shard while the next is prepared).

    python bench/write_overlap.py --data bench/out/write --rounds 9 --results bench/results/x.json

Wall and CPU (the process's: every thread) of `run_write`, imports not. A profile of one choice, not a timing
of the stage as users run it."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import ResultsFile, machine  # noqa: E402

from pack_assets.core.write import copy, shard  # noqa: E402


def in_line(out_dir: str, prepared, context: dict) -> list:
    return [shard.write_shard(out_dir, job, context) for job in prepared]


def thread_writes(out_dir: str, prepared, context: dict) -> list:
    results, pending = [], None
    with ThreadPoolExecutor(max_workers=1) as thread:
        for job in prepared:
            if pending is not None:
                results.append(pending.result())
            pending = thread.submit(shard.write_shard, out_dir, job, context)
        if pending is not None:
            results.append(pending.result())
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="bench/out/write", help="bench_write.py's --out (its set and work folder)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/write_overlap_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "write_overlap")
    data = Path(args.data).resolve()
    inp, work, out = next(p for p in sorted(data.glob("set-*")) if p.is_dir()), data / "work", data / "overlap"
    ways = {"sync_behind": copy._overlapped, "in_line": in_line, "thread_writes": thread_writes}
    names = list(ways)
    got: dict[str, list] = {w: [] for w in ways}
    for r in range(args.rounds + 1):  # the first round untimed
        for way in names[r % 3:] + names[:r % 3]:
            copy._overlapped = ways[way]
            shutil.rmtree(out, ignore_errors=True)
            t, c = time.perf_counter(), time.process_time()
            copy.run_write(work, inp, out, workers=1)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            if r:
                got[way].append({"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)})
    shutil.rmtree(out, ignore_errors=True)
    med = {w: {k: round(statistics.median(x[k] for x in v), 3) for k in ("wall_s", "cpu_s")} | {
        "min_wall_s": min(x["wall_s"] for x in v)} for w, v in got.items()}
    dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
                "config": vars(args), "set": inp.name, "medians": med, "runs": got})
    print(med)


if __name__ == "__main__":
    main()
