"""Soak the day-two property (tests/test_lifecycle.py) for longer than CI does, counting violations instead of
stopping at the first.

    PYTHONPATH=. python bench/soak_lifecycle.py [--examples 60] [--steps 40] [--minutes 30]
    PYTHONPATH=. python bench/soak_lifecycle.py --minimize audit_truthful   # hypothesis shrinks to a minimal sequence

Prints steps, runs per mode and violations per invariant, and writes bench/results/soak_lifecycle.json (every
violation with the step sequence that led to it). Not run by CI.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.errors import DeadlineExceeded  # noqa: E402,F401
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

import test_lifecycle as tl  # noqa: E402
from common import machine  # noqa: E402


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
    ap.add_argument("--out", type=Path, default=HERE / "results" / "soak_lifecycle.json")
    args = ap.parse_args()

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
            phases=settings.default.phases if args.minimize else [p for p in settings.default.phases if p.name != "shrink"]))
    except SystemExit:
        pass
    except AssertionError as e:
        minimal = "\n".join([*getattr(e, "__notes__", []), str(e)])
    seconds = time.perf_counter() - t0
    by_invariant = collections.Counter(v["invariant"] for rec in m.log for v in rec["violations"])
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1),
              "steps": m.steps, "runs": {k: {"runs": n, "seconds": s} for k, (n, s) in m.runs.items()}, "runs_with_violations": len(m.log),
              "violations": dict(sorted(by_invariant.items())), "minimized": minimal,
              "examples": [{"trace": rec["trace"], "violations": rec["violations"]} for rec in m.log[:200]]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{m.steps} steps, {sum(n for n, _ in m.runs.values())} runs in {seconds:.0f} s: "
          + ", ".join(f"{k} {n} ({s} s)" for k, (n, s) in m.runs.items()))
    print(f"{len(m.log)} run(s) with violations: {dict(by_invariant) or 'none'}")
    if minimal:
        print("minimal failing sequence:\n" + minimal)
    print(f"written {args.out}")
    return 1 if m.log else 0


if __name__ == "__main__":
    sys.exit(main())
