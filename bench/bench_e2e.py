"""End to end through Dagster (`pack-assets run`) at scale, then the rerun after adding one shard.

    python bench/bench_e2e.py --samples 1000000 --per-shard 5000 --image-kb 15 --out bench/out/e2e

Checks free disk first (input + output ≈ 2.1 × samples × image size). Prints JSON lines and writes them to
<out>/results.json and to a new results file (--results; default bench/results/e2e_<UTC>.json). ``--again N``
then repeats the quick rerun N times: the last new shard removed, rerun; put back, rerun (its manifest is
current then, so only the plan, write and audit are repeated).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, drop_caches, machine, make_shards, require_free, yardstick  # noqa: E402
from rss import TreeSampler, by_stage, stage_spans, step_spans  # noqa: E402

_MEASURE = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stderr.write(p.stderr); print(p.stdout); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")


def run(cmd: list[str], dagster_home: Path) -> tuple[float, dict, int, dict]:
    """Wall seconds, the JSON summary, the peak RSS of the largest process of this run alone (ru_maxrss), and
    the peak RSS per stage and kind of process (rss.py: the process tree sampled every 0.2 s)."""
    t0, wall0 = time.perf_counter(), time.time()
    proc = subprocess.Popen([sys.executable, "-c", _MEASURE, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(stderr[-4000:])
    out, peak_kb = stdout.rstrip().rsplit("\n", 1)
    summary = json.loads(out)
    spans = stage_spans(wall0, summary["stage_seconds"], step_spans(dagster_home, wall0))
    return time.perf_counter() - t0, summary, int(peak_kb) * 1024, by_stage(sampler, spans)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--per-shard", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=15)
    ap.add_argument("--images", type=int, default=1, help="images per sample (0: text-only samples)")
    ap.add_argument("--max-words", type=int, default=60, help="bound on each turn's length, in 6-word phrases")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--out", default="bench/out/e2e")
    ap.add_argument("--reruns", type=int, default=3, help="how many of the three one-new-shard reruns to run")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache before each run (root): each starts with none of its files cached")
    ap.add_argument("--again", type=int, default=0,
                    help="then, this many times: remove the last new shard and rerun incrementally with the quick "
                         "audit, put it back and rerun the same way (both timed: repeats of the quick rerun)")
    ap.add_argument("--keep-scan", action="store_true",
                    help="keep work/manifest and work/token_lengths from an earlier run of the same set (the rest of "
                         "work/ removed): the run finds its shards scanned and counted, and measures the later stages")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/e2e_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    emit = Results(out, args.results, "e2e")
    n_shards = args.samples // args.per_shard
    inp = out / "shards"
    for d in ("packed", "dagster_home") if args.keep_scan else ("work", "packed", "dagster_home"):
        shutil.rmtree(out / d, ignore_errors=True)  # an earlier run's: the space it holds is counted free
    if args.keep_scan:
        for p in (out / "work").glob("*"):
            if p.name not in ("manifest", "token_lengths"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    have = sum(p.stat().st_size for p in inp.glob("part-*.tar")) if inp.is_dir() else 0  # a set made before
    require_free(out, 2.2 * args.samples * (args.images * args.image_kb * 1024 + 600 + 2 * 36 * args.max_words) - have)
    t0 = time.perf_counter()
    paths = make_shards(inp, n_shards, args.per_shard, args.image_kb, seed=7, images=args.images,
                        max_words=args.max_words)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "generate_s": round(time.perf_counter() - t0, 1),
          "bytes": sum(p.stat().st_size for p in paths), "shards": len(paths)})
    files = [str(p) for p in paths]
    before = yardstick(files)
    emit(before)
    exe = str(Path(sys.executable).parent / "pack-assets")
    cmd = [exe, "run", "--input", str(inp), "--max-len", str(args.max_len), "--work", str(out / "work"),
           "--output", str(out / "packed"), "--dagster-home", str(out / "dagster_home"), "--json"]
    cold = args.drop_caches and drop_caches()
    seconds, summary, peak, rss = run(cmd, out / "dagster_home")
    emit({"page_cache": "dropped before the run" if cold else "as the steps above left it",
          "scan": "kept from an earlier run (--keep-scan)" if args.keep_scan else "made by this run",
          "full_run_s": round(seconds, 1), "samples_per_s": round(summary["samples"] / seconds), "peak_rss_bytes": peak,
          **{k: summary[k] for k in ("samples", "packed", "dropped", "rejected", "packs", "lower_bound", "fill",
                                     "violations", "stage_seconds")}, "rss": rss})
    # the yardstick again: on a shared VM it moves between readings; the ratio stands against both
    after = yardstick(files)
    emit({"cat_after_s": after["cat_s"], "sha256sum_after_s": after["sha256sum_s"],
          "run_to_sha256sum": [round(seconds / before["sha256sum_s"], 2), round(seconds / after["sha256sum_s"], 2)]})
    # each rerun adds one new shard: incremental (audit all), incremental with the quick audit, full replan
    reruns = [("incremental", ["--incremental"]),
              ("incremental, audit changed only", ["--incremental", "--audit-scope", "changed"]),
              ("full replan", [])]
    for i, (label, flags) in enumerate(reruns[:args.reruns]):
        extra = make_shards(out / f"extra{i}", 1, args.per_shard, args.image_kb, seed=99 - i, images=args.images,
                            max_words=args.max_words)[0]
        new = inp / f"part-{n_shards + i:05d}.tar"
        if new.exists():  # a set left by an earlier run: copying over it would add no data
            raise SystemExit(f"{new} exists: remove the reruns' shards (part-{n_shards:05d}.tar on) first")
        shutil.copy(extra, new)
        cold = args.drop_caches and drop_caches()
        seconds2, summary2, peak2, rss2 = run(cmd + flags, out / "dagster_home")
        emit({"rerun_after_one_new_shard": label, "page_cache": "dropped" if cold else "warm",
              "seconds": round(seconds2, 1),
              "shard_runs": summary2["shard_runs"], "samples": summary2["samples"], "packs": summary2["packs"],
              "fill": summary2["fill"], "output_shards_written": summary2["output_shards_written"],
              "output_shards_trusted": summary2["output_shards_trusted"],
              "output_shards_hashed": summary2.get("output_shards_hashed"), "violations": summary2["violations"],
              "stage_seconds": summary2["stage_seconds"], "peak_rss_bytes": peak2, "rss": rss2,
              "ratio_to_full": round(seconds2 / seconds, 3)})
    if args.again and not args.reruns:
        raise SystemExit("--again repeats a rerun's shard: give --reruns 1 or more")
    last = inp / f"part-{n_shards + min(args.reruns, len(reruns)) - 1:05d}.tar"
    aside = out / "again.tar"
    quick = ["--incremental", "--audit-scope", "changed"]
    for k in range(args.again):
        for label in ("one shard removed", "the shard back"):
            if label == "one shard removed":
                shutil.move(last, aside)
            else:
                shutil.move(aside, last)
            cold = args.drop_caches and drop_caches()
            seconds2, summary2, peak2, rss2 = run(cmd + quick, out / "dagster_home")
            emit({"again": k + 1, "rerun": f"{label}, incremental, audit changed only",
                  "page_cache": "dropped" if cold else "warm", "seconds": round(seconds2, 1),
                  "samples": summary2["samples"], "output_shards_written": summary2["output_shards_written"],
                  "output_shards_trusted": summary2["output_shards_trusted"], "violations": summary2["violations"],
                  "stage_seconds": summary2["stage_seconds"], "peak_rss_bytes": peak2, "rss": rss2,
                  "ratio_to_full": round(seconds2 / seconds, 3)})


if __name__ == "__main__":
    main()
