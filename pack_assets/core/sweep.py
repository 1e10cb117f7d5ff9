"""The planner alone on a list of lengths, without a catalog: `summarize` (what `pack-assets plan` prints) and
`simulate`, the what-if sweep over max lengths and algorithms (`pack-assets simulate`, and the sweep beside
every plan: core/report.py)."""

from __future__ import annotations

import time

import numpy as np

from .binpack import Caps, assign, lower_bounds, pack_sizes


def load_lengths(path: str) -> np.ndarray:
    """`.npy` int array, or text with one integer a line."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False).astype(np.int64)
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def _packed(lengths: np.ndarray, capacity: int, algorithm: str, caps: Caps, seed: int, assignment: bool
            ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(each item's pack or None, the kept items as a mask, items per pack): without ``assignment``, from
    `pack_sizes` where the algorithm allows it (the same packs, no item's pack held)."""
    sizes = None if assignment or caps.any else pack_sizes(lengths, capacity, algorithm)
    if sizes is not None:
        return None, lengths <= capacity, sizes
    packs = assign(lengths, capacity, algorithm, caps, seed=seed)
    kept = packs >= 0
    every = bool(kept.all())  # then no copy of every pack number (10M samples: 80 MB)
    return packs, kept, np.bincount(packs if every else packs[kept]) if kept.any() else np.zeros(0, np.int64)


def summarize(lengths: np.ndarray, capacity: int, algorithm: str, caps: Caps = Caps(), seed: int = 0,
              global_batch: int = 0, assignment: bool = True) -> dict:
    """The planner alone on a list of lengths (what `pack-assets plan` and `simulate` print); with
    ``assignment``, each item's pack too (-1: dropped)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    t0 = time.perf_counter()
    packs, kept, spp = _packed(lengths, capacity, algorithm, caps, seed, assignment)
    seconds = time.perf_counter() - t0
    n_packs = len(spp)
    every = bool(kept.all())  # then no copy of every length (10M samples: 80 MB)
    kept_lengths = lengths if every else lengths[kept]
    l1, l2 = lower_bounds(kept_lengths, capacity)
    bound = max(l2, -(-int(kept.sum()) // caps.max_samples) if caps.max_samples else 0)
    out = {
        "algorithm": algorithm,
        "max_len": capacity,
        "samples": int(len(lengths)),
        "packs": n_packs,
        "lower_bound": bound,
        "lower_bound_l1": l1,
        "packs_over_bound": n_packs - bound,
        "efficiency": float(kept_lengths.sum()) / (n_packs * capacity) if n_packs else 0.0,
        "dropped": int((~kept).sum()),
        "mean_samples_per_pack": float(spp.mean()) if n_packs else 0.0,
        "max_samples_per_pack": int(spp.max()) if n_packs else 0,
        "seconds": seconds,
    }
    if assignment:
        out["assignment"] = packs
    if global_batch:
        out["steps_per_epoch"] = -(-n_packs // global_batch)
    return out


def simulate(lengths: np.ndarray, max_lens: list[int], algorithms: list[str], caps: Caps = Caps(), seed: int = 0,
             global_batch: int = 0) -> dict:
    """The what-if sweep: every max length × algorithm, and a recommended max length.

    Recommended: the smallest max length whose best algorithm fills ≥ 98 % and drops ≤ 0.1 % of the
    samples; failing that, the one that packs the most tokens per pack-token (fill × kept fraction).
    """
    rows = []
    for max_len in max_lens:
        for alg in algorithms:
            r = summarize(lengths, max_len, alg, caps, seed, global_batch, assignment=False)
            r["dropped_fraction"] = r["dropped"] / max(1, r["samples"])
            rows.append(r)
    best = {m: max((r for r in rows if r["max_len"] == m), key=lambda r: r["efficiency"]) for m in max_lens}
    good = [m for m in sorted(max_lens) if best[m]["efficiency"] >= 0.98 and best[m]["dropped_fraction"] <= 0.001]
    rec = good[0] if good else max(max_lens, key=lambda m: best[m]["efficiency"] * (1 - best[m]["dropped_fraction"]))
    return {"results": rows, "recommended_max_len": rec}
