"""One media type's samples bin-packed (`pack_group`): what `plan.make_plan` and a blend's epochs
(core/blend.py) pack, near the lower bound, with the caps.

At 10M samples each column is 80 MB: when the group is every sample (one media type, or a mixed plan) and
when every sample fits, the columns are used as they are, not copied by index (issue 41: the plan's peak)."""

from __future__ import annotations

import numpy as np

from .binpack import assign, lower_bounds
from .groups import split_to_groups
from .settings import PlanConfig


def pack_group(idx: np.ndarray, sample_ids, lengths: np.ndarray, n_media: np.ndarray, vision_tokens: np.ndarray,
               config: PlanConfig, dropped: list[dict], raw: list, mt: str, drop_row=None, kinds=None
               ) -> tuple[list[np.ndarray], dict]:
    """Bin-pack one media type's items: their packs (item index arrays) and figures; what does not fit
    goes to ``dropped`` (``drop_row(i, reason)`` makes its row), or alone to ``raw`` when overlong samples
    are kept. ``idx``: the items, ascending; ``lengths``: what each item takes in a pack (padded, with context
    parallelism); ``kinds``: each item's media type when they differ (a mixed plan), for the groups of a world
    size."""
    cap, caps = config.capacity, config.caps
    every = len(idx) == len(lengths)  # (ascending and as many as the items: every item, in order)
    lens, media, vision = (lengths, n_media, vision_tokens) if every else \
        (lengths[idx], n_media[idx], vision_tokens[idx])
    packs = assign(lens, cap, config.algorithm, caps, media, vision, config.seed)
    kept = packs >= 0
    for i in idx[~kept].tolist():
        reason = "overlong" if lengths[i] > cap else "over_cap"
        if reason == "overlong" and config.keep_overlong:
            raw.append((mt, np.asarray([i]), True))
            continue
        dropped.append(drop_row(i, reason) if drop_row else
                       {"sample_id": sample_ids[i], "total_tokens": int(lengths[i]), "reason": reason})
    all_kept = bool(kept.all())
    kept_packs, kept_lens = (packs, lens) if all_kept else (packs[kept], lens[kept])
    order = np.argsort(kept_packs, kind="stable")
    members = order if every and all_kept else (idx if all_kept else idx[kept])[order]
    sizes = np.bincount(kept_packs) if len(kept_packs) else np.zeros(0, np.int64)
    bounds = np.cumsum(sizes[sizes > 0])[:-1]  # where the pack number changes in that order (no sorted copy)
    del order
    groups = list(np.split(members, bounds)) if len(members) else []
    if config.group_size > 1:
        groups = split_to_groups(groups, lengths, config.group_size, kinds)
    l1, l2 = lower_bounds(kept_lens, cap)
    bound = max([l2] + [-(-int(total[kept].sum()) // c) for total, c in (
        (kept, caps.max_samples), (media, caps.max_media), (vision, caps.max_vision_tokens)) if c])
    fill = float(kept_lens.sum()) / (len(groups) * cap) if groups else 0.0
    return groups, {"samples": len(idx), "packs": len(groups), "l1": l1, "l2": l2, "lower_bound": bound,
                    "over_bound": len(groups) - bound, "fill": fill, "dropped": int((~kept).sum())}
