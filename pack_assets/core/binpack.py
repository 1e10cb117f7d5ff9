"""Bin-packing algorithms on integer arrays: the planner's engine.

``assign(lengths, capacity, algorithm, caps=...)`` returns each item's pack index (-1 for items longer than
the capacity), packs numbered from 0 without gaps. Every algorithm is deterministic (``mix`` through its
seed) and respects every cap.

- ``bfd`` (default): global best-fit-decreasing. Without count caps it runs on the length histogram
  (FACTS.md): sizes from the largest down; the packs with the smallest room that still fits take
  ``room // size`` copies at once, so work grows with packs × distinct sizes, not with items.
- ``ffd``: first-fit decreasing (segment tree over pack rooms: O(n log packs)).
- ``first_fit``: first fit in arrival order (the seed analysis' behaviour).
- ``next_fit``: one open pack at a time, in arrival order (lmms-engine streaming).
- ``window_N``: next fit with an N-item look-ahead (lmms-engine ``window_N``).
- ``mix``: best fit in seeded random order (packs of random composition), then the items of packs
  under ``repack_below`` fill are packed again with BFD.
- ``mixfill`` (a recipe's default): one pack at a time, items in seeded random order while they fit,
  then the longest unplaced item that fits the room left, repeatedly; packs under 99.5 % fill packed
  again with BFD. Random composition like ``mix``, near BFD's count.
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass

import numpy as np

ALGORITHMS = ("bfd", "ffd", "first_fit", "next_fit", "window_16", "mix", "mixfill")
MIXFILL_REPACK_BELOW = 0.995  # measured: 0.98 left +0.13 % on small blends, 1.0 a denser BFD tail
_WINDOW = re.compile(r"window_(\d+)$")
# every name `assign` accepts, as help and errors list them (window_16, the sweep's window, stands for any N)
ACCEPTED = tuple("window_N" if _WINDOW.match(a) else a for a in ALGORITHMS)


@dataclass(frozen=True)
class Caps:
    """Per-pack limits, all optional (0 = none)."""

    max_samples: int = 0
    max_media: int = 0  # images + videos per pack
    max_vision_tokens: int = 0

    @property
    def any(self) -> bool:
        return bool(self.max_samples or self.max_media or self.max_vision_tokens)


def check_algorithm(name: str) -> None:
    if name not in ALGORITHMS and not _WINDOW.match(name):
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ACCEPTED)}")


class _Limits:
    """Tracks count caps per pack; items that break a cap on their own are dropped up front."""

    def __init__(self, caps: Caps, media: np.ndarray | None, vision: np.ndarray | None, n: int):
        self.caps = caps
        self.media = np.zeros(n, np.int64) if media is None else np.asarray(media, np.int64)
        self.vision = np.zeros(n, np.int64) if vision is None else np.asarray(vision, np.int64)
        self.count: list[int] = []
        self.m: list[int] = []
        self.v: list[int] = []

    def alone_ok(self, i: int) -> bool:
        c = self.caps
        return ((not c.max_media or self.media[i] <= c.max_media)
                and (not c.max_vision_tokens or self.vision[i] <= c.max_vision_tokens))

    def new(self) -> int:
        self.count.append(0)
        self.m.append(0)
        self.v.append(0)
        return len(self.count) - 1

    def fits(self, p: int, i: int) -> bool:
        c = self.caps
        return ((not c.max_samples or self.count[p] < c.max_samples)
                and (not c.max_media or self.m[p] + self.media[i] <= c.max_media)
                and (not c.max_vision_tokens or self.v[p] + self.vision[i] <= c.max_vision_tokens))

    def add(self, p: int, i: int) -> None:
        self.count[p] += 1
        self.m[p] += int(self.media[i])
        self.v[p] += int(self.vision[i])

    def closed(self, p: int) -> bool:
        return bool(self.caps.max_samples) and self.count[p] >= self.caps.max_samples


def _put(buckets: dict[int, list[int]], rooms: list[int], room: int, p: int) -> None:
    """File pack p under its remaining room (rooms: the sorted keys of buckets)."""
    b = buckets.get(room)
    if b is None:
        buckets[room] = [p]
        bisect.insort(rooms, room)
    else:
        b.append(p)


def _decreasing(lengths: np.ndarray, fits: np.ndarray | None, capacity: int) -> np.ndarray:
    """The items that fit (``fits``; None: every item), longest first, ties in index order: a stable sort on
    capacity - length, which fits 16 bits up to a capacity of 65,536 (NumPy's stable sort of 16-bit keys is a
    radix sort, O(n))."""
    chosen = lengths if fits is None else lengths[fits]
    # (16 bits computed as such, wrapping: no 64-bit key first)
    key = np.subtract(np.uint16(capacity & 0xFFFF), chosen, dtype=np.uint16, casting="unsafe") if capacity <= 1 << 16 \
        else capacity - chosen
    order = np.argsort(key, kind="stable")
    return order if fits is None else fits[order]


class _Rooms:
    """BFD over the length histogram: packs filed by room left (buckets, LIFO), events (pack, copies) in
    the order the sorted items take them. A bucket's packs share a room, so all but the last pack taken
    from it take the same number of copies: each step moves a slice of a bucket, not one pack at a time."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.n_packs = capacity, 0
        self.buckets: dict[int, array] = {}  # room left -> packs with that room
        self.rooms: list[int] = []  # sorted rooms with a non-empty bucket
        self.ev_pack, self.ev_count = array("q"), array("q")

    def _file(self, room: int, packs) -> None:
        b = self.buckets.get(room)
        if b is None:
            self.buckets[room] = b = array("q")
            bisect.insort(self.rooms, room)
        b.extend(packs)

    def _take(self, packs: array, room: int, s: int, q: int, k: int) -> int:
        """`packs` (in the order they are taken), each q copies of size s, the last only what is left of k."""
        m = len(packs)
        last = k - (m - 1) * q
        self.ev_pack.extend(packs)
        self.ev_count.extend(array("q", [q]) * (m - 1))
        self.ev_count.append(last)
        if m > 1:
            self._file(room - q * s, packs[:-1])
        self._file(room - last * s, packs[-1:])
        return k - (m - 1) * q - last

    def place(self, s: int, k: int) -> None:
        """k items of size s: best fit (smallest room that holds one), room // s copies per pack at once."""
        while k:
            i = bisect.bisect_left(self.rooms, s)
            if i == len(self.rooms):  # nothing fits: open packs, each takes capacity // s copies
                q = self.capacity // s
                m = -(-k // q)
                k = self._take(array("q", range(self.n_packs, self.n_packs + m)), self.capacity, s, q, k)
                self.n_packs += m
                return
            room = self.rooms[i]
            bucket, q = self.buckets[room], room // s
            m = min(len(bucket), -(-k // q))
            taken = bucket[-m:]
            taken.reverse()  # popped from the end
            del bucket[-m:]
            if not bucket:
                del self.buckets[room]
                self.rooms.pop(i)
            k = self._take(taken, room, s, q, k) if m * q >= k else self._take_all(taken, room, s, q, k)

    def _take_all(self, packs: array, room: int, s: int, q: int, k: int) -> int:
        self.ev_pack.extend(packs)
        self.ev_count.extend(array("q", [q]) * len(packs))
        self._file(room - q * s, packs)
        return k - q * len(packs)


_EVENTS = 1 << 14  # `_bfd_histogram`'s events turned into items' packs at once


def _bfd_rooms(counts: np.ndarray, capacity: int) -> _Rooms:
    """BFD of the items that fit, given as their length histogram: its events, longest items first."""
    sizes = np.flatnonzero(counts)[::-1]
    rooms = _Rooms(capacity)
    for s, k in zip(sizes.tolist(), counts[sizes].tolist()):
        rooms.place(s, k)
    return rooms


def _bfd_histogram(lengths: np.ndarray, capacity: int) -> np.ndarray:
    pack = np.full(len(lengths), -1, dtype=np.int64)
    fit = lengths <= capacity
    # every item fits (the usual case): no index of every item (8 B each, beside the pack numbers and the order)
    fits = None if fit.all() else np.flatnonzero(fit)
    del fit
    if fits is not None and len(fits) == 0:
        return pack
    order = _decreasing(lengths, fits, capacity)
    rooms = _bfd_rooms(np.bincount(lengths if fits is None else lengths[fits]), capacity)
    del fits
    ev_pack, ev_count = np.frombuffer(rooms.ev_pack, np.int64), np.frombuffer(rooms.ev_count, np.int64)
    at = 0
    for a in range(0, len(ev_pack), _EVENTS):  # each item's pack, a slice of the events at a time (not all at once)
        part = np.repeat(ev_pack[a:a + _EVENTS], ev_count[a:a + _EVENTS])
        pack[order[at:at + len(part)]] = part
        at += len(part)
    return pack


def _best_fit(lengths: np.ndarray, capacity: int, order: np.ndarray, limits: _Limits) -> np.ndarray:
    """Best fit item by item in the given order, with caps (packs bucketed by room)."""
    pack = np.full(len(lengths), -1, dtype=np.int64)
    buckets: dict[int, list[int]] = {}
    rooms: list[int] = []
    room_of: list[int] = []
    lens = lengths.tolist()
    for i in order.tolist():
        s = lens[i]
        if s > capacity or not limits.alone_ok(i):
            continue
        chosen = -1
        j = bisect.bisect_left(rooms, s)
        while j < len(rooms) and chosen < 0:
            bucket = buckets[rooms[j]]
            for pos in range(len(bucket) - 1, -1, -1):
                if limits.fits(bucket[pos], i):
                    chosen = bucket.pop(pos)
                    break
            if not bucket:
                del buckets[rooms[j]]
                rooms.pop(j)
            elif chosen < 0:
                j += 1
        if chosen < 0:
            chosen = limits.new()
            room_of.append(capacity)
        pack[i] = chosen
        limits.add(chosen, i)
        room_of[chosen] -= s
        if room_of[chosen] > 0 and not limits.closed(chosen):
            _put(buckets, rooms, room_of[chosen], chosen)
    return pack


class _MaxTree:
    """Segment tree over pack rooms: leftmost pack with room >= s in O(log packs)."""

    def __init__(self, capacity: int, n: int):
        size = 1
        while size < max(1, n):
            size *= 2
        self.size, self.capacity = size, capacity
        self.t = [capacity] * (2 * size)  # unopened packs have full room

    def leftmost(self, s: int) -> int:
        t = self.t
        if t[1] < s:
            return -1
        i = 1
        while i < self.size:
            i = 2 * i if t[2 * i] >= s else 2 * i + 1
        return i - self.size

    def set(self, p: int, room: int) -> None:
        i = p + self.size
        t = self.t
        t[i] = room
        i //= 2
        while i:
            a, b = t[2 * i], t[2 * i + 1]
            t[i] = a if a > b else b
            i //= 2


def _first_fit(lengths: np.ndarray, capacity: int, order: np.ndarray, limits: _Limits) -> np.ndarray:
    pack = np.full(len(lengths), -1, dtype=np.int64)
    n = len(lengths)
    tree = _MaxTree(capacity, n)
    rooms = [capacity] * n
    opened = 0
    lens = lengths.tolist()
    caps = limits.caps.any
    for i in order.tolist():
        s = lens[i]
        if s > capacity or not limits.alone_ok(i):
            continue
        p = tree.leftmost(s)
        blocked = []
        while caps and 0 <= p < opened and not limits.fits(p, i):  # room enough, but at a cap: look further
            blocked.append(p)
            tree.set(p, 0)
            p = tree.leftmost(s)
        for b in blocked:
            tree.set(b, rooms[b])
        if p < 0 or p >= opened:
            p = opened
            opened += 1
            limits.new()
        pack[i] = p
        limits.add(p, i)
        rooms[p] -= s
        tree.set(p, 0 if limits.closed(p) else rooms[p])
    return pack


def _next_fit(lengths: np.ndarray, capacity: int, window: int, limits: _Limits) -> np.ndarray:
    """One open pack; it takes the first of the next ``window`` items that fits, else closes."""
    pack = np.full(len(lengths), -1, dtype=np.int64)
    lens = lengths.tolist()
    queue = [i for i in range(len(lens)) if lens[i] <= capacity and limits.alone_ok(i)]
    buf: list[int] = []
    nxt = 0
    current, room = -1, 0
    while nxt < len(queue) or buf:
        while len(buf) < window and nxt < len(queue):
            buf.append(queue[nxt])
            nxt += 1
        k = -1
        if current >= 0:
            k = next((k for k, i in enumerate(buf) if lens[i] <= room and limits.fits(current, i)), -1)
        if k < 0:
            current, room = limits.new(), capacity
            k = 0
        i = buf.pop(k)
        pack[i] = current
        limits.add(current, i)
        room -= lens[i]
    return pack


_CHAIN_CHUNK = 1 << 20  # starts whose ends `_next_fit_starts` turns into Python ints at once


def _next_fit_starts(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``_next_fit`` with one item of look-ahead and no caps, as its packs' starts: the kept items (None: every
    item) and a 0/1 per kept item, 1 where a pack starts. In O(n log n) numpy plus one Python step per pack: a
    pack that starts at kept item j ends before the first item whose prefix sum passes ``sum(before j) +
    capacity``, so every start's end comes from one ``searchsorted``; the starts are then the chain from item 0
    (docs/benchmarks.md has its time at 1M lengths)."""
    fit = lengths <= capacity
    every = bool(fit.all())  # (then no index of every item, no copy of the lengths nor of their pack numbers)
    kept = None if every else np.flatnonzero(fit)
    n = len(lengths) if every else len(kept)
    starts = np.zeros(n, dtype=np.int8)
    if not n:
        return kept, starts
    prefix = np.zeros(n + 1, np.int64)
    np.cumsum(lengths if every else lengths[kept], out=prefix[1:])
    j = 0
    for a in range(0, n, _CHAIN_CHUNK):  # the ends in chunks: a list of every end held 36 B an item (issue 41)
        b = min(n, a + _CHAIN_CHUNK)
        ends = (np.searchsorted(prefix, prefix[a:b] + capacity, side="right") - 1).tolist()
        while j < b:  # every kept item fits alone, so ends[j] > j
            starts[j] = 1
            j = ends[j - a]
    return kept, starts


def _next_fit_plain(lengths: np.ndarray, capacity: int) -> np.ndarray:
    pack = np.full(len(lengths), -1, dtype=np.int64)
    kept, starts = _next_fit_starts(lengths, capacity)
    if not len(starts):
        return pack
    numbers = np.cumsum(starts, dtype=np.int64, out=pack if kept is None else None)
    numbers -= 1
    if kept is not None:
        pack[kept] = numbers
    return pack


def pack_sizes(lengths: np.ndarray, capacity: int, algorithm: str) -> np.ndarray | None:
    """Items per pack, in pack number order, of `assign`'s packing without caps, found without each item's pack
    where the algorithm allows it (BFD from its length histogram, with no sort; next fit from its packs'
    starts), so a what-if sweep holds no assignment of every item (8 B an item); None for the others. The
    items it drops are those over ``capacity``, as `assign`'s."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if algorithm == "next_fit":
        _, starts = _next_fit_starts(lengths, capacity)
        return np.diff(np.flatnonzero(starts), append=len(starts))
    if algorithm != "bfd":
        return None
    fit = lengths <= capacity
    rooms = _bfd_rooms(np.bincount(lengths if fit.all() else lengths[fit]), capacity)
    return np.bincount(np.frombuffer(rooms.ev_pack, np.int64), weights=np.frombuffer(rooms.ev_count, np.int64),
                       minlength=rooms.n_packs).astype(np.int64)


def _renumber(pack: np.ndarray) -> np.ndarray:
    """Packs numbered 0..k-1 in order of first appearance by item index (stable, no gaps)."""
    kept = pack >= 0
    if not kept.any():
        return pack
    _, first, inverse = np.unique(pack[kept], return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    out = pack.copy()
    out[kept] = rank[inverse]
    return out


def _mix(lengths, capacity, limits_factory, seed: int, repack_below: float) -> np.ndarray:
    n = len(lengths)
    order = np.random.default_rng(seed).permutation(n)
    pack = _best_fit(lengths, capacity, order, limits_factory())
    return _repack_weak(pack, lengths, capacity, repack_below, limits_factory)


def _repack_weak(pack: np.ndarray, lengths: np.ndarray, capacity: int, below: float, limits_factory) -> np.ndarray:
    """The items of packs filled under ``below`` x capacity packed again together by BFD (as packs numbered
    after the others), then the packs renumbered (`_renumber`)."""
    kept = pack >= 0
    if not kept.any():
        return pack
    load = np.bincount(pack[kept], weights=lengths[kept])
    redo = kept & (load < below * capacity)[np.where(kept, pack, 0)]
    if redo.sum() > 1:
        idx = np.flatnonzero(redo)
        again = _best_fit(lengths[idx], capacity, np.argsort(-lengths[idx], kind="stable"), limits_factory(idx))
        pack[idx] = np.where(again >= 0, again + pack.max() + 1, -1)
    return _renumber(pack)


def _mixfill(lengths: np.ndarray, capacity: int, limits: _Limits, limits_factory, seed: int) -> np.ndarray:
    """One pack at a time: items in seeded random order while the next one fits, then the longest unplaced
    item that fits the room left, again and again; packs still under MIXFILL_REPACK_BELOW are packed again
    with BFD. The random start mixes every dataset into every pack (as `mix`); the completion closes each
    gap with whatever fits it best, so short items end up as the last filler of many packs instead of
    waiting in random order for a gap of their size (`mix`: +0.5 % on small blends) or filling the last
    packs together (BFD's tail). bench/results/blend_small.json, blend.json: within +0.1 % of the bound
    on ~3,000 packs and at 1M."""
    n = len(lengths)
    lens = lengths.tolist()
    order = [i for i in np.random.default_rng(seed).permutation(n).tolist()
             if lens[i] <= capacity and limits.alone_ok(i)]
    pool: dict[int, list[int]] = {}  # length -> its unplaced items, the earliest in the seeded order last
    for i in reversed(order):
        pool.setdefault(lens[i], []).append(i)
    sizes = sorted(pool)
    pack = np.full(n, -1, dtype=np.int64)
    placed = bytearray(n)

    def take(i: int, p: int) -> None:
        b = pool[lens[i]]
        if b[-1] == i:
            b.pop()
        else:
            b.remove(i)
        if not b:
            del pool[lens[i]]
            sizes.pop(bisect.bisect_left(sizes, lens[i]))
        placed[i] = 1
        pack[i] = p
        limits.add(p, i)

    pos = 0
    while True:
        while pos < len(order) and placed[order[pos]]:
            pos += 1
        if pos == len(order):
            break
        p, room = limits.new(), capacity
        while pos < len(order):  # the random start
            i = order[pos]
            if placed[i]:
                pos += 1
                continue
            if lens[i] > room or not limits.fits(p, i):
                break
            take(i, p)
            room -= lens[i]
            pos += 1
        j, skipped = bisect.bisect_right(sizes, room) - 1, 0
        while j >= 0 and skipped < 64 and not limits.closed(p):  # the completion (a few sizes tried past a cap)
            i = pool[sizes[j]][-1]
            if limits.fits(p, i):
                take(i, p)
                room -= lens[i]
                j = bisect.bisect_right(sizes, room) - 1
            else:
                j, skipped = j - 1, skipped + 1
    return _repack_weak(pack, lengths, capacity, MIXFILL_REPACK_BELOW, limits_factory)


def assign(
    lengths: np.ndarray,
    capacity: int,
    algorithm: str = "bfd",
    caps: Caps = Caps(),
    media: np.ndarray | None = None,
    vision: np.ndarray | None = None,
    seed: int = 0,
    repack_below: float = 0.98,
) -> np.ndarray:
    """Pack index per item (-1: over the capacity, or over a media/vision cap on its own)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    check_algorithm(algorithm)
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if len(lengths) and lengths.min() <= 0:
        raise ValueError("lengths must be positive")
    n = len(lengths)

    def limits(idx: np.ndarray | None = None) -> _Limits:
        if idx is None:
            return _Limits(caps, media, vision, n)
        return _Limits(caps, None if media is None else np.asarray(media)[idx],
                       None if vision is None else np.asarray(vision)[idx], len(idx))

    if algorithm == "bfd" and not caps.any:
        return _bfd_histogram(lengths, capacity)
    if algorithm == "bfd":
        return _renumber(_best_fit(lengths, capacity, np.argsort(-lengths, kind="stable"), limits()))
    if algorithm == "ffd":
        return _renumber(_first_fit(lengths, capacity, np.argsort(-lengths, kind="stable"), limits()))
    if algorithm == "first_fit":
        return _first_fit(lengths, capacity, np.arange(n), limits())
    if algorithm == "next_fit":
        return _next_fit(lengths, capacity, 1, limits()) if caps.any else _next_fit_plain(lengths, capacity)
    if algorithm == "mix":
        return _mix(lengths, capacity, limits, seed, repack_below)
    if algorithm == "mixfill":
        return _mixfill(lengths, capacity, limits(), limits, seed)
    return _next_fit(lengths, capacity, int(_WINDOW.match(algorithm).group(1)), limits())


def lower_bounds(lengths: np.ndarray, capacity: int) -> tuple[int, int]:
    """L1 = ceil(Σℓ/C) and Martello–Toth L2 over the items that fit, in O(C) from the histogram."""
    lengths = np.asarray(lengths, dtype=np.int64)
    fit = lengths <= capacity
    lengths = lengths if fit.all() else lengths[fit]  # (no copy of every length when all fit)
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


def without(values: np.ndarray, gone: np.ndarray) -> np.ndarray:
    """``values`` less one of each of ``gone`` (a difference of multisets: each of ``gone`` is among them)."""
    if not len(gone):
        return values
    a, g = np.sort(values), np.sort(gone)
    at = np.searchsorted(a, g) + np.arange(len(g)) - np.searchsorted(g, g)  # the k-th of equal ones: k places on
    if (at >= len(a)).any() or (a[np.minimum(at, len(a) - 1)] != g).any():
        raise RuntimeError("a dropped sample's length is not among the plan's: run again")
    return np.delete(a, at)
