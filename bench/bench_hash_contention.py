"""What the default rerun's early hashing (core/filedigest.py `EarlyDigests`) does to the small reads and writes
running beside it, on an output folder bench_e2e.py left.

    python bench/bench_hash_contention.py --out <bench_e2e's --out> 0:8192:seq 4:8192:seq 2:1024:random 4:1024:direct

Each spec ``threads:chunk_kb:advice[:idle]`` (advice ``seq``, ``normal`` or ``random`` for posix_fadvise, or
``direct`` for O_DIRECT reads; ``idle``: the hashing threads in the idle I/O priority class): the page cache
dropped (root), the output shards hashed by that many threads as `EarlyDigests` does, and meanwhile, in turn,
a cold ``import dagster`` in a new interpreter (what `pack-assets run` does while its helpers scan) and ten
1 MB write+fsync probes (the plan's and the writer's atomic writes). ``0:0:seq`` is the baseline without any
hashing. Records: the import's seconds, the fsyncs' milliseconds, the hashing's seconds and GB/s, the load
average.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, drop_caches, machine  # noqa: E402

ADVICE = {"seq": os.POSIX_FADV_SEQUENTIAL, "normal": os.POSIX_FADV_NORMAL, "random": os.POSIX_FADV_RANDOM}
IMPORT = "import time; t = time.perf_counter(); import dagster; print(time.perf_counter() - t)"
SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE = 251, 1, 3  # x86_64


def idle_io() -> None:
    """This thread's I/O in the idle class (ioprio_set on its own thread id)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, threading.get_native_id(), IOPRIO_CLASS_IDLE << 13):
        raise OSError(ctypes.get_errno(), "ioprio_set")


def digest(path: Path, chunk: int, advice: str, idle: bool) -> str:
    if idle:
        idle_io()
    h = xxhash.xxh3_128()
    if advice == "direct":
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while n := os.readv(fd, [buf]):
                h.update(memoryview(buf)[:n])
        finally:
            os.close(fd)
        return h.hexdigest()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, ADVICE[advice])
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def hash_all(files: list[Path], threads: int, chunk: int, advice: str, idle: bool, t0: float,
             ended: list[float]) -> None:
    """Every file hashed by ``threads`` threads; ``ended[0]``: the seconds since ``t0`` when all were done."""
    if threads:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda f: digest(f, chunk, advice, idle), files))
    ended[0] = time.perf_counter() - t0


def fsync_probes(folder: Path, n: int = 10) -> list[float]:
    took = []
    for i in range(n):
        p = folder / f".contention-probe-{i}"
        t = time.perf_counter()
        with open(p, "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        took.append(round((time.perf_counter() - t) * 1000, 1))
        p.unlink()
        time.sleep(0.2)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="bench_e2e.py's --out (its packed/ shards are hashed)")
    ap.add_argument("specs", nargs="+", help="threads:chunk_kb:advice[:idle]")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/hash_contention_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    files = sorted((out / "packed").glob("packed-*.tar"))
    total = sum(f.stat().st_size for f in files)
    emit = Results(out, args.results, "hash_contention")
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "shards": len(files), "bytes": total})
    for spec in args.specs:
        threads, chunk_kb, advice, *idle = spec.split(":")
        threads, chunk = int(threads), int(chunk_kb) << 10
        if not drop_caches():
            raise SystemExit("dropping the page cache needs root")
        load = os.getloadavg()[0]
        t0, ended = time.perf_counter(), [0.0]
        hashing = threading.Thread(target=hash_all, args=(files, threads, chunk, advice, bool(idle), t0, ended))
        hashing.start()
        imported = float(subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True,
                                        check=True).stdout.split()[-1])
        fsyncs = fsync_probes(out)
        hashing.join()
        emit({"spec": spec, "load1_at_start": round(load, 2), "import_dagster_s": round(imported, 2),
              "fsync_1mb_ms": fsyncs, "hash_s": round(ended[0], 2) if threads else None,
              "hash_gb_per_s": round(total / 1e9 / ended[0], 2) if threads else None})


if __name__ == "__main__":
    main()
