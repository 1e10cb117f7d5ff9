"""Index-only packs vs copied media: output size, write time, and reading every pack back, in one run.

    PYTHONPATH=. python bench/bench_index.py --out bench/out/index --shards 4 --per-shard 500 --image-kb 100

One plan (image-text samples, `common.make_shards`), written twice: copy mode and index mode. Then, in turn
for --repeats rounds: every pack read with `reader.iter_packs` from the copy folder and from the index folder
(each media member's bytes touched), and `cat` of the copy-mode shards to /dev/null (the floor: the same
bytes, sequential, no parsing). Medians and per-round ratios go to a new file under bench/results (--results),
with the sizes, the write times, `uptime`'s load and the machine. Page cache warm (inputs and outputs fit
in memory at the default size): this measures the reader's own cost, not a disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, make_shards  # noqa: E402

from pack_assets.core import store  # noqa: E402
from pack_assets.core.counting.profiles import load_profile  # noqa: E402
from pack_assets.core.counting.token_lengths import run_token_lengths  # noqa: E402
from pack_assets.core.plan import PlanConfig, run_plan  # noqa: E402
from pack_assets.core.scan import run_manifest  # noqa: E402
from pack_assets.core.write import run_write, run_write_index  # noqa: E402
from pack_assets.reader import iter_packs  # noqa: E402


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def read_all(folder: Path) -> tuple[int, int]:
    packs = media = 0
    for pack in iter_packs(folder):
        packs += 1
        media += sum(len(d) for s in pack["samples"] for _, d in s["media"] + s["extra"])
    return packs, media


def load() -> list[float]:
    """`uptime`'s 1/5/15-minute load averages (the machine is shared)."""
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/out/index")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=int, default=500)
    ap.add_argument("--image-kb", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/index_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "index")
    out = Path(args.out)
    inp = out / f"in-{args.shards}x{args.per_shard}x{args.image_kb}kb"
    make_shards(inp, args.shards, args.per_shard, image_kb=args.image_kb)
    work, copy, index = out / "work", out / "copy", out / "index"
    for d in (work, copy, index):
        shutil.rmtree(d, ignore_errors=True)
    profile = load_profile("qwen3-vl")
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    run_plan(work, shards, PlanConfig(max_len=args.max_len), profile)
    rec: dict = {"machine": machine(), "load_before": load(), "command": " ".join(sys.argv),
                 "input": {"shards": args.shards, "samples": args.shards * args.per_shard, "image_kb": args.image_kb,
                           "bytes": tree_bytes(inp)}}
    t0 = time.perf_counter()
    w_copy = run_write(work, inp, copy, workers=1)
    rec["write_copy_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    run_write_index(work, inp, index, workers=1)
    rec["write_index_s"] = round(time.perf_counter() - t0, 3)
    rec["output_bytes"] = {"copy": tree_bytes(copy), "index": tree_bytes(index)}
    rec["size_ratio_index_to_input"] = round(rec["output_bytes"]["index"] / rec["input"]["bytes"], 4)
    rec["size_ratio_index_to_copy"] = round(rec["output_bytes"]["index"] / rec["output_bytes"]["copy"], 4)
    rec["packs"] = w_copy.packs
    tars = [str(p) for p in sorted(copy.glob("*.tar"))]
    assert read_all(copy) == read_all(index)  # the same packs, the same media bytes (warms the cache too)
    rounds = []
    for _ in range(args.repeats):
        r = {}
        t0 = time.perf_counter()
        read_all(copy)
        r["read_copy_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        read_all(index)
        r["read_index_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as null:
            subprocess.run(["cat", *tars], stdout=null, check=True)
        r["cat_copy_s"] = time.perf_counter() - t0
        r["index_over_copy"] = r["read_index_s"] / r["read_copy_s"]
        r["copy_over_cat"] = r["read_copy_s"] / r["cat_copy_s"]
        rounds.append(r)
    rec["rounds"] = [{k: round(v, 4) for k, v in r.items()} for r in rounds]
    rec["median"] = {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}
    rec["load_after"] = load()
    print(json.dumps(rec, indent=1))
    dest.write([rec])  # the shape of index.json, which held one run per command


if __name__ == "__main__":
    main()
