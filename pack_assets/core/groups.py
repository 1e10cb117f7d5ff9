"""Modalities aligned across ranks: every group of ``world_size × micro_batch_size`` consecutive packs shares one
media key, so all ranks of a data-parallel step run the vision tower alike.

With ZeRO-3 / FSDP a step in which one rank's batch holds images and another's does not hangs (the ranks
gather different parameters: LlamaFactory#10450, ms-swift#9639, Qwen3-VL#126). A sampler hands one step
``W·B`` consecutive items of the dataset's order (torch's ``DistributedSampler`` rank r: items r, r+W, ...;
accelerate's ``IterableDatasetShard``: a block of B per rank), so groups of ``W·B`` consecutive packs of one key
keep every rank's batch alike either way. A pack's key is the set of its samples' media types other than
text ("text" when it has none): a per-media-type plan's key is its media type; in a mixed plan "image" and
"image+text" packs are one key (both run the vision tower on images).

The planner makes each key's pack count a multiple of the group size (`split_to_groups`: packs split, never a
sample dropped; in a mixed plan a pack of another key may give up a pack of the key), cuts each key's packs
into groups by attention cost (`make_groups`), and orders whole groups; `check_groups` verifies the stored
order. A key whose packs cannot be split (each one sample) keeps a short last group, placed at the end of
the order: the plan's check reports it.
"""

from __future__ import annotations

import numpy as np


def pack_key(kinds) -> str:
    """A pack's media key from its samples' media types."""
    return "+".join(sorted(set(kinds) - {"text"})) or "text"


def _halves(items: np.ndarray, lengths: np.ndarray, kinds) -> tuple[np.ndarray, np.ndarray] | None:
    """A pack's items in two halves that each keep the pack's key (every non-text media type of the pack in
    both), or None when it cannot be split so. Items of each media type, longest first, alternate between the
    halves (one media type: the longest to the first half, the next to the second, ...)."""
    order = items[np.argsort(-lengths[items], kind="stable")]
    if kinds is None:
        return (order[0::2], order[1::2]) if len(order) >= 2 else None
    per = [order[np.asarray([kinds[i] == k for i in order.tolist()])] for k in sorted({kinds[i] for i in order})]
    if len(order) < 2 or any(len(p) < 2 for p, k in zip(per, sorted({kinds[i] for i in order})) if k != "text"):
        return None
    a: list[int] = []
    b: list[int] = []
    for part in per:
        for i in part.tolist():
            (a if lengths[a].sum() <= lengths[b].sum() else b).append(i)
    return np.asarray(a, dtype=items.dtype), np.asarray(b, dtype=items.dtype)


def _donated(items: np.ndarray, lengths: np.ndarray, kinds, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A pack of another key in two: the shortest item of each media type of ``key`` as a pack of that key,
    the rest keeping the pack's own key; None when it cannot be split so."""
    order = items[np.argsort(lengths[items], kind="stable")]
    taken = []
    for want in key.split("+"):
        taken += [i for i in order.tolist() if kinds[i] == want][:1]
    rest = np.asarray([i for i in order.tolist() if i not in taken], dtype=items.dtype)
    if len(taken) != len(key.split("+")) or not len(rest) or pack_key(kinds[i] for i in rest.tolist()) != \
            pack_key(kinds[i] for i in items.tolist()):
        return None
    return np.asarray(taken, dtype=items.dtype), rest


def _split_for(groups: list[np.ndarray], keys: list[str], k: str, lengths: np.ndarray, kinds):
    """(pack index, its two halves) adding one pack of key ``k``: a pack of the key split in two of it (most
    samples first), else (a mixed plan) a pack of another key giving up a pack of ``k``; None if none can."""
    mine = sorted((j for j in range(len(groups)) if keys[j] == k), key=lambda j: (-len(groups[j]), j))
    for j in mine:
        if (split := _halves(groups[j], lengths, kinds)) is not None:
            return j, split
    if kinds is not None:
        for j in sorted((j for j in range(len(groups)) if keys[j] != k), key=lambda j: (-len(groups[j]), j)):
            if (split := _donated(groups[j], lengths, kinds, k)) is not None:
                return j, split
    return None


def split_to_groups(groups: list[np.ndarray], lengths: np.ndarray, g: int, kinds=None) -> list[np.ndarray]:
    """Split packs until each key's pack count is a multiple of ``g`` (`_split_for`; nothing is dropped).
    ``kinds``: each item's media type (None: all one type)."""
    def key(items):
        return "" if kinds is None else pack_key(kinds[i] for i in items.tolist())

    keys = [key(p) for p in groups]
    while True:
        short = [k for k in sorted(set(keys)) if keys.count(k) % g]
        found = next((f for f in (_split_for(groups, keys, k, lengths, kinds) for k in short) if f), None)
        if found is None:
            return groups  # every key a multiple of g, or a key whose packs cannot split: its last group stays short
        j, halves = found
        groups[j:j + 1] = list(halves)
        keys[j:j + 1] = [key(h) for h in halves]


def make_groups(units: list, lengths: np.ndarray, g: int, kinds=None) -> tuple[list[list], list[list]]:
    """Units ``(media type, items, overlong)`` cut into groups of ``g`` of one key, similar attention costs (Σℓ²)
    side by side: (full groups, short groups). ``kinds``: each item's media type (None: the unit's own)."""
    def key(u):
        return pack_key([u[0]] if kinds is None else [kinds[i] for i in u[1].tolist()])

    full: list[list] = []
    short: list[list] = []
    keys = [key(u) for u in units]
    for k in sorted(set(keys)):
        mine = [u for u, uk in zip(units, keys) if uk == k]
        cost = np.asarray([int((lengths[u[1]] ** 2).sum()) for u in mine])
        order = np.argsort(-cost, kind="stable")
        for a in range(0, len(order), g):
            (full if a + g <= len(order) else short).append([mine[j] for j in order[a:a + g].tolist()])
    return full, short


def check_groups(con, g: int, samples: str = "samples") -> list[tuple[str, int, str]]:
    """(check, how many bad, detail): groups of ``g`` consecutive packs (pack id order, the training order) whose
    packs do not all share one media key. Nothing to check with ``g`` 1."""
    if g <= 1:
        return []
    bad = con.execute(
        f"""WITH k AS (SELECT pm.pack_id, coalesce(string_agg(DISTINCT s.media_type, '+' ORDER BY s.media_type)
                               FILTER (WHERE s.media_type <> 'text'), 'text') AS key
                       FROM pack_members pm JOIN {samples} s USING (sample_id) GROUP BY pm.pack_id),
                o AS (SELECT (row_number() OVER (ORDER BY pack_id) - 1) // ? AS grp, key
                      FROM pack_plan JOIN k USING (pack_id))
            SELECT count(*) FROM (SELECT grp FROM o GROUP BY grp HAVING count(DISTINCT key) > 1)""", [g]).fetchone()[0]
    packs = con.execute("SELECT count(*) FROM pack_plan").fetchone()[0]
    return [("mixed_group", bad, f"{bad} group(s) of {g} consecutive packs (world_size x micro_batch_size) mix "
                                 "media types: the ranks of one step would run the vision tower differently"),
            ("mixed_group", packs % g, f"{packs} packs are not a multiple of {g}: the last step's ranks would "
                                       "differ (a sampler pads it with packs from the start)")]
