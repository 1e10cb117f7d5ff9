"""pack_plan stage: bin packing per media type, near the lower bound, with a seeded output order.

The planner works on integer arrays: ``assign(lengths, capacity, algorithm)`` returns, for each item, the
index of its pack (-1 for items over capacity). BFD runs on the length histogram (FACTS.md): sizes are
taken from the largest down; the bins with the smallest remaining room that still fits take
``room // size`` copies at once, so work grows with packs x distinct sizes, not with items x packs.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

ALGORITHMS = ("bfd", "next_fit")


@dataclass(frozen=True)
class PlanConfig:
    max_len: int
    algorithm: str = "bfd"
    seed: int = 0
    pack_per_media_type: bool = True
    target_shard_bytes: int = 256 << 20
    max_packs_per_shard: int = 1000

    def __post_init__(self):
        if self.max_len <= 0:
            raise ValueError(f"max_len must be positive, got {self.max_len}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def _bfd(lengths: np.ndarray, capacity: int) -> np.ndarray:
    n = len(lengths)
    pack = np.full(n, -1, dtype=np.int64)
    fits = np.flatnonzero(lengths <= capacity)
    if len(fits) == 0:
        return pack
    order = fits[np.argsort(-lengths[fits], kind="stable")]
    sizes, counts = np.unique(lengths[order], return_counts=True)
    buckets: dict[int, list[int]] = {}  # room left -> packs with that room
    rooms: list[int] = []  # sorted rooms with a non-empty bucket
    ev_pack: list[int] = []
    ev_count: list[int] = []
    n_packs = 0

    def put(room: int, p: int) -> None:
        b = buckets.get(room)
        if b is None:
            buckets[room] = [p]
            bisect.insort(rooms, room)
        else:
            b.append(p)

    for s, k in zip(sizes[::-1].tolist(), counts[::-1].tolist()):
        while k:
            i = bisect.bisect_left(rooms, s)
            if i == len(rooms):  # nothing fits: open packs, each takes capacity // s copies
                q = capacity // s
                while k:
                    take = min(q, k)
                    ev_pack.append(n_packs)
                    ev_count.append(take)
                    put(capacity - take * s, n_packs)
                    n_packs += 1
                    k -= take
                break
            room = rooms[i]
            bucket = buckets[room]
            q = room // s
            while k and bucket:
                p = bucket.pop()
                take = min(q, k)
                ev_pack.append(p)
                ev_count.append(take)
                put(room - take * s, p)
                k -= take
            if not bucket:
                del buckets[room]
                rooms.pop(bisect.bisect_left(rooms, room))
    pack[order] = np.repeat(np.asarray(ev_pack, dtype=np.int64), np.asarray(ev_count, dtype=np.int64))
    return pack


def _next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    pack = np.full(len(lengths), -1, dtype=np.int64)
    current, room = -1, 0
    for i, s in enumerate(lengths.tolist()):
        if s > capacity:
            continue
        if s > room:
            current += 1
            room = capacity
        pack[i] = current
        room -= s
    return pack


def assign(lengths: np.ndarray, capacity: int, algorithm: str = "bfd") -> np.ndarray:
    """Pack index per item (-1: longer than the capacity); packs are numbered from 0 without gaps."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and lengths.min() <= 0:
        raise ValueError("lengths must be positive")
    if algorithm == "bfd":
        return _bfd(lengths, capacity)
    if algorithm == "next_fit":
        return _next_fit(lengths, capacity)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def lower_bounds(lengths: np.ndarray, capacity: int) -> tuple[int, int]:
    """L1 = ceil(Σℓ/C) and Martello–Toth L2 over the items that fit, in O(C) from the histogram."""
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths[lengths <= capacity]
    if len(lengths) == 0:
        return 0, 0
    l1 = -(-int(lengths.sum()) // capacity)
    c = np.bincount(lengths, minlength=capacity + 1).astype(np.int64)
    v = np.arange(capacity + 1, dtype=np.int64)
    cnt = np.concatenate([[0], np.cumsum(c)])  # cnt[x] = #items with length < x
    tot = np.concatenate([[0], np.cumsum(c * v)])
    half = capacity // 2  # items > C/2 are those with v >= half + 1
    k = np.arange(0, half + 1, dtype=np.int64)
    hi = capacity - k  # J1: v > C-k; J2: C/2 < v <= C-k; J3: k <= v <= C/2
    n_j1 = cnt[capacity + 1] - cnt[hi + 1]
    n_j2 = cnt[hi + 1] - cnt[half + 1]
    s_j2 = tot[hi + 1] - tot[half + 1]
    s_j3 = tot[half + 1] - tot[k]
    slack = n_j2 * capacity - s_j2
    extra = np.maximum(0, -(-(s_j3 - slack) // capacity))
    l2 = int((n_j1 + n_j2 + extra).max())
    return l1, max(l1, l2)


@dataclass
class Pack:
    pack_id: str
    media_type: str
    sample_ids: list[str]
    sample_token_lens: list[int]
    total_token_len: int
    output_shard: str = ""
    media_bytes: int = 0


@dataclass
class PlanResult:
    packs: list[Pack]
    dropped: list[dict]
    stats: dict = field(default_factory=dict)
    fingerprint: str = ""


def drift(samples_per_pack: np.ndarray, window: int = 256) -> float:
    """max/min of mean samples per pack over windows of consecutive packs (1.0 = perfectly even)."""
    if len(samples_per_pack) < 2 * window:
        window = max(1, len(samples_per_pack) // 4)
    if len(samples_per_pack) == 0:
        return 1.0
    n = len(samples_per_pack) // window
    means = samples_per_pack[: n * window].reshape(n, window).mean(axis=1)
    return float(means.max() / means.min()) if means.min() > 0 else float("inf")


def fingerprint(config: PlanConfig, profile: str, ids: Iterable[str], lengths: Iterable[int]) -> str:
    h = hashlib.sha256(json.dumps({"config": asdict(config), "profile": profile}, sort_keys=True).encode())
    for i, n in zip(ids, lengths):
        h.update(f"{i}\t{n}\n".encode())
    return h.hexdigest()[:16]


def make_plan(
    sample_ids: list[str],
    media_types: list[str],
    lengths: np.ndarray,
    media_bytes: np.ndarray,
    config: PlanConfig,
    profile: str = "",
) -> PlanResult:
    """Packs per media type, shuffled with the seed, cut into output shards; every input is packed or dropped."""
    t0 = time.perf_counter()
    lengths = np.asarray(lengths, dtype=np.int64)
    media_bytes = np.asarray(media_bytes, dtype=np.int64)
    mtypes = np.asarray(media_types, dtype=object)
    raw: list[tuple[str, np.ndarray]] = []  # (media type, item indices) per pack
    dropped: list[dict] = []
    per_type: dict[str, dict] = {}
    groups = sorted(set(media_types)) if config.pack_per_media_type else ["mixed"]
    for mt in groups:
        idx = np.flatnonzero(mtypes == mt) if config.pack_per_media_type else np.arange(len(lengths))
        lens = lengths[idx]
        packs = assign(lens, config.max_len, config.algorithm)
        for i in idx[packs < 0].tolist():
            dropped.append({"sample_id": sample_ids[i], "total_tokens": int(lengths[i]), "reason": "overlong"})
        kept = packs >= 0
        order = np.argsort(packs[kept], kind="stable")
        members = idx[kept][order]
        bounds = np.flatnonzero(np.diff(packs[kept][order])) + 1
        for chunk in np.split(members, bounds) if len(members) else []:
            raw.append((mt, chunk))
        l1, l2 = lower_bounds(lens, config.max_len)
        n_packs = int(packs.max()) + 1 if kept.any() else 0
        fill = float(lens[kept].sum()) / (n_packs * config.max_len) if n_packs else 0.0
        per_type[mt] = {"samples": len(idx), "packs": n_packs, "l1": l1, "l2": l2, "over_bound": n_packs - l2,
                        "fill": fill, "dropped": int((~kept).sum())}
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(raw))
    packs: list[Pack] = []
    for n, j in enumerate(order.tolist()):
        mt, items = raw[j]
        lens = lengths[items].tolist()
        packs.append(
            Pack(f"p{n:08d}", mt, [sample_ids[i] for i in items.tolist()], lens, int(sum(lens)),
                 media_bytes=int(media_bytes[items].sum()))
        )
    _assign_shards(packs, config)
    spp = np.asarray([len(p.sample_ids) for p in packs], dtype=np.float64)
    n_packs = len(packs)
    packed_tokens = int(sum(p.total_token_len for p in packs))
    stats = {
        "samples": len(sample_ids),
        "packs": n_packs,
        "dropped": len(dropped),
        "lower_bound": int(sum(v["l2"] for v in per_type.values())),
        "lower_bound_l1": int(sum(v["l1"] for v in per_type.values())),
        "fill": packed_tokens / (n_packs * config.max_len) if n_packs else 0.0,
        "packed_tokens": packed_tokens,
        "mean_samples_per_pack": float(spp.mean()) if n_packs else 0.0,
        "max_samples_per_pack": int(spp.max()) if n_packs else 0,
        "drift": drift(spp),
        "output_shards": len({p.output_shard for p in packs}),
        "per_media_type": per_type,
        "algorithm": config.algorithm,
        "max_len": config.max_len,
    }
    stats["packs_over_bound"] = n_packs - stats["lower_bound"]
    stats["efficiency"] = stats["fill"]
    stats["seconds"] = time.perf_counter() - t0
    return PlanResult(packs, dropped, stats, fingerprint(config, profile, sample_ids, lengths.tolist()))


def _assign_shards(packs: list[Pack], config: PlanConfig) -> None:
    shard, size, count = 0, 0, 0
    for p in packs:
        if count and (count >= config.max_packs_per_shard or size + p.media_bytes > config.target_shard_bytes):
            shard, size, count = shard + 1, 0, 0
        p.output_shard = f"packed-{shard:06d}.tar"
        size += p.media_bytes
        count += 1


def pack_rows(plan: PlanResult) -> Iterable[dict]:
    for p in plan.packs:
        yield {
            "pack_id": p.pack_id,
            "media_type": p.media_type,
            "sample_ids": p.sample_ids,
            "sample_token_lens": p.sample_token_lens,
            "total_token_len": p.total_token_len,
            "output_shard": p.output_shard,
        }


def plan_jsonl(plan: PlanResult) -> str:
    keys = ("pack_id", "media_type", "sample_ids", "sample_token_lens", "total_token_len")
    return "".join(json.dumps({k: r[k] for k in keys}) + "\n" for r in pack_rows(plan))


def load_lengths(path: str) -> np.ndarray:
    """`.npy` int array, or text with one integer a line."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False).astype(np.int64)
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def summarize(lengths: np.ndarray, capacity: int, algorithm: str) -> dict:
    """The planner alone on a list of lengths (what `pack-assets plan` prints)."""
    t0 = time.perf_counter()
    packs = assign(lengths, capacity, algorithm)
    seconds = time.perf_counter() - t0
    kept = packs >= 0
    n_packs = int(packs.max()) + 1 if kept.any() else 0
    l1, l2 = lower_bounds(lengths, capacity)
    spp = np.bincount(packs[kept]) if n_packs else np.zeros(0)
    return {
        "algorithm": algorithm,
        "max_len": capacity,
        "samples": int(len(lengths)),
        "packs": n_packs,
        "lower_bound": l2,
        "lower_bound_l1": l1,
        "packs_over_bound": n_packs - l2,
        "efficiency": float(lengths[kept].sum()) / (n_packs * capacity) if n_packs else 0.0,
        "dropped": int((~kept).sum()),
        "mean_samples_per_pack": float(spp.mean()) if n_packs else 0.0,
        "max_samples_per_pack": int(spp.max()) if n_packs else 0,
        "seconds": seconds,
        "assignment": packs,
    }


__all__ = ["ALGORITHMS", "Pack", "PlanConfig", "PlanResult", "assign", "lower_bounds", "make_plan", "math"]
