"""Context parallelism's padding (THD layout): each sub-sample padded to a multiple of ``m`` before a pack is
split across CP ranks.

Megatron-LM (``get_padding`` of its multimodal context parallel path), Transformer Engine's THD attention and
verl pad every sub-sample, not the pack, to ``m = 2·cp`` (``2·cp·tp`` with sequence parallelism, ``tp`` with
sequence parallelism alone): TE cuts each padded sub-sample into ``2·cp`` equal chunks and gives rank r chunks
r and 2·cp−1−r (``thd_get_partitioned_indices``), which needs every padded length divisible by ``2·cp``. A
planner that packs the real lengths then overflows ``max_len`` at training time; the plan packs the padded
lengths instead (`padded`), and ``_meta`` names ``m`` (``sample_multiple``) so the reader can lay a pack out
at ``cu_seqlens_padded``.
"""

from __future__ import annotations

import numpy as np


def sample_multiple(cp_size: int = 1, tp_size: int = 1, sequence_parallel: bool = False, explicit: int = 0) -> int:
    """The multiple each sub-sample is padded to (1: none). ``explicit`` (> 0) is taken as given, and must be a
    multiple of what cp, tp and sequence parallelism need (e.g. ``lcm(16, 2·cp)`` for FP8)."""
    if cp_size < 1 or tp_size < 1 or explicit < 0:
        raise ValueError(f"cp_size and tp_size must be >= 1 and sample_multiple >= 0, got {cp_size}, {tp_size}, "
                         f"{explicit}")
    if tp_size > 1 and not sequence_parallel:
        raise ValueError("tp_size changes the padding only with sequence parallelism: set sequence_parallel "
                         "(--sequence-parallel) or leave tp_size at 1")
    need = (2 * cp_size if cp_size > 1 else 1) * (tp_size if sequence_parallel else 1)
    if explicit:
        if explicit % need:
            raise ValueError(f"sample_multiple {explicit} is not a multiple of {need}, which cp_size {cp_size}, "
                             f"tp_size {tp_size}{' with sequence parallelism' if sequence_parallel else ''} need")
        return explicit
    return need


def padded(lengths, m: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``m`` (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return -(-lengths // m) * m


def cu_seqlens(lengths, m: int = 1) -> np.ndarray:
    """``[0, l1, l1+l2, ...]`` (int32) of the lengths, each padded to a multiple of ``m`` first."""
    return np.concatenate([[0], np.cumsum(padded(lengths, m))]).astype(np.int32)


def pack_padded_len(lengths, m: int) -> int:
    """A pack's length once each of its sub-samples is padded: what must fit ``max_len``."""
    return int(padded(lengths, m).sum())


def padded_stats(lengths: np.ndarray, n: int, config) -> dict:
    """The plan's figures on padded lengths: the multiple, the tokens the ``n`` packs hold once each of their
    members' ``lengths`` is padded, and their fill of ``max_len`` (what the lower bound, computed on padded
    lengths, is compared with)."""
    m = config.multiple
    tokens = pack_padded_len(lengths, m)
    return {"sample_multiple": m, "padded_tokens": tokens, "fill_padded": tokens / (n * config.max_len) if n else 0.0}


def check_padded(con, config) -> list[tuple[str, int, str]]:
    """(check, how many bad, detail): packs whose sub-samples, each padded to the multiple (``pack_members``'
    ``padded_len``), do not fit ``max_len`` (with the pack padded to ``pad_multiple`` too)."""
    if config.multiple == 1:
        return []  # the pack's own length is checked already
    pad = config.pad_multiple
    over = con.execute(
        "SELECT count(*) FROM (SELECT pack_id, sum(pm.padded_len) AS n, any_value(p.overlong) AS overlong, "
        "count(*) AS k FROM pack_members pm JOIN pack_plan p USING (pack_id) GROUP BY pack_id) "
        "WHERE ceil(n / ?) * ? > ? AND NOT (overlong AND k = 1)", [pad, pad, config.max_len]).fetchone()[0]
    return [("over_capacity", over, f"{over} pack(s) over {config.max_len} tokens once each sub-sample is padded "
                                    f"to a multiple of {config.multiple}")]
