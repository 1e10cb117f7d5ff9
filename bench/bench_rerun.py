"""The default rerun after one new shard, repeated on a set bench_e2e.py left, two codes in turn.

    python bench/bench_rerun.py --out <bench_e2e's --out> --code <src A> --baseline <src B> --rounds 3 --drop-caches

Each round and code: the newest shard moved aside and an incremental run (untimed: the state before the
shard), the shard put back with a new mtime (so it is scanned and counted as a shard just added), the page
cache dropped (``--drop-caches``, root), then the timed `pack-assets run --incremental` with the default
audit, as bench_e2e.py's first rerun. ``--quick``: then the same again with ``--audit-scope changed`` (the kept
output shards not read at all: what the rest of the rerun costs without their reading, same round and code).
Each record has the 1-minute load average at its start (a shared machine shows there). ``--code`` /
``--baseline``: folders holding each code's ``pack_assets`` (first on PYTHONPATH). Both codes work on the same
catalog and output in turn, so they must share its format. Records: each timed run's seconds and stages, and
the ratio to ``--full-seconds`` (the set's full run, e.g. from bench_e2e's results).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import run  # noqa: E402
from common import Results, drop_caches, machine  # noqa: E402


def rerun(cmd: list[str], out: Path, new: Path, src: str, cold: bool, flags: tuple[str, ...] = ()) -> dict:
    """One timed rerun of ``src`` (the default one, or with ``flags``) after the untimed run without ``new``."""
    env = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = src
    try:
        aside = out / "rerun_aside.tar"
        shutil.move(new, aside)
        run(cmd + ["--incremental"], out / "dagster_home")
        shutil.move(aside, new)
        os.utime(new)  # a new mtime: scanned and counted again, as a shard just added
        dropped = cold and drop_caches()
        load = os.getloadavg()[0]
        seconds, s, peak, _ = run(cmd + ["--incremental", *flags], out / "dagster_home")
    finally:
        os.environ.pop("PYTHONPATH") if env is None else os.environ.__setitem__("PYTHONPATH", env)
    return {"code": src, "flags": ["--incremental", *flags], "load1_at_start": round(load, 2),
            "page_cache": "dropped" if dropped else "warm", "seconds": round(seconds, 1),
            "stage_seconds": s["stage_seconds"], "output_shards_written": s["output_shards_written"],
            "output_shards_trusted": s["output_shards_trusted"], "output_shards_hashed": s.get("output_shards_hashed"),
            "violations": s["violations"], "samples": s["samples"], "peak_rss_bytes": peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="bench_e2e.py's --out, after its run with --reruns 1 or more")
    ap.add_argument("--code", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--full-seconds", type=float, default=0.0, help="the set's full run, for the ratio")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--quick", action="store_true", help="also time each code's rerun with --audit-scope changed")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/rerun_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    emit = Results(out, args.results, "rerun")
    new = sorted((out / "shards").glob("part-*.tar"))[-1]
    exe = str(Path(sys.executable).parent / "pack-assets")
    cmd = [exe, "run", "--input", str(out / "shards"), "--max-len", str(args.max_len), "--work", str(out / "work"),
           "--output", str(out / "packed"), "--dagster-home", str(out / "dagster_home"), "--json"]
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "new_shard": new.name,
          "full_run_s": args.full_seconds or None})
    for r in range(args.rounds):
        for label, src in ((("A", args.code), ("B", args.baseline)) if r % 2 == 0
                           else (("B", args.baseline), ("A", args.code))):
            for flags in ((), ("--audit-scope", "changed"))[:1 + args.quick]:
                rec = rerun(cmd, out, new, src, args.drop_caches, flags)
                if args.full_seconds:
                    rec["ratio_to_full"] = round(rec["seconds"] / args.full_seconds, 3)
                emit({"round": r, "which": label, **rec})


if __name__ == "__main__":
    main()
