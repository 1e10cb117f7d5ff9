"""Where the default rerun after one new shard spends its time: the rerun of bench_rerun.py, profiled.

    python bench/profile_rerun.py --out <bench_e2e's --out> --drop-caches [--mode index] [--flags --audit-scope changed]

The newest shard moved aside and an untimed incremental run, put back with a new mtime, the page cache dropped
(``--drop-caches``, root), then `pack-assets run --incremental` (plus ``--flags``) in a process profiled by
cProfile from its start (the command leaves by ``os._exit``: the profile is written by an atexit handler, which
runs before it). Records: the run's seconds and stages, and the cumulative seconds of the functions of the
plan, write and audit stages that a one-shard rerun pays for the whole catalog (``FUNCTIONS``), summed over
their calls. cProfile's own overhead inflates Python-heavy functions: compare functions within one record,
not with a run that was not profiled (``--timer cpu``: the main thread's CPU seconds, which leave out the
waits on the disk and other threads' work). The .prof file is kept beside the set (``<out>/rerun_<UTC>.prof``).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, drop_caches, machine  # noqa: E402

FUNCTIONS = {
    "plan": ["run_plan", "plannable", "build_catalog", "ok_lengths", "_previous_plan", "read_plan", "changed_packs",
             "_incremental", "make_plan", "plan_jsonl", "save_plan", "check_plan",
             # the append-only plan (core/incremental.py), when nothing of the stored plan changed
             "appendable", "_appended", "new_samples", "append_plan_file", "record_plan_file",
             # session 55: the append's lengths alone, its new rows, its check
             "every_length", "appended_rows", "_append_base", "_appended_checks"],
    "write": ["run_write", "check_sources", "shard_digests", "digest_keys", "write_all", "_write_group", "metadata",
              "finish", "record_written", "claim", "commit", "holds", "_keyed"],
    "audit": ["run_audit", "audit", "vouched", "recount", "shard_expectations", "_hashed", "per_shard",
              "audit_figures", "current_stamps"],
    "other": ["instance_for", "_shards_run", "_helpers_done", "atomic_write_bytes", "fsync_dir"],
}
PROFILED = """import atexit, cProfile, sys, time
into, timer = sys.argv.pop(1), sys.argv.pop(1)
profile = cProfile.Profile(time.thread_time) if timer == "cpu" else cProfile.Profile()
atexit.register(lambda: (profile.disable(), profile.dump_stats(into)))
profile.enable()
from pack_assets.cli import main
sys.argv[0] = "pack-assets"
main()
"""


# calls counted (the profile's ncalls): reads of a shard's first pack, renames, fsyncs by name
CALLS = ("first_pack_meta", "<built-in method posix.replace>", "fsync_file", "holds")


def calls(prof: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for (_, _, name), (_, ncalls, _, _, _) in pstats.Stats(str(prof)).stats.items():
        if name in CALLS:
            found[name] = found.get(name, 0) + ncalls
    return found


def evict(folders: list[Path]) -> int:
    """Every file under ``folders`` written back and dropped from the page cache (posix_fadvise DONTNEED: these
    files only, no root, no other process's cache touched); returns how many."""
    n = 0
    for folder in folders:
        for p in folder.rglob("*"):
            if p.is_file() and not p.is_symlink():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                n += 1
    return n


def cumulative(prof: Path) -> dict[str, dict[str, float]]:
    """Per stage and function of ``FUNCTIONS``: the cumulative seconds of the package's functions of that name."""
    seconds: dict[str, float] = {}
    for (path, _, name), (_, _, _, cum, _) in pstats.Stats(str(prof)).stats.items():
        if "pack_assets" in path:
            seconds[name] = seconds.get(name, 0.0) + cum
    return {stage: {f: round(seconds[f], 2) for f in names if f in seconds} for stage, names in FUNCTIONS.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="bench_e2e.py's --out, after its run with --reruns 1 or more")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--evict", action="store_true",
                    help="the output and work folders' files dropped from the page cache before the profiled run "
                         "(theirs only: the input shards and everyone else's files stay cached)")
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall",
                    help="cpu: the profile counts the main thread's CPU seconds (time.thread_time), not wall seconds")
    ap.add_argument("--mode", default="copy", help="--mode of both runs (index: a set bench_e2e did not make, whose "
                                                   "output is small)")
    ap.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="more flags of the profiled run")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/profile_rerun_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    emit = Results(out, args.results, "profile_rerun")
    new = sorted((out / "shards").glob("part-*.tar"))[-1]
    run = ["run", "--input", str(out / "shards"), "--max-len", str(args.max_len), "--work", str(out / "work"),
           "--output", str(out / "packed"), "--dagster-home", str(out / "dagster_home"), "--json", "--incremental",
           "--mode", args.mode]
    aside = out / "rerun_aside.tar"
    shutil.move(new, aside)
    subprocess.run([str(Path(sys.executable).parent / "pack-assets"), *run], check=True, capture_output=True)
    shutil.move(aside, new)
    os.utime(new)  # a new mtime: scanned and counted again, as a shard just added
    dropped = args.drop_caches and drop_caches()
    evicted = evict([out / "packed", out / "work"]) if args.evict and not dropped else 0
    prof = out / f"rerun_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.prof"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-P", "-c", PROFILED, str(prof), args.timer, *run, *args.flags],
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: the audit's FAIL, recorded (violations)
        raise SystemExit(f"the profiled run exited {done.returncode}: {done.stderr[-3000:]}")
    seconds = time.perf_counter() - t0
    summary = json.loads(done.stdout)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "new_shard": new.name,
          "flags": ["--incremental", "--mode", args.mode, *args.flags], "load1_at_start": round(load, 2),
          "page_cache": "dropped" if dropped else f"output and work evicted ({evicted} files)" if evicted else "warm",
          "timer": args.timer,
          "violations": summary.get("violations"), "seconds_profiled": round(seconds, 1),
          "stage_seconds": summary["stage_seconds"], "output_shards_hashed": summary.get("output_shards_hashed"),
          "cumulative_s": cumulative(prof), "calls": calls(prof), "profile": str(prof)})


if __name__ == "__main__":
    main()
