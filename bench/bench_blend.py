"""The blend planner (core/blend.py) on a large synthetic recipe: three datasets of very different lengths,
1M samples in all, each epoch planned on its own.

    python bench/bench_blend.py --n 1000000 --epochs 2 --repeats 3     # writes a new bench/results/blend_<UTC>.json
    python bench/bench_blend.py --n 1000000 --epochs 1 --repeats 1 --algorithm bfd
    python bench/bench_blend.py --n 1000000 --epochs 2 --repeats 3 --algorithm mix
    python bench/bench_blend.py --n 1000000 --epochs 1 --repeats 3 --against mix

Per epoch, in the same process and alternating (the ratio taken pair by pair): `make_blend_plan` (draw the
copies, bin-pack them together, deal the packs) vs numpy loading nothing and stable-argsorting the epoch's
expanded lengths (the floor any planner that sorts pays). Quality figures are computed from the plan's packs
in output order, not from the planner's stats: the worst window-of-256 token share error per dataset, the
samples-per-pack drift, packs over the L2 lower bound; and, for comparison, the share error the
single-input order (`plan._deal`, stratified by samples per pack only) gives the same packs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

from pack_assets.core.blend import make_blend_plan, share_errors  # noqa: E402
from pack_assets.core.plan import PlanConfig, _deal, drift  # noqa: E402
from pack_assets.core.recipe import BLEND_ALGORITHM, copies  # noqa: E402

# (name, fraction of the samples, median length, p95 length, repeat): chat-like, long OCR pages, short captions
MIX = [("chat", 0.55, 700, 3000, 1.0), ("ocr", 0.15, 3500, 9000, 2.5), ("caption", 0.30, 120, 300, 0.5)]


def rows(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids, lens = [], []
    for name, frac, median, p95, _ in MIX:
        k = int(n * frac)
        sigma = np.log(p95 / median) / 1.6449
        ids += [f"{name}/s/{i:08d}" for i in range(k)]
        lens.append(np.clip(rng.lognormal(np.log(median), sigma, k).astype(np.int64), 8, None))
    lengths = np.concatenate(lens)
    m = len(ids)
    return {"sample_ids": np.asarray(ids, dtype=object), "media_types": np.asarray(["text"] * m, dtype=object),
            "lengths": lengths, "media_bytes": np.zeros(m, np.int64), "n_media": np.zeros(m, np.int64),
            "vision_tokens": np.zeros(m, np.int64)}


def baseline(r: dict, repeats: dict, epoch: int) -> float:
    """numpy: the epoch's expanded lengths (copies drawn the same way), stable-argsorted."""
    t0 = time.perf_counter()
    ds = np.asarray([s.split("/", 1)[0] for s in r["sample_ids"].tolist()])
    n_copies = np.zeros(len(ds), np.int64)
    for name, rep in repeats.items():
        m = np.flatnonzero(ds == name)
        n_copies[m] = copies(r["sample_ids"][m].tolist(), rep, 0, name, epoch)
    np.argsort(np.repeat(r["lengths"], n_copies), kind="stable")
    return time.perf_counter() - t0


def quality(plan, names: list[str]) -> dict:
    tokens = np.zeros((len(plan.packs), len(names)))
    for k, p in enumerate(plan.packs):
        for d, n in zip(p.datasets, p.sample_token_lens):
            tokens[k, names.index(d)] += n
    spp = np.asarray([len(p.sample_ids) for p in plan.packs], dtype=np.float64)
    old = _deal(list(range(len(plan.packs))), spp, np.random.default_rng(0), 256)
    errors, old_errors = share_errors(tokens), share_errors(tokens[old])
    share = tokens.sum(0) / tokens.sum()
    return {"packs": len(plan.packs), "lower_bound": plan.stats["lower_bound"],
            "packs_over_bound": plan.stats["packs_over_bound"],
            "over_bound_fraction": plan.stats["packs_over_bound"] / max(1, plan.stats["lower_bound"]),
            "fill": round(plan.stats["fill"], 5), "drift": round(drift(spp), 4),
            "share": {n: round(float(s), 4) for n, s in zip(names, share)},
            "window_share_error": {n: round(float(e), 4) for n, e in zip(names, errors)},
            "window_share_error_single_input_order": {n: round(float(e), 4) for n, e in zip(names, old_errors)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--algorithm", default=BLEND_ALGORITHM,
                    help="default: what a recipe packs with unless it names another")
    ap.add_argument("--out", help="a new file or folder (default: a new bench/results/blend_<UTC>.json)")
    ap.add_argument("--against", default="", help="also time this algorithm, alternating: the ratio pair by pair")
    args = ap.parse_args()
    dest = ResultsFile(args.out, "blend")
    r = rows(args.n)
    repeats = {name: rep for name, _, _, _, rep in MIX}
    names = list(repeats)
    cfg = PlanConfig(max_len=args.max_len, algorithm=args.algorithm)
    epochs = []
    for k in range(args.epochs):
        plan_s, base_s, ratios, other_s = [], [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            plan = make_blend_plan(r, repeats, cfg, k)
            plan_s.append(time.perf_counter() - t0)
            base_s.append(baseline(r, repeats, k))
            ratios.append(plan_s[-1] / base_s[-1])
            if args.against:
                t0 = time.perf_counter()
                make_blend_plan(r, repeats, dataclasses.replace(cfg, algorithm=args.against), k)
                other_s.append(time.perf_counter() - t0)
        vs = {} if not args.against else {
            f"{args.against}_seconds_median": round(statistics.median(other_s), 3),
            f"ratio_to_{args.against}": [round(a / b, 3) for a, b in zip(plan_s, other_s)]}
        epochs.append({"epoch": k, "copies": sum(len(p.sample_ids) for p in plan.packs) + len(plan.dropped),
                       "plan_seconds_median": round(statistics.median(plan_s), 3),
                       "numpy_seconds_median": round(statistics.median(base_s), 3),
                       "ratio_median": round(statistics.median(ratios), 2), "ratios": [round(x, 2) for x in ratios],
                       **vs, **quality(plan, names)})
        print(json.dumps(epochs[-1]), flush=True)
    out = {"machine": machine(), "load_before": os.getloadavg(), "command": " ".join(["python"] + sys.argv),
           "n": args.n, "mix": MIX, "max_len": args.max_len, "algorithm": args.algorithm, "epochs": epochs}
    print(f"wrote {dest.write(out)}")


if __name__ == "__main__":
    main()
