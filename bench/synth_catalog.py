"""A large catalog made from a small one's per-shard files, for timing catalog queries at scale without scanning
(or holding) a large input: each source shard of ``--from`` copied ``--shards`` times in turn under new shard names
(``part-NNNNN``: the sample ids', shard columns' and paths' shard replaced), then planned, the last shard appended
by the incremental plan as a rerun after one new shard plans it. No output is written.

    python -P bench/synth_catalog.py --from <a set's work folder> --shards 200 --work <new folder>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import require_free  # noqa: E402

PROFILE = "qwen3-vl"


def renamed(table: pa.Table, old: str, new: str) -> pa.Table:
    """``table`` with the shard ``old`` made ``new`` in its sample ids (their prefix), shard and path columns."""
    for col in ("sample_id", "shard", "path"):
        if col in table.column_names:
            i = table.column_names.index(col)
            values = pc.replace_substring(table.column(col), f"{old}/", f"{new}/") if col != "shard" else \
                pa.array([new] * table.num_rows, pa.string())
            if col == "path":
                values = pc.replace_substring(table.column(col), f"{old}.tar", f"{new}.tar")
            table = table.set_column(i, col, values.cast(table.schema.field(col).type))
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="a work folder whose shards are copied")
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--work", required=True)
    ap.add_argument("--max-len", type=int, default=16384)
    args = ap.parse_args()
    src, work = Path(args.src), Path(args.work)
    require_free(work.parent, 2e9)
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import _token_stamp
    from pack_assets.core.plan import PlanConfig, run_plan
    profile = load_profile(PROFILE)
    sources = sorted(p.name for p in (src / "manifest").iterdir() if p.is_dir())
    names = []
    for k in range(args.shards + 1):  # the last: the one new shard, from the newest source
        old = sources[-1] if k == args.shards else sources[k % (len(sources) - 1)]
        new = f"part-{k:05d}"
        names.append(new)
        for sub, files in (("manifest/{}", ("samples", "members", "shard", "rejected")),
                           (f"token_lengths/{PROFILE}/{{}}", ("token_lengths", "rejected"))):
            into = work / sub.format(new)
            into.mkdir(parents=True, exist_ok=True)
            for f in files:
                p = src / sub.format(old) / f"{f}.parquet"
                if p.exists():
                    pq.write_table(renamed(pq.read_table(p), old, new), into / p.name)
        # the counts' stamp as the token stage writes it, of the manifest just made
        (work / f"token_lengths/{PROFILE}/{new}/stamp.json").write_text(_token_stamp(work, new, profile))
    config = PlanConfig(max_len=args.max_len, incremental=True)
    first = run_plan(work, names[:-1], config, profile)
    again = run_plan(work, names, config, profile)
    print(json.dumps({"shards": len(names), "violations": [len(first.violations), len(again.violations)],
                      "stats": again.stats}, default=str))


if __name__ == "__main__":
    main()
