"""The writer on small members next to `cp` of the same bytes, this code against a baseline copy of the code.

    git archive <commit before> pack_assets | tar -x -C /tmp/base
    python bench/bench_write.py --baseline-src /tmp/base --repeats 5

One set (default: 2 shards x 5,000 samples, 4 images of 16 KB each: 50,000 members, 0.7 GB), scanned,
counted and planned once (max_len 16,384, Qwen3-VL). Then, in rounds, each in a fresh process: `run_write`
of this code, `run_write` of the baseline code (each into an emptied output folder; one writer process, or
`--workers 2`: one per core, as `pack-assets run` does), the syscall floor (FLOOR: the same sample bytes read
and written pack by pack with one pread per sample, one writev per pack, an fsync per shard, nothing else),
two more floors with each sample's bytes copied in kernel (copy_file_range, as `cp` does) with and without
the fsync (each floor as many processes as the writer), `cp` of the source shards, and `cp` + `sync` of them.
This code and the baseline alternate which goes first in a round. Wall and CPU seconds of the writer are
measured inside its process around `run_write` (the DuckDB reads, Energon index and every fsync included;
imports not; its pool's CPU too); `cp` from outside. Ratios are taken round by round (MB/s of the writer over
MB/s of `cp`), so drift on a shared machine does not favour one side; `this_to_floor_kernel_wall` is the
writer's wall time over the fsynced kernel-copy floor's in the same round (issue 41's figure). Writes a new
file under bench/results (--results).
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

REPO = Path(__file__).resolve().parent.parent

WRITE = """
import json, resource, shutil, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from pack_assets.core.write import run_write
out = Path(sys.argv[4])
shutil.rmtree(out, ignore_errors=True)
def children():  # the CPU of the writer's pool processes (workers > 1), ended by the time run_write returns
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
t, c, k = time.perf_counter(), time.process_time(), children()
w = run_write(Path(sys.argv[3]), Path(sys.argv[2]), out, workers=int(sys.argv[5]))
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c + children() - k,
                  "bytes": w.bytes}))
"""


# The syscall floor of any writer of these packs: each sample's members read with one pread of their span and
# each pack's bytes written with one os.writev, shard by shard in the planned order, then an fsync per shard;
# no tar headers, no JSON, no catalog beyond one query (not timed). What a writer in Python cannot go under.
# argv[4] "kernel": each sample's span copied by copy_file_range instead (no user-space copy, as `cp` does);
# argv[5] "nosync": no fsync (what `cp` does): the two bounds of the ratio to `cp`. argv[6:9]: this process
# writes the output shards i, i + n, ... (of n processes, as the writer's pool spreads them), starting its
# clock at the perf_counter time argv[8] (CLOCK_MONOTONIC, one clock for all of them), after its query.
FLOOR = """
import json, os, sys, time
from pathlib import Path
import duckdb
work, inp, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
kernel, sync = sys.argv[4] == "kernel", sys.argv[5] != "nosync"
part, parts, start_at = int(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8])
con = duckdb.connect(str(work / "pack_assets.duckdb"), read_only=True)
rows = con.execute(\'\'\'SELECT p.output_shard, p.pack_id, s.shard, min(m."offset"), max(m."offset" + m.size)
    FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN samples s USING (sample_id)
    JOIN members m USING (sample_id)
    GROUP BY p.output_shard, p.pack_id, pm.position, s.shard, s.sample_id ORDER BY 1, 2, pm.position\'\'\').fetchall()
con.close()
mine = sorted({r[0] for r in rows})[part::parts]
rows = [r for r in rows if r[0] in mine]
out.mkdir(parents=True, exist_ok=True)
src = {}
time.sleep(max(0.0, start_at - time.perf_counter()))
t, c = time.perf_counter(), time.process_time()
total, fd, shard, pack, bufs = 0, -1, None, None, []
def flush():
    global bufs
    if bufs:
        os.writev(fd, bufs)
        bufs = []
for out_shard, pack_id, source, lo, hi in rows:
    if out_shard != shard:
        flush()
        if fd >= 0:
            if sync:
                os.fsync(fd)
            os.close(fd)
        shard, fd = out_shard, os.open(out / out_shard, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if pack_id != pack:
        flush()
        pack = pack_id
    if source not in src:
        src[source] = os.open(inp / f"{source}.tar", os.O_RDONLY)
    if kernel:
        left, at = hi - lo, lo
        while left:
            n = os.copy_file_range(src[source], fd, left, at)
            if n <= 0:
                raise SystemExit(f"copy_file_range copied nothing at {source} {at}")
            left, at = left - n, at + n
    else:
        bufs.append(os.pread(src[source], hi - lo, lo))
    total += hi - lo
flush()
if fd >= 0:
    if sync:
        os.fsync(fd)
    os.close(fd)
print(json.dumps({"start": t, "end": time.perf_counter(), "cpu_s": time.process_time() - c, "bytes": total}))
"""
FLOORS = {"floor": ("read", "sync"), "floor_kernel": ("kernel", "sync"), "floor_kernel_nosync": ("kernel", "nosync")}


def floor_once(inp: Path, work: Path, out: Path, how: tuple[str, str], workers: int) -> dict:
    """One floor with `workers` processes side by side, timed from the common start to the last one's end.
    A sync after it, untimed: what a floor without fsync leaves dirty is not written during `cp`'s timing."""
    shutil.rmtree(out, ignore_errors=True)
    start_at = time.perf_counter() + 2.0  # after every process's imports and query
    procs = [subprocess.Popen([sys.executable, "-c", FLOOR, str(work), str(inp), str(out), *how, str(i), str(workers),
                               repr(start_at)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(workers)]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        if proc.returncode:
            raise SystemExit(stderr[-4000:])
        done.append(json.loads(stdout.strip().splitlines()[-1]))
    os.sync()
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": max(d["end"] for d in done) - min(d["start"] for d in done),
            "cpu_s": sum(d["cpu_s"] for d in done), "bytes": sum(d["bytes"] for d in done)}


def prepare(inp: Path, work: Path, max_len: int) -> None:
    from pack_assets.core import store
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.scan import ScanOptions, run_manifest

    shutil.rmtree(work, ignore_errors=True)
    shards = list(store.find_shards(inp))
    profile = load_profile("qwen3-vl")
    for s in shards:
        run_manifest(inp, work, s, ScanOptions(hash_members=True), force=True)
        run_token_lengths(work, s, profile, force=True)
    run_plan(work, shards, PlanConfig(max_len=max_len), profile)


def write_once(src: Path, inp: Path, work: Path, out: Path, workers: int = 1) -> dict:
    proc = subprocess.run([sys.executable, "-c", WRITE, str(src), str(inp), str(work), str(out), str(workers)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cp_once(files: list[str], dest: Path, sync: bool) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", *files, str(dest)], check=True)
    if sync:
        subprocess.run(["sync", "-f", str(dest)], check=True)
    took = time.perf_counter() - t0
    shutil.rmtree(dest, ignore_errors=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", help="a folder holding the baseline's pack_assets package (optional)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--per-shard", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=16)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1, help="writer processes (pack-assets run: one per core)")
    ap.add_argument("--out", default="bench/out/write")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/write_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "write")
    out = Path(args.out).resolve()
    inp = out / f"set-{args.shards}x{args.per_shard}-{args.image_kb}k-{args.images}i"
    paths = make_shards(inp, args.shards, args.per_shard, args.image_kb, images=args.images)
    files = [str(p) for p in paths]
    src_bytes = sum(p.stat().st_size for p in paths)
    work = out / "work"
    prepare(inp, work, args.max_len)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    codes = {"this": REPO, **({"baseline": Path(args.baseline_src).resolve()} if args.baseline_src else {})}
    for code, src in codes.items():  # untimed warm-up of each writer
        write_once(src, inp, work, out / f"packed-{code}", args.workers)
    rounds = []
    for r in range(args.repeats):
        rec: dict = {"round": r}
        # this and the baseline take turns going first (this, baseline; baseline, this; ...): going first after
        # the floors and `cp` of the round before is not the same as going second
        for code, src in (list(codes.items()) if r % 2 == 0 else list(codes.items())[::-1]):
            rec[code] = write_once(src, inp, work, out / f"packed-{code}", args.workers)
        for floor, how in FLOORS.items():
            rec[floor] = floor_once(inp, work, out / "floor", how, args.workers)
        rec["cp_s"] = cp_once(files, out / "cp", sync=False)
        rec["cp_sync_s"] = cp_once(files, out / "cp", sync=True)
        for code in (*codes, *FLOORS):
            speed = rec[code]["bytes"] / rec[code]["wall_s"]
            rec[f"{code}_vs_cp"] = round(speed / (src_bytes / rec["cp_s"]), 3)
            rec[f"{code}_vs_cp_sync"] = round(speed / (src_bytes / rec["cp_sync_s"]), 3)
        rec["this_to_floor_wall"] = round(rec["this"]["wall_s"] / rec["floor"]["wall_s"], 3)
        # issue 41's figure: the writer against the fsynced kernel-copy floor of the same round
        rec["this_to_floor_kernel_wall"] = round(rec["this"]["wall_s"] / rec["floor_kernel"]["wall_s"], 3)
        if "baseline" in codes:
            rec["baseline_to_floor_kernel_wall"] = round(rec["baseline"]["wall_s"] / rec["floor_kernel"]["wall_s"], 3)
            rec["this_to_baseline_wall"] = round(rec["this"]["wall_s"] / rec["baseline"]["wall_s"], 3)
            rec["this_to_baseline_cpu"] = round(rec["this"]["cpu_s"] / rec["baseline"]["cpu_s"], 3)
        rec["load_avg"] = os.getloadavg()
        print(json.dumps(rec), flush=True)
        rounds.append(rec)
    med = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]
           if k.endswith(("_vs_cp", "_vs_cp_sync", "_wall", "_cpu")) or k in ("cp_s", "cp_sync_s")}
    for code in (*codes, *FLOORS):
        med[f"{code}_wall_s"] = round(statistics.median(r[code]["wall_s"] for r in rounds), 3)
        med[f"{code}_cpu_s"] = round(statistics.median(r[code]["cpu_s"] for r in rounds), 3)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load_avg_at_end": os.getloadavg(),
              "config": {k: getattr(args, k) for k in ("shards", "per_shard", "image_kb", "images", "max_len",
                                                       "repeats", "baseline_src", "workers")},
              "source_bytes": src_bytes, "members": args.shards * args.per_shard * (1 + args.images),
              "medians": med, "rounds": rounds}
    dest.write(result)
    print(json.dumps(med), flush=True)


if __name__ == "__main__":
    main()
