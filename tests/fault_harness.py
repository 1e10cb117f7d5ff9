"""Run the whole pipeline in this process, SIGKILLing it at the n-th call of one function.

    python fault_harness.py INPUT WORK OUT [module:function n [writer_processes]]

Used by test_reliability.py; the product has no fault hooks of its own.
"""

import hashlib
import importlib
import os
import signal
import sys
from pathlib import Path

import figure_stand_in  # this file's folder is on the path: run as a script, or imported by the tests


def arm(target: str, n: int) -> None:
    module_name, attr = target.split(":")
    owner_path, _, name = attr.rpartition(".")
    owner = importlib.import_module(module_name)
    for part in filter(None, owner_path.split(".")):
        owner = getattr(owner, part)
    real = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, name, wrapper)


def main() -> None:
    inp, work, out = (Path(a) for a in sys.argv[1:4])
    figure_stand_in.swap()  # no test looks at the figures of a killed run or its rerun
    if len(sys.argv) > 4:
        arm(sys.argv[4], int(sys.argv[5]))
    sys.exit(run_pipeline(inp, work, out, int(sys.argv[6]) if len(sys.argv) > 6 else 2))


def run_pipeline(inp: Path, work: Path, out: Path, workers: int) -> int:
    """The whole pipeline; 0 when the audit passes (the tests' rerun calls it in their own process)."""
    from pack_assets.core import store
    from pack_assets.core.audit import run_audit
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.report import WhatIfBeside
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.write import run_write

    profile = load_profile("qwen3-vl")
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    config = PlanConfig(max_len=1500, max_packs_per_shard=2)
    what_if = WhatIfBeside(work, config)  # as the pack_plan asset does
    what_if.finish(run_plan(work, shards, config, profile, on_lengths=what_if.start).fingerprint)
    run_write(work, inp, out, workers=workers)
    result = run_audit(work, out)
    return 0 if result.ok else 3


def snapshot(work: Path, out: Path) -> dict:
    """The catalog's tables, every output file's hash (not Energon's SQLite container) and the plan file: what
    a rerun after a fault is compared by with a clean run."""
    from pack_assets.core import store

    with store.connect(work, read_only=True) as con:
        tables = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                  for t in ("samples", "members", "rejected", "token_lengths", "pack_plan", "pack_members", "dropped")}
    files = {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != "index.sqlite"}
    return {"tables": tables, "files": files, "plan": (work / "pack_plan.jsonl").read_bytes()}


if __name__ == "__main__":
    main()
