"""The audit stage's memory, this code against a baseline's, in one sitting: each process's peak RSS and the tree's PSS.

    python bench/bench_audit_rss.py --work <run>/work --packed <run>/packed --baseline-src /work/main \
        --results bench/results/audit_rss_<name>.json

Over a finished run's folders (e.g. `pack-assets run` over 100 or 200 shards of /work/bench10m/shards: output
shards of ~1,000 packs of ~313 tiny samples, the 10M run's shape per output shard): for each code (this checkout,
the package at --baseline-src), in turn, a fresh process (python -P) runs the full audit (no record of an
earlier clean audit: every output shard read and checked) as the command does: its recount and figures in a pool
of two helper processes started before it, the output shards read by two spawned audit worker processes
(``--mode processes``, as at 10M where the output is over a GB) or two threads. `bench/rss.py`'s TreeSampler
samples the tree every 0.2 s: per kind of process (main, audit workers, helpers) the largest RSS seen, the
largest VmHWM (the kernel's exact high-water mark), and the whole tree's RSS and PSS summed at their peak.
Also the audit's verdict and seconds (a shared machine: seconds are provisional). The audit's record
(audited_shards.json) is put back as it was at the end.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402
from rss import TreeSampler  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
MODES = {"processes": {"workers": 2, "parallel_min_bytes": 0}, "threads": {"workers": 2, "parallel_min_bytes": 1 << 62}}

_ONE = """
import json, os, sys, time
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
from pack_assets.core import audit
work, out, kw, probing, pooled = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
# the command's helpers: the recount and the report's figures run there (`pack-assets verify` has none)
pool = ProcessPoolExecutor(2) if pooled == "1" else None
if pool is not None:
    list(pool.map(abs, range(8)))  # started before the audit: told apart from its workers by pid
helpers = sorted(pool._processes) if pool is not None else []
print(json.dumps({"helpers": helpers}), flush=True)
if probing == "1":
    sys.path.insert(0, sys.argv[6])
    from rss import SelfProbe
    probe = SelfProbe()
    _PROBE_HOOKS
    probe.start()
t = time.perf_counter()
r = audit.run_audit(work, out, pool=pool, **kw)
done = {"audit_s": round(time.perf_counter() - t, 2), "verdict": r.verdict, "violations": len(r.violations),
        "samples": r.stats["samples_read"], "packs_read": r.stats["packs_read"], "recounted": r.stats.get("recounted")}
if probing == "1":
    probe.phase = "after"
    done["probe"] = probe.stop()
print(json.dumps(done), flush=True)
if pool is not None:
    pool.shutdown()
"""
# the probe's phases: each named step of `run_audit` marks the phase it starts (the probe's samples carry it), and
# the catalog's connection is handed to the probe (its DuckDB's buffer manager read by a cursor of its own)
_PROBE_HOOKS = """
import contextlib, functools
from pack_assets.core import store, report
def _mark(mod, name, phase, after=None):
    fn = getattr(mod, name)
    @functools.wraps(fn)
    def marked(*a, **k):
        if probe.phase != "before the audit" or name == "run_audit":  # (a run's earlier stages: one phase)
            probe.phase = phase
        try:
            return fn(*a, **k)
        finally:
            if after:
                probe.phase = after
    setattr(mod, name, marked)
_connect = store.connect
def _watched(*a, **k):
    con = _connect(*a, **k)
    probe.watch(con)
    return con
store.connect = _watched
for name, phase in (("check_plan", "plan checks"), ("audit_figures", "figures"), ("current_stamps", "stamps"),
                    ("recount", "recount pick"), ("_check_seen", "seen"), ("per_shard", "counts"),
                    ("write_report", "report"), ("_shard_results", "reading")):
    _mark(audit, name, phase)
_staged = store.staged
@contextlib.contextmanager
def _staged_marked(*a, **k):
    if probe.phase == "before the audit":  # a run's write stage stages its rows too
        with _staged(*a, **k) as rows:
            yield rows
        return
    probe.phase = "staging"
    with _staged(*a, **k) as rows:
        probe.phase = "reading"
        yield rows
    probe.phase = "after staging"
store.staged = _staged_marked
""".replace("\n", "\n    ")
_ONE = _ONE.replace("_PROBE_HOOKS", _PROBE_HOOKS.strip())
# the command itself (`pack-assets verify ...` or `run ...`) in a probed process: its phases are the audit's as
# above, everything before `run_audit` one phase (a run's earlier stages); the probe's samples written to a file
# as the command exits
_CLI = """
import json, sys
sys.path.insert(0, sys.argv[1])
from rss import SelfProbe
from pack_assets.core import audit
from pack_assets import cli
probe = SelfProbe()
_PROBE_HOOKS
_mark(audit, "run_audit", "audit start")
probe.phase = "before the audit"
_exit, _file = cli.exit_without_teardown, sys.argv[2]
def _dump(code):
    probe.phase = "after"
    with open(_file, "w") as f:
        json.dump(probe.stop(), f)
    _exit(code)
cli.exit_without_teardown = _dump
sys.argv = ["pack-assets", *sys.argv[3:]]
probe.start()
cli.main()
""".replace("_PROBE_HOOKS", _PROBE_HOOKS.replace("\n    ", "\n").strip())

GB = 1 << 30


def one(src: Path, work: Path, packed: Path, kw: dict, probe: bool = False, pooled: bool = True) -> dict:
    """One full audit in a fresh process, its tree sampled; with ``probe``, its own memory broken down by phase
    (`rss.SelfProbe`) and each process's PSS by phase."""
    (work / "audited_shards.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    p = subprocess.Popen([sys.executable, "-P", "-c", _ONE, str(work), str(packed), json.dumps(kw), str(int(probe)),
                          str(int(pooled)), str(Path(__file__).resolve().parent)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = TreeSampler(os.getpid(), keep_pss=probe)  # this process's children: the audit's process and below
    sampler.start()
    out, err = p.communicate()
    sampler.stop()
    if p.returncode != 0:
        raise SystemExit(err[-3000:])
    lines = [json.loads(x) for x in out.strip().splitlines() if x.startswith("{")]
    helpers = set(lines[0]["helpers"])
    kind = {pid: "main" if pid == p.pid else "helpers" if pid in helpers else "audit workers"
            for pid in sampler.procs}
    largest: dict[str, int] = {}
    for _, rss in sampler.samples:
        for pid, r in rss.items():
            largest[kind[pid]] = max(largest.get(kind[pid], 0), r)
    hwm: dict[str, int] = {}
    for pid, rec in sampler.procs.items():
        hwm[kind[pid]] = max(hwm.get(kind[pid], 0), rec["hwm"])
    done = lines[-1]
    points = done.pop("probe", None)
    return {**done,
            "largest_rss_gb": {k: round(v / GB, 3) for k, v in sorted(largest.items())},
            "largest_hwm_gb": {k: round(v / GB, 3) for k, v in sorted(hwm.items())},
            "tree_rss_gb": round(max((sum(r.values()) for _, r in sampler.samples), default=0) / GB, 3),
            "tree_pss_gb": round(max((v for _, v in sampler.pss), default=0) / GB, 3),
            "processes": {k: sum(1 for v in kind.values() if v == k) for k in sorted(set(kind.values()))},
            **(by_phase(points, sampler, kind) if points else {})}


def _fresh(work: Path, packed: Path) -> None:
    """A run's folders as before its plan: the scan and counts kept (as bench_e2e.py --keep-scan)."""
    for p in work.glob("*"):
        if p.name not in ("manifest", "token_lengths"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    for d in (packed, work.parent / "dagster_home"):
        shutil.rmtree(d, ignore_errors=True)


def one_cli(src: Path, args: list[str], scratch: Path) -> dict:
    """`pack-assets <args>` in a fresh probed process, its tree sampled: the command's memory by phase and each
    process's PSS; a process first seen before the audit is a `helper` (a run's pool, writers), after it an
    `audit worker`."""
    points_file = scratch / f"probe-{os.getpid()}-{time.time_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-P", "-c", _CLI, str(Path(__file__).resolve().parent), str(points_file),
                          *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = TreeSampler(os.getpid(), keep_pss=True)
    sampler.start()
    out, err = p.communicate()
    sampler.stop()
    points = json.loads(points_file.read_text())
    points_file.unlink()
    audit_from = next((q["t"] for q in points if q["phase"] not in ("start", "before the audit")), float("inf"))
    kind = {pid: "main" if pid == p.pid else "helpers" if rec["first"] < audit_from else "audit workers"
            for pid, rec in sampler.procs.items()}
    hwm: dict[str, int] = {}
    for pid, rec in sampler.procs.items():
        hwm[kind[pid]] = max(hwm.get(kind[pid], 0), rec["hwm"])
    return {"args": args, "exit": p.returncode, "seconds": round(time.perf_counter() - started, 1),
            "audit_s": round(points[-1]["t"] - audit_from, 1), "stdout_tail": out[-600:], "stderr_tail": err[-600:],
            "largest_hwm_gb": {k: round(v / GB, 3) for k, v in sorted(hwm.items())},
            "tree_pss_gb": round(max((v for _, v in sampler.pss), default=0) / GB, 3),
            **by_phase(points, sampler, kind)}


def _phase_at(points: list[dict], t: float) -> str:
    at = bisect.bisect_right([q["t"] for q in points], t) - 1
    return points[at]["phase"] if at >= 0 else "start"


def by_phase(points: list[dict], sampler: TreeSampler, kind: dict[int, str]) -> dict:
    """Per phase of the audit (`SelfProbe`): the tree's PSS at its peak and each kind's PSS then (GiB); the
    command's own memory at its PSS peak in that phase, broken down (GiB): DuckDB's buffer manager, Arrow's
    pool, glibc's heap (Python's objects), file-backed pages, and the anonymous remainder none of them names
    (DuckDB's allocator's cache, the libraries' own)."""
    phases: dict[str, dict] = {}
    for t, each in sampler.pss_each:
        rec = phases.setdefault(_phase_at(points, t), {"tree_pss_gib": 0.0})
        total = sum(each.values()) / GB
        if total > rec["tree_pss_gib"]:
            by: dict[str, float] = {}
            for pid, v in each.items():
                by[kind.get(pid, "other")] = by.get(kind.get(pid, "other"), 0) + v / GB
            rec.update(tree_pss_gib=round(total, 3), kinds_then_gib={k: round(v, 3) for k, v in sorted(by.items())})
    for q in points:
        rec = phases.setdefault(q["phase"], {"tree_pss_gib": 0.0})
        if q.get("pss", 0) / GB > rec.get("main", {}).get("pss", -1):
            dd, arrow, heap = q.get("duckdb", 0), q.get("arrow", 0), q.get("malloc_heap", 0)
            rec["main"] = {"pss": round(q.get("pss", 0) / GB, 3), "anonymous": round(q.get("anonymous", 0) / GB, 3),
                           "file_pss": round(q.get("pss_file", 0) / GB, 3), "duckdb": round(dd / GB, 3),
                           "duckdb_spilled": round(q.get("duckdb_spilled", 0) / GB, 3),
                           "arrow": round(arrow / GB, 3), "arrow_pool_max": round(q.get("arrow_max", 0) / GB, 3),
                           "glibc_heap": round(heap / GB, 3), "glibc_in_use": round(q.get("malloc_in_use", 0) / GB, 3),
                           "anon_not_named": round((q.get("anonymous", 0) - dd - arrow - heap) / GB, 3),
                           "duckdb_tags_gib": {k: round(v / GB, 3) for k, v in q.get("duckdb_tags", {}).items()}}
    t0 = points[0]["t"]
    for q in points:
        rec = phases[q["phase"]]
        rec.setdefault("from_s", round(q["t"] - t0, 1))
        rec["to_s"] = round(q["t"] - t0, 1)
    return {"phases": phases, "main_timeline": [
        [round(q["t"] - t0, 1), q["phase"], round(q.get("pss", 0) / GB, 3), round(q.get("duckdb", 0) / GB, 3),
         round(q.get("arrow", 0) / GB, 3), round(q.get("malloc_heap", 0) / GB, 3)] for q in points[::4]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--packed", required=True)
    ap.add_argument("--baseline-src", required=True, help="a folder holding the baseline's pack_assets package")
    ap.add_argument("--mode", choices=sorted(MODES), default="processes")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--probe", action="store_true", help="the audit process's memory broken down by phase")
    ap.add_argument("--no-pool", action="store_true", help="no helper pool (as `pack-assets verify`): the recount "
                    "and the figures in the audit's process")
    ap.add_argument("--only", choices=("this", "baseline"), help="one code only")
    ap.add_argument("--keep-scan", action="store_true", help="with --cli run: before each run, the work folder "
                    "emptied but for its manifest and token_lengths, the output folder and the Dagster home removed")
    ap.add_argument("--cli", help="instead of the audit alone, this `pack-assets` command line, probed (e.g. "
                    "'verify --work W --output P'); --work and --packed then only name the record to keep")
    ap.add_argument("--results")
    args = ap.parse_args()
    results = ResultsFile(args.results, "audit_rss")
    work, packed = Path(args.work), Path(args.packed)
    record = work / "audited_shards.json"
    saved = record.read_bytes() if record.exists() else None
    codes = {"this": HERE, "baseline": Path(args.baseline_src)}
    doc: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "baseline_src": args.baseline_src, "mode": args.mode, "pool": not args.no_pool,
                 "settings": MODES[args.mode],
                 "output_shards": len(list(packed.glob("*.tar"))),
                 "output_bytes": sum(p.stat().st_size for p in packed.glob("*.tar")),
                 "load_before": os.getloadavg(), "rounds": []}
    try:
        for k in range(args.repeats):
            rnd = {}
            for code in ("this", "baseline") if k % 2 == 0 else ("baseline", "this"):
                if args.only and code != args.only:
                    continue
                if args.keep_scan:
                    _fresh(work, packed)
                rnd[code] = (one_cli(codes[code], args.cli.split(), work.parent) if args.cli else
                             one(codes[code], work, packed, MODES[args.mode], args.probe, not args.no_pool))
                print(json.dumps({code: rnd[code]}), flush=True)
            rnd["load"] = os.getloadavg()
            doc["rounds"].append(rnd)
            results.write(doc)
    finally:
        if saved is not None:
            record.write_bytes(saved)
        else:
            record.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
