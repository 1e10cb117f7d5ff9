"""Soak the day-two property (tests/test_lifecycle_property.py) for longer than CI does, counting violations instead of
stopping at the first.

    PYTHONPATH=. python bench/soak_lifecycle.py [--examples 60] [--steps 40] [--minutes 30]
    PYTHONPATH=. python bench/soak_lifecycle.py --minimize audit_truthful   # hypothesis shrinks to a minimal sequence
    PYTHONPATH=. python bench/soak_lifecycle.py --known    # replay the short sequences of issue 16's items 1-8

Prints steps, runs per mode and violations per invariant, and writes a new bench/results/soak_lifecycle_<UTC>.json
(--out; every violation with the step sequence that led to it; --known: soak_lifecycle_known_<UTC>.json). Not run
by CI.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import test_lifecycle_property as tl  # noqa: E402
from common import ResultsFile, machine  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402


def _spec(tag: str, kinds: list[str], extra: bool = False) -> tl.ShardSpec:
    return tl.ShardSpec([tl.SampleSpec(key=f"{tag}{j:02d}", kind=k, style=("messages", "sharegpt")[j % 2], words=30,
                                       number="1234", extra=extra and j == 0) for j, k in enumerate(kinds)])


def _machine(n: int = 2, extra: bool = False) -> tl.Lifecycle:
    m = tl.Lifecycle()
    for i, name in enumerate(tl.SHARD_NAMES[:n]):
        m.shards[name] = _spec(f"g{i}k", ["text", "image1", "image2", "overlong"], extra)
        m._write(name)
    m._step(f"start with {n} shards")
    return m


def _edit(m, name: str, what: str) -> None:
    s = m.shards[name].samples[0]
    if what == "same tokens":
        s.number = s.number[:-1] + str((int(s.number[-1]) + 1) % 10)
    else:
        s.more += 7
    m._write(name)
    m._step(f"edit {name}/{s.key}: json {what}")


def _remove(m, name: str) -> None:
    (m.inp / f"{name}.tar").unlink()
    del m.shards[name]
    m.removed.add(name)
    m._step(f"remove shard {name}")


def _corrupt_pax(m, name: str) -> None:
    m.shards[name].corrupt = ("pax", 2)
    m._write(name)
    m._step(f"corrupt shard {name}: malformed PAX record before its third sample")


def _add_overlong(m) -> None:
    m.shards["c"] = _spec("g9k", ["text", "overlong", "overlong"])
    m._write("c")
    m._step("add shard c (two overlong samples)")


def _orchestrated(m, via: str) -> None:
    m.orchestrated_left = 1
    m.run_orchestrated(via=via, n=0)


KNOWN = {  # issue 16 item -> the shortest step sequence that shows it (each from a fresh folder)
    "1 core": lambda m: (m.run_full(), _add_overlong(m), m.run_full()),
    "1 pack-assets run": lambda m: (_orchestrated(m, "pipeline"), _add_overlong(m), _orchestrated(m, "pipeline")),
    "2": lambda m: (m.user_file(which="my-notes.tar"), m.run_full()),
    "3": lambda m: (m.run_full(), _edit(m, "a", "same tokens"), m.run_full()),
    "4": lambda m: (_corrupt_pax(m, "b"), m.run_full()),
    "5": lambda m: m.run_full(),  # with a `.txt` member in the first sample of each shard
    "6": lambda m: (_corrupt_pax(m, "b"), _orchestrated(m, "sensor")),
    "7": lambda m: (_orchestrated(m, "sensor"), _edit(m, "a", "more tokens"), _orchestrated(m, "sensor")),
    "8 pack-assets run": lambda m: (_orchestrated(m, "pipeline"), _remove(m, "c"), _orchestrated(m, "pipeline")),
    "8 core": lambda m: (m.run_full(), _remove(m, "c"), m.run_incremental(), m.run_full()),
}


def replay_known() -> list[dict]:
    tl.Lifecycle.raise_on_violation = False
    out = []
    for item, steps in KNOWN.items():
        tl.Lifecycle.log = []
        m = _machine(3 if item.startswith("8") else 2, extra=item == "5")
        try:
            with tl.no_plots():
                steps(m)
        finally:
            m.teardown()
        found = sorted({v["invariant"] for rec in tl.Lifecycle.log for v in rec["violations"]})
        print(f"item {item}: {' -> '.join(m.trace)}\n    violations: {found or 'none'}")
        for rec in tl.Lifecycle.log:
            for inv in sorted({v["invariant"] for v in rec["violations"]}):
                first = next(v["detail"] for v in rec["violations"] if v["invariant"] == inv)
                print(f"    after `{rec['trace'][-1]}`: [{inv}] {first[:200]}")
        out.append({"item": item, "trace": m.trace, "violations": tl.Lifecycle.log})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=60, help="state machine runs (each from a fresh folder)")
    ap.add_argument("--steps", type=int, default=40, help="steps per example (at most)")
    ap.add_argument("--minutes", type=float, default=0, help="stop starting new examples after this long (0: no limit)")
    ap.add_argument("--kills", type=int, default=20, help="killed runs (a subprocess each) in the whole soak")
    ap.add_argument("--cli-runs", type=int, default=5, help="`dagster asset materialize` runs in the whole soak")
    ap.add_argument("--orchestrated", type=int, default=4, help="Dagster / sensor / killed / CLI runs per example")
    ap.add_argument("--derandomize", action="store_true", help="the CI sequence, longer")
    ap.add_argument("--minimize", metavar="INVARIANT", help="stop at the first violation of INVARIANT and let "
                    "hypothesis shrink it to a minimal step sequence")
    ap.add_argument("--out", help="a new file or folder (default: a new bench/results/soak_lifecycle_<UTC>.json)")
    ap.add_argument("--known", action="store_true", help="replay the known sequences of issue 16 and stop")
    args = ap.parse_args()
    dest = ResultsFile(args.out, "soak_lifecycle_known" if args.known else "soak_lifecycle")
    if args.known:
        known = replay_known()
        dest.write(known)
        return 1 if any(k["violations"] for k in known) else 0

    m = tl.Lifecycle
    m.steps, m.runs, m.log = 0, {}, []
    m.subprocess_budget = {"kill": args.kills, "cli": args.cli_runs}
    m.orchestrated_per_example = args.orchestrated
    m.raise_on_violation = {args.minimize} if args.minimize else False
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    if deadline:
        real_init = m.__init__

        def init(self):
            if time.monotonic() > deadline:
                raise SystemExit(0)
            real_init(self)
        m.__init__ = init
    t0 = time.perf_counter()
    minimal = None
    try:
        run_state_machine_as_test(m, settings=settings(
            max_examples=args.examples, stateful_step_count=args.steps, deadline=None, database=None,
            derandomize=args.derandomize, suppress_health_check=list(HealthCheck),
            phases=settings.default.phases if args.minimize
            else [p for p in settings.default.phases if p.name != "shrink"]))
    except SystemExit:
        pass
    except AssertionError as e:
        minimal = "\n".join([*getattr(e, "__notes__", []), str(e)])
    seconds = time.perf_counter() - t0
    by_invariant = collections.Counter(v["invariant"] for rec in m.log for v in rec["violations"])
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1),
              "steps": m.steps, "runs": {k: {"runs": n, "seconds": s} for k, (n, s) in m.runs.items()},
              "runs_with_violations": len(m.log),
              "violations": dict(sorted(by_invariant.items())), "minimized": minimal,
              "examples": [{"trace": rec["trace"], "violations": rec["violations"]} for rec in m.log[:200]]}
    dest.write(result)
    print(f"{m.steps} steps, {sum(n for n, _ in m.runs.values())} runs in {seconds:.0f} s: "
          + ", ".join(f"{k} {n} ({s} s)" for k, (n, s) in m.runs.items()))
    print(f"{len(m.log)} run(s) with violations: {dict(by_invariant) or 'none'}")
    if minimal:
        print("minimal failing sequence:\n" + minimal)
    print(f"written {dest.path}")
    return 1 if m.log else 0


if __name__ == "__main__":
    sys.exit(main())
