"""Where each stage of one `pack-assets run` spends the machine's cores: per stage, its wall seconds, the CPU
seconds of the command's own process (its Dagster runs execute in it) and of its other processes (the helpers,
writers, audit workers), and how busy that kept the cores ((main + others) / (cores x wall)). A stage that is
CPU-bound but leaves cores idle shows a busy fraction well under 1 on a quiet machine.

    python bench/bench_stage_cpu.py --input <shards> --out <scratch> [--max-len 16384] [--results <new file>]

Reads /proc every 0.2 s (each process's utime + stime; a process that ended keeps its last reading, so up to
0.2 s of its CPU can be missed). Stages are the summary's `stage_seconds` laid end to end from the command's
start (bench/rss.py's `by_stage` places the pack steps by the Dagster event log instead; the shard stage,
which this is for, is placed the same way by both). On a shared machine the busy fraction says nothing (other
people's processes take the cores): record the load average, as this does, and compare CPU seconds only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        pass
    return out


def _cpu(pid: int) -> float | None:
    """utime + stime of a process in seconds (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def sample_tree(proc: subprocess.Popen, every: float = 0.2) -> list[tuple[float, float, float]]:
    """(seconds since start, the root's CPU, its descendants' CPU summed) until the process ends."""
    t0, line, last = time.perf_counter(), [], {}
    while proc.poll() is None:
        tree, i = [proc.pid], 0
        while i < len(tree):
            tree += _children(tree[i])
            i += 1
        for pid in tree[1:]:
            c = _cpu(pid)
            if c is not None:
                last[pid] = c
        line.append((time.perf_counter() - t0, _cpu(proc.pid) or 0.0, sum(last.values())))
        time.sleep(every)
    return line


def per_stage(line: list[tuple[float, float, float]], stage_seconds: dict[str, float], cores: int) -> dict:
    out, edge = {}, 0.0
    for name, s in stage_seconds.items():
        a, b = edge, edge + s
        edge = b
        pts = [x for x in line if a <= x[0] <= b]
        if len(pts) < 2:
            continue
        main, others = pts[-1][1] - pts[0][1], pts[-1][2] - pts[0][2]
        span = pts[-1][0] - pts[0][0]
        out[name] = {"seconds": s, "main_cpu_s": round(main, 2), "others_cpu_s": round(others, 2),
                     "busy_of_cores": round((main + others) / (cores * span), 3) if span else None}
    return out


def measured_run(input_dir: Path, scratch: Path, max_len: int) -> tuple[list[str], dict, dict]:
    """One `pack-assets run` of ``input_dir`` (work, packed and dagster_home made anew under ``scratch``), its
    process tree sampled: (the command, its summary, `per_stage`'s figures)."""
    for d in ("work", "packed", "dagster_home"):
        shutil.rmtree(scratch / d, ignore_errors=True)
    exe = str(Path(sys.executable).parent / "pack-assets")
    cmd = [exe, "run", "--input", str(input_dir), "--max-len", str(max_len), "--work", str(scratch / "work"),
           "--output", str(scratch / "packed"), "--dagster-home", str(scratch / "dagster_home"), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = sample_tree(proc)
    text = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"the run ended {proc.returncode}")
    summary = json.loads(text[text.index("{"):])
    return cmd, summary, per_stage(line, summary["stage_seconds"], os.cpu_count() or 1)


def arguments(stem: str) -> argparse.Namespace:
    """--input, --out (scratch), --max-len and --results (default: a new bench/results/<stem>_<UTC>.json)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path, help="scratch: work, packed and dagster_home go under it")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--results", help=f"a new file or folder (default: a new bench/results/{stem}_<UTC>.json)")
    return ap.parse_args()


def main() -> None:
    args = arguments("stage_cpu")
    out = ResultsFile(args.results, "stage_cpu")
    load0 = os.getloadavg()
    cmd, summary, stages = measured_run(args.input, args.out, args.max_len)
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": cmd,
           "load_avg_at_start": load0, "load_avg_at_end": os.getloadavg(), "samples": summary["samples"],
           "helpers_scan_count_seconds": summary.get("helpers_scan_count_seconds"), "stages": stages}
    print(json.dumps(doc["stages"], indent=1))
    print(f"results: {out.write(doc)}")


if __name__ == "__main__":
    main()
