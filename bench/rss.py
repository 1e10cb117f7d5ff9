"""Peak RSS of a `pack-assets run` per stage and per kind of process, for bench_e2e.py.

`TreeSampler` reads /proc every ~0.2 s: every process under a root pid, its RSS (VmRSS) and its own peak
(VmHWM, the kernel's high-water mark, exact whatever the sampling misses), and its PSS (smaps_rollup: shared
pages split between the processes that share them, so the tree's PSS summed is its real footprint, where
its RSS summed counts a forked child's pages shared with its parent twice). After the run, `by_stage` puts each
sample in the stage the run was in at that moment: the pack steps' spans from the Dagster event log
(`step_spans`: STEP_START to STEP_SUCCESS, the run's own clock), the spans before them from the summary's
`stage_seconds` laid end to end from the command's start. Kinds: `main` is the `pack-assets run` process (its
Dagster runs execute in it: the in-process executor), its other processes are named by the stage in which
they first appeared (`helpers` from before the plan, `writers` in packed_shards, `audit workers` in
audit_report, `plan children` in pack_plan).
"""

from __future__ import annotations

import ctypes
import os
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

PACK_STEPS = ("pack_plan", "packed_shards", "audit_report")
_CHILD_KIND = {"pack_plan": "plan children", "packed_shards": "writers", "audit_report": "audit workers"}


def _status(pid: int) -> tuple[int, int, int] | None:
    """(ppid, VmRSS, VmHWM) in bytes, or None for a process gone (or a kernel thread: no VmRSS)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    f = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "VmRSS" not in f:
        return None
    kb = lambda k: int(f[k].split()[0]) * 1024  # noqa: E731
    return int(f["PPid"]), kb("VmRSS"), kb("VmHWM")


def _pss(pid: int) -> int:
    """The process's PSS in bytes (0 for a process gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:")), 0)



def process_tree(root: int, parents: dict[int, int]) -> set[int]:
    """``root`` and every descendant of it, whatever the depth, from each live process's parent (pid → ppid)."""
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree and p not in tree}
        tree |= more
        grew = bool(more)
    return tree

class TreeSampler(threading.Thread):
    """Samples the processes below `root` (not `root` itself) until `stop()`; `samples`: (wall time, {pid:
    rss}); `pss`: (wall time, the tree's PSS summed), with ``keep_pss`` `pss_each` per process; `procs`: pid →
    {parent, first (wall time first seen), hwm (its VmHWM when last seen)}."""

    def __init__(self, root: int, every: float = 0.2, keep_pss: bool = False) -> None:
        super().__init__(daemon=True)
        self.root, self.every, self.halt = root, every, threading.Event()
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.pss: list[tuple[float, int]] = []
        self.keep_pss = keep_pss  # also each process's PSS per sample (`pss_each`: (wall time, {pid: PSS}))
        self.pss_each: list[tuple[float, dict[int, int]]] = []
        self.procs: dict[int, dict] = {}

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)
        self.sample()

    def sample(self) -> None:
        now, seen = time.time(), {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _status(int(name))) is not None:
                seen[int(name)] = st
        tree = process_tree(self.root, {p: st[0] for p, st in seen.items()})
        rss = {}
        for pid in tree - {self.root}:
            ppid, r, hwm = seen[pid]
            rec = self.procs.setdefault(pid, {"parent": ppid, "first": now, "hwm": 0})
            rec["hwm"] = max(rec["hwm"], hwm)
            rss[pid] = r
        self.samples.append((now, rss))
        each = {pid: _pss(pid) for pid in rss}
        self.pss.append((now, sum(each.values())))
        if self.keep_pss:
            self.pss_each.append((now, each))

    def stop(self) -> None:
        self.halt.set()
        self.join()


def step_spans(dagster_home: Path, since: float) -> dict[str, tuple[float, float]]:
    """Each pack step's (start, end) wall times, from the event logs of the runs that began after `since`."""
    spans: dict[str, list[float]] = {}
    for db in sorted((dagster_home / "history" / "runs").glob("*.db")):
        if db.stat().st_mtime < since:
            continue
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT step_key, dagster_event_type, timestamp FROM event_logs WHERE "
                               "dagster_event_type IN ('STEP_START', 'STEP_SUCCESS', 'STEP_FAILURE')").fetchall()
        finally:
            con.close()
        for step, kind, ts in rows:
            if step in PACK_STEPS:
                t = datetime.fromisoformat(str(ts)).replace(tzinfo=UTC).timestamp()
                spans.setdefault(step, [t, t])[0 if kind == "STEP_START" else 1] = t
    return {k: (a, b) for k, (a, b) in spans.items()}


def stage_spans(started: float, stage_seconds: dict[str, float], steps: dict[str, tuple[float, float]]
                ) -> list[tuple[str, float, float]]:
    """(stage, start, end) in order: the summary's stages before the pack steps end to end from `started`,
    the shard stage up to the first pack step, then each pack step's own span."""
    spans, t = [], started
    first_step = min((a for a, _ in steps.values()), default=None)
    for name, secs in stage_seconds.items():
        if name in PACK_STEPS or name == "other":
            continue
        end = t + secs
        if name == "manifest+token_lengths" and first_step is not None:
            end = first_step
        spans.append((name, t, end))
        t = end
    spans += [(k, *steps[k]) for k in PACK_STEPS if k in steps]
    return spans


def stage_of(t: float, spans: list[tuple[str, float, float]]) -> str:
    for name, a, b in spans:
        if a <= t <= b:
            return name
    return "other"


def by_stage(sampler: TreeSampler, spans: list[tuple[str, float, float]]) -> dict:
    """Per stage: the peak RSS of the largest process of each kind, of each kind's processes summed, and of the
    whole tree summed, RSS and PSS (bytes; from the samples); per kind, the largest VmHWM of its processes
    (whole run)."""
    main = min((p for p, r in sampler.procs.items() if r["parent"] == sampler.root),
               key=lambda p: sampler.procs[p]["first"], default=None)
    kind = {p: "main" if p == main else _CHILD_KIND.get(stage_of(r["first"], spans), "helpers")
            for p, r in sampler.procs.items()}
    stages: dict[str, dict] = {}
    for t, rss in sampler.samples:
        rec = stages.setdefault(stage_of(t, spans), {"samples": 0, "tree_bytes": 0, "largest": {}, "summed": {}})
        rec["samples"] += 1
        rec["tree_bytes"] = max(rec["tree_bytes"], sum(rss.values()))
        summed: dict[str, int] = {}
        for pid, r in rss.items():
            k = kind[pid]
            rec["largest"][k] = max(rec["largest"].get(k, 0), r)
            summed[k] = summed.get(k, 0) + r
        for k, s in summed.items():
            rec["summed"][k] = max(rec["summed"].get(k, 0), s)
    for t, pss in sampler.pss:
        rec = stages[stage_of(t, spans)]
        rec["tree_pss_bytes"] = max(rec.get("tree_pss_bytes", 0), pss)
    hwm: dict[str, dict] = {}
    for pid, r in sampler.procs.items():
        h = hwm.setdefault(kind[pid], {"processes": 0, "largest_hwm_bytes": 0})
        h["processes"] += 1
        h["largest_hwm_bytes"] = max(h["largest_hwm_bytes"], r["hwm"])
    order = [s for s, _, _ in spans] + ["other"]
    return {"stage_peaks": {s: stages[s] for s in order if s in stages}, "hwm_by_kind": hwm,
            "stage_spans_s": {s: round(b - a, 1) for s, a, b in spans}, "sample_every_s": sampler.every}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fordblks", "uordblks", "fordblks_", "keepcost")]


def _mallinfo2() -> dict[str, int]:
    """glibc's heap: ``heap`` the bytes it has from the system (arenas + mmapped blocks), ``in_use`` allocated."""
    try:
        m = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return {}
    m.restype = _Mallinfo2
    info = m()
    return {"heap": info.arena + info.hblkhd, "in_use": info.uordblks + info.hblkhd}


def _own_memory() -> dict[str, int]:
    """This process's PSS, its anonymous part (heap and mmaps, not file-backed pages) and RSS, in bytes."""
    out = {}
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("Rss", "Pss", "Anonymous", "Pss_Anon", "Pss_File"):
                out[key.lower()] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


class SelfProbe(threading.Thread):
    """Inside the measured process: every ``every`` s its own memory broken down (`_own_memory`), glibc's heap
    (`_mallinfo2`: Python's objects live there, pymalloc's arenas included), Arrow's pool (allocated bytes and
    the pool's backend), DuckDB's buffer manager (``duckdb_memory()``, by a cursor of the connection `watch`
    is given; not DuckDB's allocator's cached pages, which only the remainder shows), and the `phase` the
    caller set last. `points`: dicts, one per sample."""

    def __init__(self, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.every, self.halt, self.phase, self.cursor = every, threading.Event(), "start", None
        self.points: list[dict] = []

    def watch(self, con) -> None:
        if self.cursor is None:
            self.cursor = con.cursor()

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)

    def sample(self) -> None:
        import pyarrow as pa

        point = {"t": round(time.time(), 3), "phase": self.phase, **_own_memory(),
                 **{f"malloc_{k}": v for k, v in _mallinfo2().items()},
                 "arrow": pa.total_allocated_bytes(), "arrow_max": pa.default_memory_pool().max_memory()}
        if self.cursor is not None:
            try:
                rows = self.cursor.execute("SELECT tag, memory_usage_bytes, temporary_storage_bytes "
                                           "FROM duckdb_memory()").fetchall()
                point["duckdb"] = sum(r[1] for r in rows)
                point["duckdb_spilled"] = sum(r[2] for r in rows)
                point["duckdb_tags"] = {r[0]: r[1] for r in rows if r[1] >= 1 << 20}
            except Exception as e:  # noqa: BLE001 (the connection closed: nothing more to read)
                point["duckdb_error"] = type(e).__name__
                self.cursor = None
        self.points.append(point)

    def stop(self) -> list[dict]:
        self.halt.set()
        self.join()
        self.sample()
        return self.points
