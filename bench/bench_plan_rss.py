"""The plan stage's memory against the number of samples, without scanning N samples: a catalog of N samples
made from the per-shard Parquet of a work folder that was scanned and counted (each shard's files copied
under new shard names), then `plan.run_plan` alone in a fresh process, its RSS and peak (VmHWM) printed after
each of its steps.

    python bench/bench_plan_rss.py --from-work /tmp/e2e250k/work --out /tmp/planrss --shards 100 200 400 \
        --results bench/results/    # a new plan_rss_<UTC>.json

Each N: ``<out>/syn<shards>`` (kept, so a second code can be measured on the same catalog), the plan's
pack_plan.jsonl copied beside it as ``plan_<label>_<shards>.jsonl`` for `cmp` against another code's, and each
plan table's rows and content digest (order-free: every row's key is in it) recorded after the measure, for the
same comparison of the catalogs.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

FILES = ("manifest/{}/samples.parquet", "manifest/{}/members.parquet", "manifest/{}/shard.parquet",
         "manifest/{}/rejected.parquet", "token_lengths/{p}/{}/token_lengths.parquet",
         "token_lengths/{p}/{}/rejected.parquet", "token_lengths/{p}/{}/stamp.json")


def synth(src: Path, dst: Path, n_shards: int, profile: str) -> None:
    """``n_shards`` shards in ``dst``, each a copy of one of ``src``'s with its shard name and sample ids renamed."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tmpl = sorted(p.name for p in (src / "manifest").iterdir() if p.is_dir())
    cache: dict[Path, pa.Table] = {}
    for k in range(n_shards):
        old, new = tmpl[k % len(tmpl)], f"part-{k:05d}"
        for rel in FILES:
            s, d = src / rel.format(old, p=profile), dst / rel.format(new, p=profile)
            if not s.exists():
                continue
            d.parent.mkdir(parents=True, exist_ok=True)
            if s.suffix == ".json":
                shutil.copy(s, d)
                continue
            t = cache.setdefault(s, pq.read_table(s))
            pq.write_table(pa.table([pc.replace_substring(t[c], old, new) if c in ("sample_id", "shard")
                                     and pa.types.is_string(t[c].type) else t[c] for c in t.column_names],
                                    schema=t.schema), d)


def told(mod, name: str, say, before=None) -> None:
    """``mod.name`` replaced by itself calling ``before(name)`` first (if given) and ``say(name)`` after."""
    f = getattr(mod, name)

    @functools.wraps(f)
    def g(*a, **k):
        if before is not None:
            before(name)
        out = f(*a, **k)
        say(name)
        return out
    setattr(mod, name, g)


def measure(work: Path, profile_name: str, max_len: int) -> dict:
    """run_plan on ``work``, the RSS and peak after each step (MB)."""
    from pack_assets.core import plan, store
    from pack_assets.core.counting.profiles import resolve_profile
    from pack_assets.core.settings import PlanConfig

    t0, steps = time.perf_counter(), []

    def say(step: str) -> None:
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * 4096
        # VmHWM, not ru_maxrss, which keeps the parent's peak across fork + exec (the synthesis's tables)
        hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines()
                   if x.startswith("VmHWM:"))
        steps.append({"step": step, "rss_mb": round(rss / 1e6), "peak_mb": round(hwm / 1e3),
                      "s": round(time.perf_counter() - t0, 1)})

    for name in ("ok_lengths", "split_overlong", "make_plan", "check_plan"):
        told(plan, name, say)
    for name in ("build_catalog", "atomic_write_text", "save_plan"):
        told(store, name, say)
    shards = sorted(p.name for p in (work / "manifest").iterdir() if p.is_dir())
    say("start")
    s = plan.run_plan(work, shards, PlanConfig(max_len=max_len), resolve_profile(profile_name, None, False, ""))
    say("run_plan")
    return {"samples": s.stats["samples"], "packs": s.packs, "fingerprint": s.fingerprint,
            "violations": len(s.violations), "steps": steps, "peak_mb": steps[-1]["peak_mb"]}


TABLES = ("pack_plan", "pack_members", "dropped", "split_pieces")


def digests(work: Path) -> dict:
    """Per plan table: its rows and the sum of its rows' hashes (the same content gives the same figures);
    plan_info's hash without the planner's seconds."""
    import hashlib

    from pack_assets.core import store

    with store.connect(work, read_only=True) as con:
        out = {t: list(con.execute(f"SELECT count(*), CAST(sum(hash(CAST(t AS VARCHAR))::HUGEINT) AS VARCHAR) "
                                   f"FROM {t} t").fetchone()) for t in TABLES}
        info = store.read_plan_info(con)
    info["stats"].pop("seconds", None)
    out["plan_info"] = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-work", help="a scanned and counted work folder (its per-shard Parquet)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--profile", default="qwen3-vl")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--label", default="this", help="names the copied plan files (plan_<label>_<shards>.jsonl)")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/plan_rss_<UTC>.json)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        got = measure(Path(args.one), args.profile, args.max_len)
        print(json.dumps({**got, "tables": digests(Path(args.one))}))
        return
    dest, out, records = ResultsFile(args.results, "plan_rss"), Path(args.out), []
    for n in args.shards:
        work = out / f"syn{n}"
        if not work.exists():
            synth(Path(args.from_work), work, n, args.profile)
        for f in [*work.glob("pack_assets.duckdb*"), work / "pack_plan.jsonl"]:
            f.unlink(missing_ok=True)  # each N planned from scratch
        proc = subprocess.run([sys.executable, __file__, "--out", str(out), "--one", str(work), "--profile",
                               args.profile, "--max-len", str(args.max_len)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        records.append({"shards": n, **json.loads(proc.stdout.strip().splitlines()[-1])})
        shutil.copy(work / "pack_plan.jsonl", out / f"plan_{args.label}_{n}.jsonl")
        print(json.dumps(records[-1]), flush=True)
        dest.write({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "label": args.label,
                    "from_work": args.from_work, "records": records})


if __name__ == "__main__":
    main()
