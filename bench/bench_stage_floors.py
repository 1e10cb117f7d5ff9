"""Each stage's CPU seconds (bench_stage_cpu.py: the command's own process and its others) beside the floors of
the same input measured in the same run: CPU seconds of ``cat`` (reading the bytes), of ``sha256sum``, of
hashlib's sha256 (OpenSSL, what the scan and the audit hash with) and of xxh3-128 (the output shards' file
digests) over every input shard. The input's pages are evicted from the page cache before each floor and
before the run (``posix_fadvise(DONTNEED)`` on those files only, so other people's caches stay).

    python bench/bench_stage_floors.py --input <shards> --out <scratch> [--max-len 16384] [--results <new file>]

CPU seconds are what to compare on a shared machine (their wall seconds also hold other people's work); the
load average is recorded at the start and the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stage_cpu import arguments, measured_run  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

CHUNK = 8 << 20


def evict(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def command_floor(argv: list[str], files: list[Path]) -> dict:
    """Wall and CPU seconds of one command over every file, the files evicted first."""
    evict(files)
    c0, t0 = _children_cpu(), time.perf_counter()
    subprocess.run([*argv, *map(str, files)], check=True, stdout=subprocess.DEVNULL)
    return {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(_children_cpu() - c0, 2)}


def python_floor(make, files: list[Path]) -> dict:
    """Wall and thread CPU seconds of hashing every file with ``make()``'s hash, read in 8 MB chunks."""
    evict(files)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    c0, t0 = time.thread_time(), time.perf_counter()
    for p in files:
        h = make()
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        h.hexdigest()
    return {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.thread_time() - c0, 2)}


def main() -> None:
    args = arguments("stage_floors")
    out = ResultsFile(args.results, "stage_floors")
    files = sorted(p for p in args.input.rglob("*.tar"))
    load0 = os.getloadavg()
    floors = {"bytes": sum(p.stat().st_size for p in files), "shards": len(files),
              "cat": command_floor(["cat"], files), "sha256sum": command_floor(["sha256sum"], files),
              "hashlib_sha256": python_floor(hashlib.sha256, files), "xxh3_128": python_floor(xxhash.xxh3_128, files)}
    print(json.dumps(floors))
    evict(files)
    cmd, summary, stages = measured_run(args.input, args.out, args.max_len)
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": cmd,
           "page_cache": "the input's pages evicted (posix_fadvise DONTNEED) before each floor and the run",
           "load_avg_at_start": load0, "load_avg_at_end": os.getloadavg(), "floors": floors,
           "samples": summary["samples"], "seconds": summary["seconds"],
           "helpers_scan_count_seconds": summary.get("helpers_scan_count_seconds"), "stages": stages,
           "cpu_per_sample_us": {k: round(1e6 * (v["main_cpu_s"] + v["others_cpu_s"]) / summary["samples"], 1)
                                 for k, v in stages.items()}}
    print(json.dumps({k: doc[k] for k in ("stages", "cpu_per_sample_us")}, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
