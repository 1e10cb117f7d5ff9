"""The THD layout of context parallelism: each sub-sample at its padded offset (``cu_seqlens_padded``), its
padding after it, as Megatron-LM (``get_batch_on_this_cp_rank``) and Transformer Engine
(``thd_get_partitioned_indices``: of each padded sub-sample's ``2·cp`` chunks, rank r takes chunks r and
2·cp−1−r) read a packed batch. The padding sits at the end of its sub-sample, so with causal attention no
real token sees it; it carries no label and no loss weight."""

from __future__ import annotations

import numpy as np


def needs_padding(pack: dict) -> bool:
    """Whether the pack was planned with each sub-sample padded (``sample_multiple`` > 1 in its ``_meta``)."""
    padded = pack.get("cu_seqlens_padded")
    return padded is not None and not np.array_equal(padded, pack["cu_seqlens"])


def thd_padded(pack: dict, pad_id: int, fields) -> dict:
    """The encoded pack with its per-token arrays (``fields``: (key, fill, dtype), fill None: ``pad_id``) laid out
    at ``cu_seqlens_padded`` (``cu_seqlens`` then names the padded offsets, ``real_cu_seqlens`` the sub-samples'
    own lengths, ``real`` marks real tokens)."""
    real = np.asarray(pack["cu_seqlens"])
    offs = np.asarray(pack.get("cu_seqlens_padded", real))
    total = int(offs[-1])
    at = np.concatenate([np.arange(offs[i], offs[i] + (real[i + 1] - real[i])) for i in range(len(real) - 1)]
                        + [np.zeros(0, np.int64)]).astype(np.int64)
    out = dict(pack, cu_seqlens=offs, real_cu_seqlens=real)
    for key, fill, _ in fields:
        if key in pack:
            arr = np.asarray(pack[key])
            laid = np.full(total, pad_id if fill is None else fill, dtype=arr.dtype)
            laid[at] = arr
            out[key] = laid
    mask = np.zeros(total, dtype=bool)
    mask[at] = True
    out["real"] = mask
    if "rope_position_ids" in pack:  # Qwen-VL's mRoPE rows: padding at position 0 (masked, never attended)
        rope = np.zeros((3, total), dtype=np.int64)
        rope[:, at] = pack["rope_position_ids"]
        out["rope_position_ids"] = rope
    return out


def thd_fields(packs: list[dict], rows: list[list[dict]], width: int) -> dict:
    """What the collator adds for the THD layout (``packs`` laid out by `thd_padded`, in ``rows``): real
    ``cu_seqlens`` (each row's trailing padding a segment of real length 0) beside ``cu_seqlens_padded``, and
    ``padding_mask`` True at real tokens only."""
    import torch

    real, padded, mask = [0], [0], np.zeros((len(rows), width), dtype=bool)
    for r, row in enumerate(rows):
        used = 0
        for p in row:
            real += (real[-1] + np.cumsum(np.diff(p["real_cu_seqlens"]))).tolist()
            padded += (padded[-1] + np.cumsum(np.diff(p["cu_seqlens"]))).tolist()
            mask[r, used:used + len(p["real"])] = p["real"]
            used += len(p["real"])
        if used < width:
            real.append(real[-1])
            padded.append(padded[-1] + width - used)
    return {"cu_seqlens": torch.tensor(real, dtype=torch.int32),
            "cu_seqlens_padded": torch.tensor(padded, dtype=torch.int32),
            "padding_mask": torch.from_numpy(mask)}
