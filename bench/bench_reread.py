"""The audit's re-read next to plain hashing of the same output bytes, in one run, in turn.

    python bench/bench_reread.py --packed bench/out/small/run4/this/packed --work bench/out/small/run4/this/work

Over the output shards of a finished run (any `pack-assets run` output): `hashlib` sha256 of each whole file
(1 MiB reads), `sha256sum` and `openssl dgst -sha256` of the same files, the audit's reader + sha256 of every
media member (`audit._pack_parts`, and the tarfile reader `tario.iter_pack_parts` it replaced), the same reader
with each pack's members hashed by a second thread while the next pack is read (`audit._hashed`, as the
in-line audit reads one output shard at a time with a core to spare), and the whole
audit in one process (`run_audit(workers=1)`: reader, hashes, every check, the report). Each round runs all
of them once; the medians over --repeats rounds and each round's ratios to hashlib go to
a new file under bench/results (--results). Page cache warm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, timed  # noqa: E402

from pack_assets.core import audit, tario  # noqa: E402


def hash_files(files: list[Path]) -> None:
    for p in files:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while b := f.read(1 << 20):
                h.update(b)
        h.hexdigest()


def reader_and_hash(reader, files: list[Path]) -> None:
    for p in files:
        for _, parts in reader(p):
            for name, data in parts.items():
                if data is not None and name != "json":
                    hashlib.sha256(data).hexdigest()


def reader_with_hashing_thread(files: list[Path]) -> None:
    """As the in-line audit reads: each pack's members hashed by a second thread while the next is read."""
    with ThreadPoolExecutor(1) as hasher:
        for p in files:
            for _ in audit._hashed(audit._pack_parts(p), hasher):
                pass


def one_round(files: list[Path], work: Path, packed: Path) -> dict[str, float]:
    names = [str(p) for p in files]
    steps = {
        "hashlib_whole_files": lambda: hash_files(files),
        "sha256sum": lambda: timed(["sha256sum", *names]),
        "openssl_dgst_sha256": lambda: timed(["openssl", "dgst", "-sha256", *names]),
        "audit_reader_plus_sha256": lambda: reader_and_hash(audit._pack_parts, files),
        "tarfile_reader_plus_sha256": lambda: reader_and_hash(tario.iter_pack_parts, files),
        "audit_reader_with_hashing_thread": lambda: reader_with_hashing_thread(files),
        "run_audit_one_process": lambda: audit.run_audit(work, packed, workers=1),
    }
    out = {}
    for name, fn in steps.items():
        t0 = time.perf_counter()
        fn()
        out[name] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packed", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/reread_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "reread")
    packed, work = Path(args.packed), Path(args.work)
    files = sorted(packed.glob("*.tar"))
    size = sum(p.stat().st_size for p in files)
    rounds = []
    for r in range(args.repeats + 1):  # the first round warms the page cache and the tokenizer: not kept
        rec = one_round(files, work, packed)
        rec["ratios_to_hashlib"] = {k: round(rec["hashlib_whole_files"] / v, 3) for k, v in rec.items()}
        print(json.dumps(rec), flush=True)
        if r:
            rounds.append(rec)
    keys = [k for k in rounds[0] if k != "ratios_to_hashlib"]
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
              "bytes": size, "files": len(files),
              "median_s": {k: statistics.median(r[k] for r in rounds) for k in keys},
              "median_speed_vs_hashlib": {k: statistics.median(r["ratios_to_hashlib"][k] for r in rounds)
                                          for k in keys},
              "rounds": rounds}
    dest.write(result)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))


if __name__ == "__main__":
    main()
