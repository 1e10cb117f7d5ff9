"""How pytest-xdist's `load` and `worksteal` schedules would spread the suite over N workers, given each test's
cost (CPU seconds from bench/pytest_cpu.py) and the collection order (`pytest --collect-only -q`, or this repo's
order as tests/conftest.py sets it): a replay of xdist 3.8's two schedulers (scheduler/load.py, worksteal.py)
with each test taking its cost in seconds on its worker, and a worker's fixed start-up cost added first.

For comparing schedules and orders on a shared machine, where a whole run's wall clock says more about the load
than about the order: each worker's busy seconds, the makespan and the seconds the first worker to finish waits.

    python -P bench/xdist_schedule.py --costs run.tsv --order collect.txt [--wall] [--slow-first tests/conftest.py]
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import json
from pathlib import Path

MIN_PENDING = 2  # xdist/scheduler/worksteal.py


def read_costs(path: Path, wall: bool = False) -> dict[str, float]:
    """node id -> CPU seconds, or with ``wall`` its wall seconds (end - start, the plugin's last two columns); the
    last line for an id wins; `#` lines are the per-process totals."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            cols = line.split("\t")
            out[cols[1]] = float(cols[4]) - float(cols[3]) if wall else float(cols[0])
    return out


def read_order(path: Path) -> list[str]:
    return [ln.rstrip("\n") for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("tests/")]


def simulate(order: list[str], cost: dict[str, float], nodes: int, dist: str, start: float = 0.0) -> dict:
    """Replay one schedule; a test missing from ``cost`` takes 0."""
    dur = [cost.get(t, 0.0) for t in order]
    pending = list(range(len(order)))
    queues: list[list[int]] = [[] for _ in range(nodes)]
    busy, clock, done_at = [0.0] * nodes, [start] * nodes, [start] * nodes
    shut = [False] * nodes

    def send(n: int, k: int) -> None:
        queues[n].extend(pending[:k])
        del pending[:k]

    def load_check(n: int, last: float) -> None:
        if not pending:
            shut[n] = True
            return
        lo = max(2, len(pending) // nodes // 4)
        hi = max(2, len(pending) // nodes // 2)
        if len(queues[n]) < lo:
            if last >= 0.1 and len(queues[n]) >= 2:
                return
            send(n, min(hi - len(queues[n]), max(2 - len(queues[n]), len(order))))

    def steal_check() -> None:
        idle = [n for n in range(nodes) if not shut[n] and len(queues[n]) < MIN_PENDING]
        if not idle:
            return
        if pending:
            for i, n in enumerate(idle):
                send(n, len(pending) // (len(idle) - i))
            idle = [n for n in range(nodes) if not shut[n] and len(queues[n]) < MIN_PENDING]
            if not idle:
                return
        victim = max((n for n in range(nodes) if not shut[n]), key=lambda n: len(queues[n]), default=None)
        k = 0 if victim is None else min(len(queues[victim]) // 2, max(0, len(queues[victim]) - MIN_PENDING))
        if k == 0:
            for n in idle:
                shut[n] = True
            return
        stolen = queues[victim][-k:]
        del queues[victim][-k:]
        pending.extend(stolen)
        steal_check()

    if dist == "load":
        chunk = max(2, min(len(order) // nodes // 4, len(order)))
        for n in range(nodes):
            send(n, chunk)
    else:
        steal_check()
    events = []  # (time the running test ends, node)
    for n in range(nodes):
        if queues[n]:
            heapq.heappush(events, (clock[n] + dur[queues[n][0]], n))
    while events:
        t, n = heapq.heappop(events)
        i = queues[n].pop(0)
        busy[n] += dur[i]
        clock[n] = done_at[n] = t
        if dist == "load":
            load_check(n, dur[i])
        else:
            steal_check()
        for m in range(nodes):  # a node idle before may have been sent tests
            if queues[m] and not any(e[1] == m for e in events):
                heapq.heappush(events, (max(clock[m], t) + dur[queues[m][0]], m))
    span = max(done_at)
    return {"dist": dist, "makespan_s": round(span, 1), "busy_s": [round(b, 1) for b in busy],
            "finish_s": [round(d, 1) for d in done_at], "first_idle_s": round(span - min(done_at), 1)}


def slow_first(order: list[str], conftest: Path) -> list[str]:
    """The order tests/conftest.py's pytest_collection_modifyitems gives (its SLOW_FIRST list)."""
    spec = importlib.util.spec_from_file_location("_conftest_order", conftest)
    mod = importlib.util.module_from_spec(spec)
    src = conftest.read_text(encoding="utf-8")
    start = src.index("SLOW_FIRST = ")
    exec(src[start:src.index("\n\n", start)], mod.__dict__)  # only the list: no pytest, no PIL needed here
    rank = {name: i for i, name in enumerate(mod.SLOW_FIRST)}
    return sorted(order, key=lambda t: rank.get(t.split("::")[0].rsplit("/", 1)[-1], len(rank)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", type=Path, required=True, help="a bench/pytest_cpu.py output (tsv)")
    ap.add_argument("--order", type=Path, required=True, help="`pytest --collect-only -q` output")
    ap.add_argument("--slow-first", type=Path, help="a conftest.py whose SLOW_FIRST list reorders the modules")
    ap.add_argument("--wall", action="store_true", help="each test's wall seconds (end - start) instead of its CPU")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--start", type=float, default=0.0, help="each worker's fixed start-up seconds (collection)")
    args = ap.parse_args()
    cost, order = read_costs(args.costs, args.wall), read_order(args.order)
    if args.slow_first:
        order = slow_first(order, args.slow_first)
    total = sum(cost.get(t, 0.0) for t in order)
    out = {"tests": len(order), "with_cost": sum(t in cost for t in order), "total_s": round(total, 1),
           "ideal_s": round(total / args.nodes + args.start, 1),
           "schedules": [simulate(order, cost, args.nodes, d, args.start) for d in ("load", "worksteal")]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
