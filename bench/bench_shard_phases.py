"""Where the shard stage's CPU goes per sample: one helper's work (`shardwork.work_shard`, scan then count) on a
few shards in a fresh process, its total CPU per sample with nothing added, then the same shards again with
timers around the per-sample functions it calls (inclusive CPU per sample each), the two alternating; beside
them the floors of the same bytes in the same process (sha256 of every member, json.loads/dumps of every record).

    python bench/bench_shard_phases.py --input <folder of shards> --shards 3 --repeats 2 --work <scratch> \\
        [--results <new file>]

The first shard (in name order) warms the process (imports, the tokenizer, pandas under pyarrow) and is not
counted; the next --shards are. A timer costs about a microsecond per call on top of what it times: the phases are
inclusive and overlap (classify holds _hash_members...), so read them as shares, not a sum; the plain total is
the figure to compare. The shards are only read (make a folder of symlinks to pick some).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

# run in a fresh interpreter with the code under test first on sys.path
_CHILD = r"""
import collections, hashlib, json, os, shutil, sys, time
import pack_assets
from pack_assets.core import jsonform, scan, store, tario
from pack_assets.core.counting import tokens
from pack_assets.core.settings import Settings
from pack_assets.runner import shardwork
inp, work, n_shards, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flat = Settings.from_flat({"input_dir": inp, "work_dir": work, "output_dir": work + "/unused"}).flat()
keys = shardwork.find(Settings.from_flat(flat)).shards
warm, keys = keys[0], keys[1 : 1 + n_shards]
clock = time.process_time
spent, calls = collections.Counter(), collections.Counter()
WRAPPED = [(shardwork, "run_manifest", "scan (manifest, written)"), (scan, "classify", "scan: classify"),
           (scan, "_hash_members", "scan: _hash_members (read + sha256)"),
           (scan, "_read_record", "scan: _read_record (decode, loads, is_dumps_form)"),
           (jsonform, "is_dumps_form", "scan: is_dumps_form"), (jsonform, "dumps", "scan: jsonform.dumps (all)"),
           (scan, "_conversation", "scan: _conversation"), (scan, "_measure_images", "scan: _measure_images"),
           (scan, "group_by_key", "scan: tar walk (headers, grouping)"),
           (store.BatchedParquet, "flush", "scan+count: Parquet batches (pa.array, write)"),
           (shardwork, "run_token_lengths", "count (token_lengths, written)"),
           (tokens.TokenCounter, "render", "count: render"), (tokens.TokenCounter, "lengths", "count: lengths")]
plain = {(m, n): getattr(m, n) for m, n, _ in WRAPPED}

def timed(f, label):
    def run(*a, **k):
        t = clock()
        try:
            return f(*a, **k)
        finally:
            spent[label] += clock() - t
            calls[label] += 1
    return run

def timed_steps(f, label):  # a generator: the time spent in each step
    def run(*a, **k):
        it = f(*a, **k)
        while True:
            t = clock()
            try:
                x = next(it)
            except StopIteration:
                return
            finally:
                spent[label] += clock() - t
            yield x
    return run

def one_pass(wrap):
    for m, n, label in WRAPPED:
        wrapper = timed_steps if n == "group_by_key" else timed
        setattr(m, n, wrapper(plain[m, n], label) if wrap else plain[m, n])
    spent.clear(), calls.clear()
    t, samples = clock(), 0
    for k in keys:
        samples += shardwork.work_shard(flat, k, True)
    return clock() - t, samples

def floors():
    sha = loads = dumps = 0.0
    for k in keys:
        path = os.path.join(inp, k + ".tar")
        with open(path, "rb") as f:
            for e in tario.iter_entries(f, os.path.getsize(path)):
                data = os.pread(f.fileno(), e.size, e.offset)
                t = clock(); hashlib.sha256(data).hexdigest(); sha += clock() - t
                if e.name.endswith(".json"):
                    t = clock(); rec = json.loads(data); loads += clock() - t
                    t = clock(); jsonform.dumps(rec); dumps += clock() - t
    return {"sha256 of every member": sha, "json.loads of each record": loads, "jsonform.dumps of each record": dumps}

shardwork.work_shard(flat, warm, True)
out = {"package": pack_assets.__file__, "shards": keys, "runs": []}
for r in range(repeats):
    for wrap in ((False, True) if r % 2 == 0 else (True, False)):
        cpu, samples = one_pass(wrap)
        rec = {"repeat": r, "timers": wrap, "samples": samples, "cpu_us_per_sample": round(1e6 * cpu / samples, 1)}
        if wrap:
            rec["phases_us_per_sample"] = {k: round(1e6 * v / samples, 1) for k, v in spent.most_common()}
        out["runs"].append(rec)
out["floors_us_per_sample"] = {k: round(1e6 * v / samples, 1) for k, v in floors().items()}
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True, help="a folder of shards (read only)")
    ap.add_argument("--work", type=Path, required=True, help="a scratch work folder (emptied first)")
    ap.add_argument("--shards", type=int, default=3, help="shards timed, after the one that warms the process")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--code", type=Path, help="the checkout to time (default: the one holding this script)")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/shard_phases_<UTC>.json)")
    args = ap.parse_args()
    out = ResultsFile(args.results, "shard_phases")
    code = (args.code or Path(__file__).resolve().parents[1]).resolve()
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "load_avg_at_start": os.getloadavg(), "code": str(code), "input": str(args.input)}
    # -P: the working folder is not put first on sys.path (it would shadow PYTHONPATH's checkout)
    proc = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(args.input.resolve()), str(args.work.resolve()),
                           str(args.shards), str(args.repeats)], env={**os.environ, "PYTHONPATH": str(code)},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(rec["package"]).resolve().is_relative_to(code):
        raise SystemExit(f"the child imported {rec['package']}, not the code under {code}")
    doc.update(rec, load_avg_at_end=os.getloadavg())
    print(json.dumps(doc, indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
