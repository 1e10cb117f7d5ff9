"""Context parallelism in the plan (issue 39): packs planned on each sub-sample's padded length.

    python bench/bench_cp.py                     # writes a new bench/results/cp_<UTC>.json
    python bench/bench_cp.py --n 1000000 --results bench/results/cp_1m.json

Lengths: lognormal like the seed's LVIS table (median 864, p95 3,669 tokens; bench_plan.py), 40 % text,
50 % image, 10 % video samples, packed per media type with the planner itself (`make_plan`, BFD). For each
(cp, tp with sequence parallelism, max_len): the largest pack once every sub-sample is padded (must not exceed
max_len), the packs against the lower bound computed on the padded lengths (target: within 0.1 %), the fill
of max_len by padded tokens, and how many packs of the plan made without the CP setting would overflow max_len
once a CP trainer pads them (what the setting prevents). Planner seconds are for orientation only (shared
machine). Two more rows: cp 2 with world_size 8 x micro_batch_size 2 (groups of 16 packs of one media key),
per media type and mixed: what the groups' splits cost against the same bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import lognormal  # noqa: E402
from common import ResultsFile, machine  # noqa: E402

from pack_assets.core.cpad import padded  # noqa: E402
from pack_assets.core.plan import PlanConfig, make_plan  # noqa: E402


def case(ids, kinds, lengths, max_len: int, cp: int, tp: int, plain_packs, world: int = 1,
         per_type: bool = True) -> dict:
    cfg = PlanConfig(max_len=max_len, cp_size=cp, tp_size=tp, sequence_parallel=tp > 1, world_size=world,
                     micro_batch_size=2 if world > 1 else 1, pack_per_media_type=per_type)
    m = cfg.multiple
    t0 = time.perf_counter()
    plan = make_plan(ids, kinds, lengths, np.zeros(len(ids), np.int64), cfg)
    seconds = time.perf_counter() - t0
    padded_packs = np.asarray([padded(p.sample_token_lens, m).sum() for p in plan.packs])
    s = plan.stats
    bound = s["lower_bound"]
    plain_over = sum(int(padded(p.sample_token_lens, m).sum()) > max_len for p in plain_packs)
    return {"max_len": max_len, "cp_size": cp, "tp_size": tp, "sequence_parallel": tp > 1, "sample_multiple": m,
            "world_size": world, "micro_batch_size": cfg.micro_batch_size, "pack_per_media_type": per_type,
            "incomplete_groups": s.get("balance", {}).get("incomplete_groups", 0),
            "samples": len(ids), "packs": s["packs"], "lower_bound_padded": bound,
            "packs_over_bound": s["packs_over_bound"],
            "over_bound_fraction": round(s["packs_over_bound"] / bound, 6) if bound else 0.0,
            "max_padded_pack": int(padded_packs.max()),
            "packs_over_max_len_padded": int((padded_packs > max_len).sum()),
            "fill_padded": round(s["fill_padded"], 6), "fill_real": round(s["fill"], 6),
            "padding_tokens_in_sub_samples": int(s["padded_tokens"] - s["packed_tokens"]),
            "dropped": s["dropped"], "plain_plan_packs_over_max_len_once_padded": plain_over,
            "plan_seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=99_388)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/cp_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "cp")
    lengths = lognormal(args.n, 864, 3668.6, 20_000)
    rng = np.random.default_rng(7)
    kinds = rng.choice(["text", "image", "video"], args.n, p=[0.4, 0.5, 0.1])
    ids = [f"s{i:08d}" for i in range(args.n)]
    rows = []
    for max_len in (8192, 16384):
        plain = make_plan(ids, kinds, lengths, np.zeros(args.n, np.int64), PlanConfig(max_len=max_len)).packs
        for cp, tp in ((1, 1), (2, 1), (4, 1), (2, 2), (8, 1)):
            rows.append(case(ids, kinds, lengths, max_len, cp, tp, plain))
            print(json.dumps(rows[-1]), flush=True)
    for per_type in (True, False):  # groups of world_size x micro_batch_size packs of one media key, with CP
        rows.append(case(ids, kinds, lengths, 8192, 2, 1, [], world=8, per_type=per_type))
        print(json.dumps(rows[-1]), flush=True)
    dest.write({"machine": machine(), "distribution": "lognormal median 864 p95 3669, text/image/video 0.4/0.5/0.1",
                "rows": rows})


if __name__ == "__main__":
    main()
