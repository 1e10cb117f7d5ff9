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
sample dropped), cuts each key's packs into groups by attention cost (`make_groups`), and orders whole groups;
`check_groups` verifies the stored order. A key whose packs all hold one sample cannot be split: its last group
is short, placed at the end of the order, and reported.
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


def split_to_groups(groups: list[np.ndarray], lengths: np.ndarray, g: int, kinds=None) -> list[np.ndarray]:
    """Split packs until each key's pack count is a multiple of ``g``: per key, the pack with the most samples
    that splits keeping its key. ``kinds``: each item's media type (None: all one type)."""
    def key(items):
        return "" if kinds is None else pack_key(kinds[i] for i in items.tolist())

    for k in sorted({key(p) for p in groups}):
        while sum(key(p) == k for p in groups) % g:
            split = None
            for j in sorted((j for j in range(len(groups)) if key(groups[j]) == k),
                            key=lambda j: (-len(groups[j]), j)):
                split = _halves(groups[j], lengths, kinds)
                if split is not None:
                    groups[j:j + 1] = list(split)
                    break
            if split is None:
                break  # every pack of the key is one sample (or one per media type): its last group stays short
    return groups


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
    return [("mixed_group", bad, f"{bad} group(s) of {g} consecutive packs (world_size x micro_batch_size) mix "
                                 "media types: the ranks of one step would run the vision tower differently")]
