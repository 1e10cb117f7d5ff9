"""The scan's read-ahead against the walk interleaved sample by sample, in one process on the same shards: the
scan (`scan.scan_shard`, every record) with `scan._read_ahead` as it is (runs of 256 samples' headers walked,
then those samples classified) and with runs of one (the walk as before session 56), passes alternating; each
variant's least CPU seconds (user + system, `time.process_time`) over the passes per sample, the figure least
moved by other processes on a shared machine. Beside them the count's rows (`count_shard_rows` and
`write_token_lengths`, as before) against its columns (`count_scanned_columns`, its rows as tuples) with the
counts given (the counting itself is the same code in both).

    python -P bench/scan_read_ahead.py --input <folder of shards> --shards 2 --passes 10 [--results <new file>]

The first shard (in name order) warms the process and is not counted. The shards are only read.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402


def _least(variants: dict, passes: int, samples: int) -> dict:
    """Each variant's least CPU µs per sample over ``passes`` passes, the order reversed every other pass."""
    best: dict[str, float] = {}
    names = list(variants)
    for i in range(passes):
        for name in names if i % 2 else names[::-1]:
            t = time.process_time()
            variants[name]()
            best[name] = min(best.get(name, float("inf")), time.process_time() - t)
    return {name: round(best[name] / samples * 1e6, 2) for name in names}


def _shard(scan, store, tl, settings, work, shard, path, kept, results, counter, args):
    """One shard's two comparisons, and whether the two ways wrote the same count files."""
    from pack_assets.core.records import TOKEN_LENGTHS_SCHEMA

    ahead = scan._read_ahead

    class Given:  # the counts already made: the two ways of writing them compared alone
        profile = counter.profile

        def count_many(self, items):
            for _ in items:
                pass
            return iter([dict(r) for r in results])

    def walk(runs):
        scan._read_ahead = runs
        try:
            return list(scan.scan_shard(path, shard, settings.scan))
        finally:
            scan._read_ahead = ahead

    def rows():
        store.write_token_lengths(work, "rows", shard, *tl.count_shard_rows(Given(), *tl._scanned_rows(kept)))

    def columns():
        cols, rejections = tl.count_scanned_columns(Given(), kept)
        rows = list(zip(*(cols[name] for name in TOKEN_LENGTHS_SCHEMA.names)))
        store.write_token_lengths(work, "columns", shard, rows, rejections)

    scans = _least({"walk one sample at a time": lambda: walk(lambda g: ([x] for x in g)),
                    f"read ahead {scan._READ_AHEAD}": lambda: walk(ahead)}, args.passes, len(kept.samples))
    counts = _least({"count rows (before)": rows, "count columns": columns}, args.passes, len(kept.samples))
    same = all((work / "token_lengths" / "columns" / shard / f).read_bytes()
               == (work / "token_lengths" / "rows" / shard / f).read_bytes()
               for f in ("token_lengths.parquet", "rejected.parquet"))
    return scans, counts, same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--results", help="a new file or folder (default: bench/results/scan_read_ahead_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "scan_read_ahead")
    import pack_assets
    from pack_assets.core import scan, store
    from pack_assets.core.counting import token_lengths as tl
    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.records import Sample, Scanned
    from pack_assets.core.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="scan_read_ahead-"))
    flat = Settings.from_flat({"input_dir": str(args.input), "work_dir": str(work), "output_dir": str(work / "o")})
    settings = Settings.from_flat(flat.flat())
    shards = sorted(p.name[: -len(".tar")] for p in args.input.glob("*.tar"))
    counter = counter_for(settings.model_profile())
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "input": str(args.input), "package": pack_assets.__file__, "load_avg_at_start": os.getloadavg(),
                 "read_ahead": scan._READ_AHEAD, "passes": args.passes, "shards": []}
    gc.disable()  # (as the helpers scan: core/nogc.py)
    try:
        for n, shard in enumerate(shards[: 1 + args.shards]):
            path = str(store.source_tar(settings.sources, shard))
            kept = Scanned()
            kept.samples = [r for r in scan.scan_shard(path, shard, settings.scan) if isinstance(r, Sample)]
            results = list(counter.count_many((s.messages, s.image_sizes, []) for s in kept.samples))
            if n == 0:
                continue  # the warm-up shard

            scans, counts, same = _shard(scan, store, tl, settings, work, shard, path, kept, results, counter, args)
            rec = {"shard": shard, "samples": len(kept.samples), "scan_us_per_sample": scans,
                   "count_rows_us_per_sample": counts, "count_files_byte_identical": same}
            doc["shards"].append(rec)
            print(rec, flush=True)
    finally:
        gc.enable()
        shutil.rmtree(work, ignore_errors=True)
    doc["load_avg_at_end"] = os.getloadavg()
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
