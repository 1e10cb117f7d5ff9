"""What the early digests' reads cost Dagster's cold import beside them, and how fast they read, per shape.

    python -P bench/early_reads_import.py --files '/work/e2e1m/packed/*.tar' --repeats 2 \
        --shapes 0x0 4x4 1x1 2x1 1x4 --results bench/results/<new>.json

`pack-assets run` can start hashing the output shards a rerun keeps (`filedigest.EarlyDigests`) before it
imports Dagster, but the cold import reads ~1,700 small files, each of which waits behind the large requests
already queued on the disk. For each shape ``RxM`` (R reader threads of M MB O_DIRECT requests, as
`filedigest.identified_digest` reads; ``0x0``: no reads) and round: the page cache dropped, the readers started
on the files, and 0.3 s later a fresh interpreter timed importing what the command imports after its helpers
fork (dagster, duckdb, pyarrow); then the readers' throughput until they finish. Root (drop_caches). Writes a new
results file (never overwrites one).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, drop_caches, machine  # noqa: E402

IMPORT = "import dagster, duckdb, pyarrow"


def _digests(files: list[str], readers: int, chunk: int) -> tuple[int, float]:
    """The files hashed as the early digests hash them (one queue, ``readers`` threads): bytes, seconds."""
    from pack_assets.core.filedigest import identified_digest

    t0 = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(lambda f: identified_digest(Path(f), None, True, chunk), files))
    return sum(os.path.getsize(f) for f in files), time.perf_counter() - t0


def _import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT], check=True)
    return time.perf_counter() - t0


def measure(files: list[str], readers: int, chunk_mb: int) -> dict:
    if not drop_caches():
        raise SystemExit("dropping the page cache needs root")
    if not readers:
        return {"readers": 0, "import_s": round(_import_seconds(), 2), "load_avg": os.getloadavg()}
    got: dict = {}
    reading = threading.Thread(target=lambda: got.update(zip(("bytes", "s"), _digests(files, readers, chunk_mb << 20))))
    reading.start()
    time.sleep(0.3)
    imported = _import_seconds()
    reading.join()
    return {"readers": readers, "request_mb": chunk_mb, "import_s": round(imported, 2), "read_s": round(got["s"], 2),
            "read_mb_per_s": round(got["bytes"] / got["s"] / 1e6), "load_avg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", required=True, help="a glob of large files to read (e.g. a run's output shards)")
    ap.add_argument("--shapes", nargs="+", default=["0x0", "4x4", "1x1"], help="RxM: R readers of M MB requests")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/early_reads_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "early_reads")
    files = sorted(glob.glob(args.files))
    if not files:
        raise SystemExit(f"no file matches {args.files}")
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "files": len(files),
           "bytes": sum(os.path.getsize(f) for f in files), "import": IMPORT, "rounds": []}
    for i in range(args.repeats):
        for shape in args.shapes:
            readers, chunk_mb = (int(x) for x in shape.split("x"))
            doc["rounds"].append({"round": i, "utc": time.strftime("%H:%M:%S", time.gmtime()),
                                  **measure(files, readers, chunk_mb)})
            print(doc["rounds"][-1], flush=True)
            out.write(doc)


if __name__ == "__main__":
    main()
