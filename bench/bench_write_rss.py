"""The write stage's memory (issue 41): `run_write` of this code and of a baseline copy of the code on one
counted and planned work folder, each in a fresh process, its process tree sampled (bench/rss.py: every 0.2 s,
each process's RSS and VmHWM, the tree's PSS summed), and the two outputs compared file by file.

    git archive main pack_assets | tar -x -C /tmp/base
    python -P bench/bench_write_rss.py --work W --input IN --out /scratch/x --baseline-src /tmp/base

``W``: a work folder that `pack-assets run` took to its plan (manifest, token_lengths, pack_plan; a copy: the
writer's record and staged rows are written into it). At issue 41's 10M shape (tiny text samples, output
shards of ~313k samples), 200 of /work/bench10m's shards (2M samples) give the same output shard as at 10M.
Per code: the writer's main process's VmHWM, the largest writer process's VmHWM, the tree's RSS summed and
PSS at their peaks, the wall seconds, the CPU seconds of the whole tree (the writer processes' included), and
whether the outputs are equal. ``--rounds N``: N runs of each code, the two alternating which goes first, for a
paired CPU figure (this / baseline per round; a shared machine's wall seconds say little). ``--job``: instead of
the stage, its largest writer job alone (rows staged once by this code), each code in a fresh process: the job's
CPU seconds and the process's VmRSS and VmHWM at the end of each phase (each query's rows read, the shard
prepared, written). Writes a new file under bench/results (--results).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, machine  # noqa: E402
from rss import TreeSampler  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MB = 1 << 20

WRITE = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from pack_assets.core.write import run_write
run_write(Path(sys.argv[3]), Path(sys.argv[2]), Path(sys.argv[4]), workers=int(sys.argv[5]))
"""

# ``--job``: one writer job (`copy._load` then `copy._write_group`, as a writer process runs it) in a fresh process,
# on rows staged once for both codes; the process's VmRSS and VmHWM read at each phase's end (VmHWM, the kernel's
# high-water mark, is the peak up to then, exact whatever a sampler misses)
JOB = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from pack_assets.core import store
from pack_assets.core.plan import PlanInfo
from pack_assets.core.write import batches, bulk, copy, shard, shared
def status():
    f = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmRSS", "VmHWM")))
    return {k: int(v.split()[0]) >> 10 for k, v in f.items()}
phases = []
def mark(name):
    phases.append({"after": name, **status()})
def wrapped(f, name):
    def g(*a, **k):
        got = f(*a, **k)
        mark(name(*a) if callable(name) else name)
        return got
    return g
bulk.group_table = wrapped(bulk.group_table, lambda con, queries, query, *a: f"read {query}")
copy._prepared = wrapped(copy._prepared, "prepared (fingerprint, first batch)")
shard.end_shard = wrapped(shard.end_shard, "written")
work, rows, group, out = Path(sys.argv[2]), store.Staged(Path(sys.argv[4])), json.loads(sys.argv[5]), sys.argv[6]
with store.connect(work, read_only=True) as con:
    context = shared.write_context(PlanInfo.load(con))
mark("start")
t0 = time.process_time()
done = copy._write_group((out, group, context, lambda g: copy._load(str(work), sys.argv[3], rows, None, context,
                                                                     frozenset(), g)))
print(json.dumps({"cpu_s": round(time.process_time() - t0, 2), "samples": sum(r.samples for r in done),
                  "phases_mb": phases}))
"""


def one_job(codes: list, args: argparse.Namespace, out: Path, results) -> None:
    """``--job``: the largest writer job of the work folder, each code in turn (--rounds, alternating)."""
    sys.path.insert(0, str(REPO))
    from pack_assets.core import store
    from pack_assets.core.write.bulk import STAGED_BATCHES, bulk_rows
    from pack_assets.core.write.copy import shard_samples, writer_groups
    from pack_assets.core.write.shared import planned_shards
    work = Path(args.work)
    with store.connect(work, read_only=True) as con:
        samples, queries = shard_samples(con), bulk_rows(con)
        groups = writer_groups(planned_shards(con), args.workers, samples)
    job = max(groups, key=lambda g: sum(samples[n] for n in g))
    with store.staged(work, queries, sum(groups, []), groups=groups, batch_rows=STAGED_BATCHES) as rows:
        for r in range(args.rounds):
            for name, src in codes if r % 2 == 0 else codes[::-1]:
                shutil.rmtree(out / name, ignore_errors=True)
                (out / name).mkdir(parents=True)
                got = subprocess.run([sys.executable, "-P", "-c", JOB, str(src), str(work), args.input, str(rows.root),
                                      json.dumps(job), str(out / name)], capture_output=True, text=True)
                if got.returncode != 0:
                    raise SystemExit(got.stderr[-3000:])
                results({"round": r, "code": name, "job": job, **json.loads(got.stdout)})
            results({"round": r, "outputs_equal": same_files(out / "this", out / "baseline")})


def measure(src: Path, work: Path, inp: Path, out: Path, workers: int) -> dict:
    """One `run_write` in a fresh process, its tree sampled."""
    shutil.rmtree(out, ignore_errors=True)
    (work / "written_shards.json").unlink(missing_ok=True)  # a first write: nothing vouched for
    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = subprocess.Popen([sys.executable, "-P", "-c", WRITE, str(src), str(inp), str(work), str(out), str(workers)],
                            stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(os.getpid())
    sampler.start()
    err = proc.communicate()[1]
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(err[-3000:])
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0  # (its pool's processes, waited for, included)
    main = sampler.procs.get(proc.pid, {}).get("hwm", 0)
    writers = [p["hwm"] for pid, p in sampler.procs.items() if p["parent"] == proc.pid]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "main_hwm_mb": main // MB,
            "largest_writer_hwm_mb": max(writers, default=0) // MB, "writer_processes": len(writers),
            "tree_rss_peak_mb": max((sum(r.values()) for _, r in sampler.samples), default=0) // MB,
            "tree_pss_peak_mb": max((p for _, p in sampler.pss), default=0) // MB}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def same_files(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if files != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    return all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="a counted and planned work folder (a copy: it is written to)")
    ap.add_argument("--input", required=True, help="its input folder")
    ap.add_argument("--out", required=True, help="scratch folder for the two outputs")
    ap.add_argument("--baseline-src", required=True, help="a copy of the baseline's pack_assets' parent folder")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each code, alternating which goes first")
    ap.add_argument("--job", action="store_true", help="one writer job's phases (JOB), not the stage")
    ap.add_argument("--label", default="")
    ap.add_argument("--results", default=None, help="results file or folder (default: a new file in bench/results)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out, args.results, "write_rss")
    results({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "label": args.label, "work": args.work,
             "workers": args.workers})
    codes = (("this", REPO), ("baseline", Path(args.baseline_src)))
    if args.job:
        one_job(list(codes), args, out, results)
        return
    ratios = []
    for r in range(args.rounds):
        got = {}
        for name, src in codes if r % 2 == 0 else codes[::-1]:
            # the same folder name for both: wids-index.json and the owned-files list name it
            got[name] = measure(src, Path(args.work), Path(args.input), out / name / "packed", args.workers)
            results({"round": r, "code": name, **got[name]})
        ratios.append(got["this"]["cpu_s"] / got["baseline"]["cpu_s"])
        results({"round": r, "this_to_baseline_cpu": round(ratios[-1], 3),
                 "outputs_equal": same_files(out / "this" / "packed", out / "baseline" / "packed")})
        for name in got:
            shutil.rmtree(out / name, ignore_errors=True)
    if args.rounds > 1:
        results({"this_to_baseline_cpu_median": round(statistics.median(ratios), 3)})


if __name__ == "__main__":
    main()
