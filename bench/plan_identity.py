"""Two codes, the same sequence of `pack-assets run` on the same inputs: are their plans and outputs identical?

    python bench/plan_identity.py --code <src A> --baseline <src B> [--scratch <folder>] [--results <file>]

Each code gets its own copy of the inputs, work folder, output and Dagster home, and runs the same steps (the
first a full run, then ``--incremental`` reruns): one shard added, another added (two reruns in a row), a shard
changed (its samples' counts change: their packs replanned), a shard removed, one added back. After every step:
pack_plan.jsonl compared byte for byte (cmp), the plan tables (pack_plan, pack_members, dropped, split_pieces)
row for row, plan_info but for its timing (``seconds``) and A's records of its files (``plan_file``, and
``manifest_stamps``: each file's inode and times, which differ between copies by nature), every output
file byte for byte, and whether A's plan appended (a line from A's `plan._appended`, which the driver wraps).
Small data (the tests' shards): seconds per run.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, machine  # noqa: E402
from conftest import small_dataset, write_tar  # noqa: E402

# the driver: the CLI in this process, `plan._appended` reporting each call on stderr (os._exit skips buffers)
DRIVER = """import os, sys
import pack_assets.core.plan as p
if hasattr(p, "_appended"):
    inner = p._appended
    def told(*a, **k):
        os.write(2, b"PLAN-APPENDED\\n")
        return inner(*a, **k)
    p._appended = told
from pack_assets.cli import main
sys.exit(main(sys.argv[1:]))
"""
TABLES = {"pack_plan": "pack_id", "pack_members": "pack_id, position", "dropped": "sample_id",
          "split_pieces": "piece_id"}


def changed_shard(path: Path, k: int) -> None:
    """Shard ``k`` rewritten with 8 of its sample keys, as text of other lengths (recounted), the rest gone."""
    members = [(f"s{k}_{j:03d}.json", json.dumps({"messages": [{"role": "user", "content": "changed " * (40 + 9 * j)},
                                                          {"role": "assistant", "content": "yes"}]}))
               for j in range(8)]
    write_tar(path, members)


STEPS = [("full", None), ("add one", "add:3"), ("add another", "add:4"), ("change one", "change:1"),
         ("remove one", "remove:0"), ("add back", "add:0"), ("unchanged", None)]


def apply(step: str | None, inp: Path, spare: Path) -> None:
    if step is None:
        return
    what, k = step.split(":")
    name = f"part-{int(k):03d}.tar"
    if what == "add":
        shutil.copy2(spare / name, inp / name)
    elif what == "remove":
        (inp / name).unlink()
    else:
        changed_shard(inp / name, int(k))
    os.utime(inp / name) if (inp / name).exists() else None


def run(src: str, base: Path, incremental: bool) -> tuple[float, bool]:
    cmd = [sys.executable, "-P", "-c", DRIVER, "run", "--input", str(base / "in"), "--work", str(base / "work"),
           "--output", str(base / "out"), "--max-len", "1500", "--dagster-home", str(base / "dagster_home"),
           "--json", *(["--incremental"] if incremental else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{src}: {' '.join(cmd[4:])}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0, "PLAN-APPENDED" in proc.stderr


def tables(work: Path, src: str) -> dict:
    """The plan tables' rows in key order and plan_info (without timing and the records of files), read by ``src``."""
    code = ("import json, sys; from pathlib import Path; from pack_assets.core import store\n"
            "con = store.connect(Path(sys.argv[1]), read_only=True)\n"
            f"out = {{t: [list(map(str, r)) for r in con.execute(f'SELECT * FROM {{t}} ORDER BY {{k}}').fetchall()]"
            f" for t, k in {TABLES!r}.items()}}\n"
            "info = store.read_plan_info(con); info.pop('plan_file', None); info.pop('manifest_stamps', None)\n"
            "info['stats'].pop('seconds', None)\n"
            "out['plan_info'] = info; print(json.dumps(out, sort_keys=True, default=str))")
    proc = subprocess.run([sys.executable, "-P", "-c", code, str(work)], env={**os.environ, "PYTHONPATH": src},
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def same_tree(a: Path, b: Path) -> list[str]:
    """Files that differ or exist on one side only (byte comparison), relative to the roots."""
    names = {p.relative_to(a) for p in a.rglob("*") if p.is_file()} | {p.relative_to(b) for p in b.rglob("*")
                                                                        if p.is_file()}
    return sorted(str(n) for n in names if not ((a / n).is_file() and (b / n).is_file()
                                                and filecmp.cmp(a / n, b / n, shallow=False)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--scratch", help="a folder for the runs (default: a temporary one, removed after)")
    ap.add_argument("--results", help="a new file (default: a new bench/results/plan_identity_<UTC>.json)")
    args = ap.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="plan_identity-"))
    scratch.mkdir(parents=True, exist_ok=True)
    emit = Results(scratch, args.results, "plan_identity")
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "code": args.code, "baseline": args.baseline})
    spare = small_dataset(scratch / "spare", n_shards=5)
    codes = {"A": args.code, "B": args.baseline}
    for label in codes:
        (scratch / label / "in").mkdir(parents=True)
        for k in range(3):
            shutil.copy2(spare / f"part-{k:03d}.tar", scratch / label / "in")
    failed = 0
    try:
        for i, (name, step) in enumerate(STEPS):
            rec = {"step": name}
            for label, src in codes.items():
                apply(step, scratch / label / "in", spare)
                rec[f"{label}_seconds"], appended = run(src, scratch / label, incremental=i > 0)
                rec[f"{label}_appended"] = appended
            a, b = scratch / "A", scratch / "B"
            rec["pack_plan_jsonl_identical"] = filecmp.cmp(a / "work/pack_plan.jsonl", b / "work/pack_plan.jsonl",
                                                           shallow=False)
            # (plan_info names each side's own input folder)
            ta, tb = (json.loads(json.dumps(tables(d / "work", codes[k])).replace(str(d), "<root>"))
                      for d, k in ((a, "A"), (b, "B")))
            rec["tables_differ"] = sorted(k for k in ta if ta[k] != tb.get(k))
            rec["fingerprint"] = [ta["plan_info"]["fingerprint"], tb["plan_info"]["fingerprint"]]
            rec["planning"] = ta["plan_info"]["stats"].get("planning")
            rec["outputs_differ"] = same_tree(a / "out", b / "out")
            rec["identical"] = rec["pack_plan_jsonl_identical"] and not rec["tables_differ"] \
                and not rec["outputs_differ"]
            failed += not rec["identical"]
            emit(rec)
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
