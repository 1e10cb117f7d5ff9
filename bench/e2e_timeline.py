"""The timeline of one `pack-assets run`: every process of its tree sampled every 0.25 s (`/proc/<pid>/stat`
utime + stime), so that each stage's wall can be split into the CPU each kind of process used and the core
seconds left idle, and the serial sections (the tree using about one core of two) can be found. With
``--code`` given twice or more, the runs alternate between those code trees (PYTHONPATH), paired, and the
record has each run's CPU seconds of the whole tree per stage.

    python -P bench/e2e_timeline.py --input <shards> --out <scratch> [--code <tree> ...] [--rounds 1]
        [--evict] [--max-len 16384] [--timeline] [--keep] [--pss] [--results <new file>]

The input's pages are evicted before each run with --evict (posix_fadvise DONTNEED on those files only, as
bench_stage_floors.py does). Stages: the summary's start-up and dagster-load from the command's start, the shard
stage up to the first pack step, each pack step by the Dagster event log (bench/rss.py). Kinds of process:
`main` (the command), `helpers` (its pool, forked before the shard stage), and those first seen in a pack step
(`writers`, `audit workers`; the plan's). The machine's other load is recorded (/proc/stat's busy time minus the
tree's): on a shared machine idle seconds of the tree are not idle cores. CPU seconds are the figures to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stage_floors import evict  # noqa: E402
from common import ResultsFile, machine  # noqa: E402
from rss import _CHILD_KIND, process_tree, stage_of, stage_spans, step_spans  # noqa: E402

MB = 1 << 20

_TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime + stime in seconds) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = text[text.rfind(")") + 2:].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / _TICK


def _runnable(pid: int) -> tuple[int, float]:
    """How many of a process's threads are runnable now (state R: running, or waiting for a core), and the
    seconds its threads have spent runnable so far (on a core or in its run queue: /proc/…/schedstat)."""
    n, ready = 0, 0.0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                text = Path(f"/proc/{pid}/task/{t}/stat").read_text()
                on, queued = Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[:2]
            except OSError:
                continue
            n += text[text.rfind(")") + 2] == "R"
            ready += (int(on) + int(queued)) / 1e9
    except OSError:
        pass
    return n, ready


def _pss(pid: int) -> tuple[int, int]:
    """(Pss, Pss_Anon) of a process in bytes, (0, 0) when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    f = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in text.splitlines()[1:] if ":" in line)}
    return f.get("Pss", 0), f.get("Pss_Anon", 0)


def _hwm(pid: int) -> int:
    """A process's VmHWM (the kernel's high-water mark of its RSS) in bytes, 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    at = text.find("VmHWM:")
    return int(text[at + 6:text.index("\n", at)].split()[0]) * 1024 if at >= 0 else 0


def _machine_busy() -> float:
    """The whole machine's busy CPU seconds (every core's time that is not idle or iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / _TICK


class Timeline(threading.Thread):
    """Samples the tree below ``root`` every ``every`` s: `points` (wall time, machine busy, {pid: CPU s},
    {pid: runnable threads}), `procs` pid → {parent, first (wall time first seen)}. A process that ended keeps
    its last CPU reading."""

    def __init__(self, root: int, every: float = 0.25, pss: bool = False) -> None:
        super().__init__(daemon=True)
        self.root, self.every, self.halt, self.with_pss = root, every, threading.Event(), pss
        self.pss: list[tuple[float, dict[int, tuple[int, int]]]] = []  # (wall time, {pid: (Pss, Pss_Anon)})
        self.points: list[tuple[float, float, dict[int, float], dict[int, int]]] = []
        self.procs: dict[int, dict] = {}
        self.last: dict[int, float] = {}
        self.ready: dict[int, float] = {}  # pid → its threads' runnable seconds (on a core or queued), last seen
        self.hwm: dict[int, int] = {}  # pid → its VmHWM last seen (with pss)

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)
        self.sample()

    def sample(self) -> None:
        now, seen = time.time(), {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _stat(int(name))) is not None:
                seen[int(name)] = st
        tree = process_tree(self.root, {p: st[0] for p, st in seen.items()})
        for pid in tree:
            if pid in seen:
                self.procs.setdefault(pid, {"parent": seen[pid][0], "first": now})
                self.last[pid] = seen[pid][1]
        runnable = {}
        for pid in tree:
            if pid in seen:
                n, self.ready[pid] = _runnable(pid)
                if n:
                    runnable[pid] = n
        self.points.append((now, _machine_busy(), dict(self.last), runnable, sum(self.ready.values())))
        if self.with_pss:
            self.pss.append((now, {pid: _pss(pid) for pid in tree if pid in seen}))
            for pid in tree:
                if pid in seen and (h := _hwm(pid)):
                    self.hwm[pid] = h

    def stop(self) -> None:
        self.halt.set()
        self.join()


def kinds(tl: Timeline, spans: list[tuple[str, float, float]]) -> dict[int, str]:
    """pid → kind: the command (`main`, the root), its pool `helpers`, and a pack step's children by the step in
    which they first appeared."""
    return {p: "main" if p == tl.root else _CHILD_KIND.get(stage_of(r["first"], spans), "helpers")
            for p, r in tl.procs.items()}


def analyse(tl: Timeline, spans: list[tuple[str, float, float]]) -> dict:
    """Per stage: wall, CPU by kind, the tree's CPU, idle core seconds (cores × wall − tree CPU), the other
    load, and the seconds the tree ran on less than 1.5 and less than 0.5 cores (serial / nearly idle). Under
    other people's load those say little; what holds is the demand: `serial_cpu_s`, the tree's CPU in intervals
    where at most one of its threads was runnable at both ends (work no second core could share: on a quiet
    machine that many seconds with a core idle), and `serial_by_kind`, whose thread it was; `demand_cores`, the
    tree's threads runnable on average (schedstat: on a core or queued for one; what a quiet machine would run),
    and `quiet_idle_core_s`, the core seconds a quiet machine would leave idle given that demand: each interval's
    CPU × max(0, cores − demand) / min(cores, demand)."""
    kind = kinds(tl, spans)
    stages: dict[str, dict] = {}
    line = []
    for (t0, m0, c0, r0, q0), (t1, m1, c1, r1, q1) in zip(tl.points, tl.points[1:]):
        dt = t1 - t0
        by: dict[str, float] = {}
        for pid, c in c1.items():
            by[kind.get(pid, "other")] = by.get(kind.get(pid, "other"), 0.0) + c - c0.get(pid, 0.0)
        tree = sum(by.values())
        st = stage_of((t0 + t1) / 2, spans)
        rec = stages.setdefault(st, {"wall_s": 0.0, "cpu_s": {}, "tree_cpu_s": 0.0, "others_load_cpu_s": 0.0,
                                     "under_1_5_cores_s": 0.0, "under_0_5_cores_s": 0.0, "serial_cpu_s": 0.0,
                                     "serial_by_kind": {}, "ready_s": 0.0, "quiet_idle_core_s": 0.0})
        rec["wall_s"] += dt
        rec["tree_cpu_s"] += tree
        rec["others_load_cpu_s"] += max(0.0, (m1 - m0) - tree)
        for k, v in by.items():
            rec["cpu_s"][k] = rec["cpu_s"].get(k, 0.0) + v
        rec["under_1_5_cores_s"] += dt if tree < 1.5 * dt else 0.0
        rec["under_0_5_cores_s"] += dt if tree < 0.5 * dt else 0.0
        demand = max(0.0, q1 - q0) / dt
        rec["ready_s"] += max(0.0, q1 - q0)
        rec["quiet_idle_core_s"] += tree * max(0.0, CORES - demand) / min(CORES, demand) if demand > 0.05 else 0.0
        if max(sum(r0.values()), sum(r1.values())) <= 1:
            rec["serial_cpu_s"] += tree
            for k, v in by.items():
                rec["serial_by_kind"][k] = rec["serial_by_kind"].get(k, 0.0) + v
        line.append((t0 - tl.points[0][0], dt, st, by, demand))
    for rec in stages.values():
        rec["idle_core_s"] = rec["wall_s"] * CORES - rec["tree_cpu_s"]
        rec["demand_cores"] = rec.pop("ready_s") / rec["wall_s"] if rec["wall_s"] else 0.0
        for k in ("wall_s", "tree_cpu_s", "others_load_cpu_s", "under_1_5_cores_s", "under_0_5_cores_s",
                  "idle_core_s", "serial_cpu_s", "demand_cores", "quiet_idle_core_s"):
            rec[k] = round(rec[k], 2)
        for k in ("cpu_s", "serial_by_kind"):
            rec[k] = {kind: round(v, 2) for kind, v in rec[k].items()}
    return {"stages": stages, "low_demand": low_demand(line), "timeline_cores": buckets(line),
            "processes": {str(p): {"kind": kind[p], "first_s": round(r["first"] - tl.points[0][0], 2),
                                   "cpu_s": round(tl.last.get(p, 0.0), 2)} for p, r in tl.procs.items()}}


def memory(tl: Timeline, spans: list[tuple[str, float, float]]) -> dict:
    """Per stage: the tree's PSS peak (MiB), when (s from the start), and each process's PSS and anonymous PSS at
    that moment (by pid, with its kind); each process's own PSS peak in the stage; the 5 s buckets of each
    kind's PSS summed (the bucket's largest sample); and each process's VmHWM as last seen (`vmhwm_mb`: the
    kernel's high-water mark of its RSS, exact whatever the sampling misses)."""
    kind, t_start = kinds(tl, spans), tl.points[0][0] if tl.points else 0.0
    stages: dict[str, dict] = {}
    line: list = []
    for t, by in tl.pss:
        st = stage_of(t, spans)
        total = sum(p for p, _ in by.values())
        rec = stages.setdefault(st, {"tree_pss_peak_mb": -1, "own_peaks_mb": {}})
        for pid, (p, _) in by.items():
            key = f"{kind.get(pid, 'other')} {pid}"
            rec["own_peaks_mb"][key] = max(rec["own_peaks_mb"].get(key, 0), p // MB)
        if total // MB > rec["tree_pss_peak_mb"]:
            rec.update(tree_pss_peak_mb=total // MB, at_s=round(t - t_start, 1), at_peak_mb={
                f"{kind.get(pid, 'other')} {pid}": [p // MB, a // MB] for pid, (p, a) in sorted(by.items())})
        if not line or t - t_start >= line[-1][0] + 5.0:
            line.append([round(t - t_start, 1), st, {}])
        per_kind: dict[str, int] = {}
        for pid, (p, _) in by.items():
            per_kind[kind.get(pid, "other")] = per_kind.get(kind.get(pid, "other"), 0) + p // MB
        for k, v in per_kind.items():
            line[-1][2][k] = max(line[-1][2].get(k, 0), v)
    return {"pss_by_stage": stages, "pss_timeline_mb": line,
            "vmhwm_mb": {f"{kind.get(pid, 'other')} {pid}": h // MB for pid, h in sorted(tl.hwm.items())}}


def low_demand(line: list, below: float = 1.5, at_least: float = 1.0) -> list[dict]:
    """The spans of at least ``at_least`` s in which the tree's threads asked for fewer than ``below`` cores on
    average (a core idle on a quiet 2-core machine): where, for how long, and whose CPU it was."""
    spans, cur = [], None
    for t, dt, st, by, demand in line:
        if demand < below and (cur is None or cur["stage"] == st):
            cur = cur or {"stage": st, "from_s": round(t, 1), "wall_s": 0.0, "demand": 0.0, "cpu_s": {}}
            cur["wall_s"] += dt
            cur["demand"] += demand * dt
            for k, v in by.items():
                cur["cpu_s"][k] = cur["cpu_s"].get(k, 0.0) + v
            continue
        if cur is not None and cur["wall_s"] >= at_least:
            spans.append(cur)
        cur = None
    if cur is not None and cur["wall_s"] >= at_least:
        spans.append(cur)
    return [{**s, "wall_s": round(s["wall_s"], 1), "demand": round(s["demand"] / s["wall_s"], 2),
             "cpu_s": {k: round(v, 2) for k, v in s["cpu_s"].items() if v >= 0.01}} for s in spans]


def buckets(line: list, width: float = 5.0) -> list:
    """The timeline in ``width``-second buckets: [start s, stage at its start, cores used by kind, demand]."""
    out: list = []
    for t, dt, st, by, demand in line:
        if not out or t >= out[-1][0] + width:
            out.append([round(t, 1), st, {}, 0.0, 0.0])
        b = out[-1]
        for k, v in by.items():
            b[2][k] = b[2].get(k, 0.0) + v
        b[3] += demand * dt
        b[4] += dt
    return [[t, st, {k: round(v / span, 2) for k, v in by.items() if v / span >= 0.01}, round(d / span, 2)]
            for t, st, by, d, span in out if span]


def one_run(code: Path | None, args: argparse.Namespace, tag: str) -> dict:
    scratch = args.out / tag
    for d in ("work", "packed", "dagster_home"):
        shutil.rmtree(scratch / d, ignore_errors=True)
    scratch.mkdir(parents=True, exist_ok=True)
    if args.evict:
        evict(sorted(args.input.glob("*.tar")))
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    # -P: `python -m` puts the working folder first on sys.path, so run from a checkout every --code would import
    # that checkout's package whatever PYTHONPATH says
    cmd = [sys.executable, "-P", "-m", "pack_assets.cli", "run", "--input", str(args.input), "--max-len",
           str(args.max_len), "--work", str(scratch / "work"), "--output", str(scratch / "packed"),
           "--dagster-home", str(scratch / "dagster_home"), "--json"]
    started, load0 = time.time(), os.getloadavg()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    tl = Timeline(proc.pid, pss=args.pss)
    tl.start()
    text, _ = proc.communicate()
    tl.stop()
    if proc.returncode != 0:
        raise SystemExit(f"the run ended {proc.returncode}")
    summary = json.loads(text[text.index("{"):])
    spans = stage_spans(started, summary["stage_seconds"], step_spans(scratch / "dagster_home", started))
    if not args.keep:  # the outputs are the input's size again: one run's at a time
        for d in ("work", "packed", "dagster_home"):
            shutil.rmtree(scratch / d, ignore_errors=True)
    return {"code": str(code) if code else None, "load_avg_at_start": load0, "load_avg_at_end": os.getloadavg(),
            "seconds": summary["seconds"], "stage_seconds": summary["stage_seconds"], "samples": summary["samples"],
            "verdict": summary["verdict"], "violations": summary["violations"], **analyse(tl, spans),
            **(memory(tl, spans) if args.pss else {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--code", action="append", type=Path, help="a code tree for PYTHONPATH; twice or more: paired")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--evict", action="store_true")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--keep", action="store_true", help="keep each run's work, output and Dagster home (else removed)")
    ap.add_argument("--timeline", action="store_true", help="keep each run's timeline (5 s buckets) in the record")
    ap.add_argument("--pss", action="store_true", help="each process's PSS too: the tree's peak per stage, whose")
    ap.add_argument("--results")
    args = ap.parse_args()
    out = ResultsFile(args.results, "e2e_timeline")
    codes = args.code or [None]
    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": CORES,
           "input": str(args.input), "evict": args.evict, "runs": []}
    for r in range(args.rounds):
        for code in (codes if r % 2 == 0 else codes[::-1]):
            rec = one_run(code, args, f"run{codes.index(code)}")
            if not args.timeline:
                rec.pop("timeline_cores")
                rec.pop("pss_timeline_mb", None)
            doc["runs"].append({"round": r, **rec})
            print(json.dumps({k: rec[k] for k in ("code", "seconds", "stage_seconds")}), flush=True)
            print(json.dumps(rec["stages"], indent=1), flush=True)
            if args.pss:
                print(json.dumps({k: {x: v[x] for x in ("tree_pss_peak_mb", "at_s", "at_peak_mb")}
                                  for k, v in rec["pss_by_stage"].items()}), flush=True)
                print(json.dumps({"vmhwm_mb": rec["vmhwm_mb"]}), flush=True)
            out.write(doc)
    print(f"results: {out.path}")


if __name__ == "__main__":
    main()
