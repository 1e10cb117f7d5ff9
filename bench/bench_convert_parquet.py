"""`convert` on a Parquet Hub snapshot next to reading the same files with pyarrow alone, in one run.

    python bench/bench_convert_parquet.py --gb 1 --results bench/results/convert_parquet_<session>.json

Makes (once, kept under --data) a snapshot shaped like The Cauldron / FineVision on the Hub: `<config>/train-
0000N-of-0000M.parquet`, rows of `images` (list of `{bytes, path}`, unique JPEGs of about --image-kb KB,
pyarrow's default snappy compression) + `texts` (`{user, assistant, source}`), row groups of 100 rows as
`datasets` writes image sets. Then, --repeats rounds in turn, each in a fresh process:

- `pyarrow`: every file read with `pyarrow.parquet.ParquetFile(f).iter_batches()` (pyarrow's defaults),
  each batch's columns touched (`nbytes`), nothing else;
- `pyarrow_read_table`: every file read whole with `pyarrow.parquet.read_table(f)`;
- `pyarrow_streamed`: every file read as convert read it before issue 42's speed work (`ParquetFile(f,
  buffer_size=1 MiB, pre_buffer=False).iter_batches(batch_size=64)`), on one thread;
- `pyarrow_mapped`: the same with the file memory-mapped (`memory_map=True`, no read buffer): the fastest
  pyarrow reading found (convert does not map: beside its writer thread, mapping cost more than it saved);
- `pyarrow_to_python`: `iter_batches()` with pyarrow's defaults, each batch turned into Python rows
  (`to_pylist`), as any per-row consumer needs;
- `convert`: `pack_assets.core.convert.convert` of the snapshot folder into a fresh output folder (shapes
  detected, every image's format read from its bytes and its header checked, records, tar shards written
  and renamed into place; no fsync, as convert does not sync). Its module is imported before the clock
  starts, as pyarrow is for the other steps (the import is `import_seconds`); the CPU time of each of its
  threads (main, read-ahead, writer) is `thread_cpu_seconds`.

With ``--baseline-src <checkout>`` a `convert_baseline` step runs the same conversion with that checkout's
`pack_assets` first on PYTHONPATH (e.g. a worktree of main), in the same rounds, so the two codes' ratio is
measured in one sitting. ``--steps`` runs some of the steps only (more rounds of the ones that matter).

Peak memory is each process's max RSS (`ru_maxrss`); CPU seconds are the process's user + system time,
all threads. The ratios are convert's speed over each pyarrow reading (its seconds / convert's seconds, the
median rounds), the strictest one over the fastest of the four; the medians and every round go to
--results. Page cache warm (a first untimed read of every file); output written to --data/out, removed after
each round.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine, require_free  # noqa: E402

STEPS = ("pyarrow", "pyarrow_read_table", "pyarrow_streamed", "pyarrow_mapped", "pyarrow_to_python", "convert")
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema([("images", pa.list_(IMAGE)),
                    ("texts", pa.list_(pa.struct([("user", pa.string()), ("assistant", pa.string()),
                                                  ("source", pa.string())])))])


def make_snapshot(root: Path, gb: float, image_kb: int, files: int, seed: int = 0) -> list[Path]:
    """Unique JPEGs: 64 noise images re-encoded at random qualities, each row's bytes made unique by a
    random trailer after the end-of-image marker (decoders and header readers ignore it)."""
    rng = np.random.default_rng(seed)
    side = int((image_kb * 1024 / 1.2) ** 0.5)  # noise JPEG at q90 is about 1.2 bytes a pixel
    base = []
    for _ in range(64):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        base.append(buf.getvalue())
    rows = int(gb * 1e9 / len(base[0]))
    per_file = -(-rows // files)
    out = []
    for i in range(files):
        path = root / "cauldron_like" / f"train-{i:05d}-of-{files:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, SCHEMA) as w:
            for start in range(0, per_file, 100):
                n = min(100, per_file - start)
                imgs = [[{"bytes": base[int(rng.integers(64))] + rng.bytes(16), "path": None}] for _ in range(n)]
                texts = [[{"user": f"What is in image {start + k}?", "assistant": "Noise, mostly. " * 8,
                           "source": "bench"}] for k in range(n)]
                w.write_table(pa.table({"images": imgs, "texts": texts}, schema=SCHEMA), row_group_size=100)
        out.append(path)
    return out


THREAD_CPU: dict[str, float] = {}


def _time_threads() -> None:
    """CPU time of convert's read-ahead and writer threads (their run functions wrapped)."""
    from pack_assets.core import shardsink, tables

    def timed(name, fn):
        def run(*a):
            t = time.thread_time()
            try:
                return fn(*a)
            finally:
                THREAD_CPU[name] = THREAD_CPU.get(name, 0.0) + time.thread_time() - t
        return run

    tables._ReadAhead._produce = timed("reader", tables._ReadAhead._produce)
    shardsink._Writer._run = timed("writer", shardsink._Writer._run)


def _child(step: str, data: Path) -> dict:
    t_import = time.perf_counter()
    if step.startswith("convert"):  # imported before the clock starts, as pyarrow is for the other steps
        from pack_assets.core.convert import convert
        _time_threads()
    t_import = time.perf_counter() - t_import
    files = sorted((data / "snapshot").rglob("*.parquet"))
    t0, c0 = time.perf_counter(), os.times()
    rows, threads = 0, {}
    if step == "pyarrow_read_table":
        for f in files:
            t = pq.read_table(f)
            rows += t.num_rows
            _ = t.nbytes  # the table's buffers, as a reader of them touches them
    elif step in ("pyarrow_streamed", "pyarrow_mapped"):
        how = {"buffer_size": 1 << 20} if step == "pyarrow_streamed" else {"memory_map": True}
        for f in files:
            for b in pq.ParquetFile(f, pre_buffer=False, **how).iter_batches(batch_size=64):
                rows += b.num_rows
                sum(c.nbytes for c in b.columns)
    elif step in ("pyarrow", "pyarrow_to_python"):
        for f in files:
            for b in pq.ParquetFile(f).iter_batches():
                rows += b.num_rows
                if step == "pyarrow":
                    sum(c.nbytes for c in b.columns)
                else:
                    b.to_pylist()
    else:
        main_cpu = time.thread_time()
        res = convert([data / "snapshot"], data / "out")
        rows = res["converted"]
        threads = {"main": time.thread_time() - main_cpu, **THREAD_CPU}
    seconds, c1 = time.perf_counter() - t0, os.times()
    code = sys.modules["pack_assets"].__file__ if "pack_assets" in sys.modules else ""  # which checkout ran
    return {"step": step, "seconds": seconds, "import_seconds": t_import, "thread_cpu_seconds": threads, "code": code,
            "cpu_seconds": c1.user - c0.user + c1.system - c0.system, "rows": rows,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_step(step: str, data: Path, baseline_src: str = "") -> dict:
    env = dict(os.environ)
    if step == "convert_baseline":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline_src, env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--child", step, "--data", str(data)], check=True,
                         capture_output=True, text=True, env=env).stdout
    shutil.rmtree(data / "out", ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="bench/out/convert_parquet")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--image-kb", type=int, default=150)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/convert_parquet_<UTC>.json)")
    ap.add_argument("--baseline-src", default="", help="a checkout whose convert is measured beside this one")
    ap.add_argument("--steps", default=",".join(STEPS), help="the steps to run, comma-separated (default: all)")
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    data = Path(args.data)
    if args.child:
        print(json.dumps(_child(args.child, data)))
        return
    dest = ResultsFile(args.results, "convert_parquet")
    if not (data / "snapshot").is_dir():
        require_free(data, 3.2 * args.gb * 1e9)  # the snapshot, its converted copy, headroom
        make_snapshot(data / "snapshot", args.gb, args.image_kb, args.files)
    files = sorted((data / "snapshot").rglob("*.parquet"))
    size = sum(f.stat().st_size for f in files)
    for f in files:  # warm the page cache: every step reads cached files
        f.read_bytes()
    rounds = []
    load_before = os.getloadavg()
    steps = [s for s in args.steps.split(",") if s in STEPS] + (["convert_baseline"] if args.baseline_src else [])
    for r in range(args.repeats):
        for step in steps if r % 2 == 0 else steps[::-1]:  # order alternates between rounds
            rec = run_step(step, data, args.baseline_src)
            rounds.append({"round": r, **rec})
            print(json.dumps(rounds[-1]), flush=True)
    med = {s: statistics.median(x["seconds"] for x in rounds if x["step"] == s) for s in steps}
    cpu = {s: statistics.median(x["cpu_seconds"] for x in rounds if x["step"] == s) for s in steps}
    reads = [s for s in med if s.startswith("pyarrow") and s != "pyarrow_to_python"]
    rss = {s: max(x["max_rss_mb"] for x in rounds if x["step"] == s) for s in med}
    summary = {"bench": "convert_parquet", "machine": machine(), "load_before_after": [load_before, os.getloadavg()],
               "snapshot_bytes": size, "files": len(files),
               "rows": rounds[0]["rows"], "median_seconds": med, "median_cpu_seconds": cpu, "max_rss_mb": rss,
               "mb_per_second": {s: size / 1e6 / v for s, v in med.items()}}
    if "convert" in med:
        if reads:
            summary["convert_speed_over_fastest_pyarrow_read"] = min(med[s] for s in reads) / med["convert"]
        names = {"pyarrow": "iter_batches", "pyarrow_read_table": "read_table", "pyarrow_streamed": "streamed",
                 "pyarrow_mapped": "mapped", "pyarrow_to_python": "to_python", "convert_baseline": "baseline"}
        for s, name in names.items():
            if s in med:
                summary[f"convert_speed_over_{'pyarrow_' if s.startswith('pyarrow') else ''}{name}"] = \
                    med[s] / med["convert"]
    summary.update(baseline_src=args.baseline_src, rounds=rounds)
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    dest.write(summary)


if __name__ == "__main__":
    main()
