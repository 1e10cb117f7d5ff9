"""``PackCollator``: a batch of encoded packs as torch tensors, with the packing in compact form."""

from __future__ import annotations

import numpy as np

from .masks import attention_mask
from .thd import needs_padding, thd_fields, thd_padded
from .vision import processor_pixels, qwen_images, qwen_videos

# per-token keys of an encoded pack: the fill of the padding and the dtype
_TOKEN_FIELDS = (("input_ids", None, np.int64), ("labels", -100, np.int64), ("loss_weights", 0, np.float32),
                 ("mm_token_type_ids", 0, np.int64), ("token_type_ids", 0, np.int64))


class PackCollator:
    """A ``DataLoader`` ``collate_fn``: a list of encoded packs (``PackEncoder.encode``) → torch tensors.

    Layout: one right-padded row per pack (``[B, L]``), or with ``flatten=True`` every pack of the batch in one
    row without padding (``[1, ΣL]``: what flash-linear-attention's varlen kernels of hybrid models such as
    Qwen3.5 / Qwen3-Next take, and what transformers' ``DataCollatorWithFlattening`` emits).

    Per token (padding: ``pad_id``, -100, 0): ``input_ids``, ``labels``, ``loss_weights``, ``mm_token_type_ids``,
    Gemma 3's ``token_type_ids``; ``position_ids`` restarting at 0 for every sub-sample (pads: one run of their
    own) — ``[B, L]``, or for Qwen-VL ``[4, B, L]`` (the 1-D positions, then the mRoPE ones, the form in which
    transformers' Qwen-VL models detect the packing) with ``rope_position_ids`` ``[3, B, L]``.

    The packing, compact (nothing grows with L²): ``seq_idx`` (int32 ``[B, L]``, the sub-sample of each token
    in its row, the padding one segment more: the document ids of FlexAttention masks and of mamba / GDN
    convolutions), ``cu_seqlens`` (int32, over the flattened ``B * L`` tokens, each row's padding one segment)
    with ``max_seqlen``, the same under transformers' flash / linear-attention names ``cu_seq_lens_q``,
    ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``; ``padding_mask`` (bool ``[B, L]``, True at real
    tokens: for MoE routers and losses that must skip the padding). ``block_mask=True`` also builds
    ``attention_mask`` (masks.py: dense ``[B, 1, L, L]`` bool; Gemma 3: the dict of its full and
    ``sliding_window`` layers' masks) — O(L²), only on request.

    Context parallelism (THD): packs planned with each sub-sample padded (``--cp-size``; their ``_meta`` names
    ``sample_multiple``) are laid out with each sub-sample at its padded offset and its padding after it
    (``cp_layout``: None follows the packs, True / False forces it; thd.py), as Megatron-LM's
    ``get_batch_on_this_cp_rank`` and Transformer Engine's ``thd_get_partitioned_indices`` take them:
    ``cu_seqlens`` then holds the real lengths, ``cu_seqlens_padded`` the padded offsets (``cu_seq_lens_q/k``,
    ``seq_idx`` and ``position_ids`` follow the padded segments; the padding is pad_id / -100 / weight 0 and
    ``padding_mask`` False). Without padding ``cu_seqlens_padded`` equals ``cu_seqlens``.

    Pixels: Qwen-VL from ``processor`` (the model's processor or image processor; images loaded as
    transformers' ``load_image`` does) and ``video_pixels(data, grid)``; InternVL / LLaVA-OneVision / Gemma 3
    from ``processor`` (the model's ``AutoProcessor``; videos decoded with PyAV, sampled by its video processor;
    ``processor_kwargs``: what its call needs beyond its defaults, e.g. Gemma 3's ``do_pan_and_scan=True``).
    torch is imported only here.
    """

    def __init__(self, processor=None, pad_id: int = 151643, block_mask: bool = False, video_pixels=None,
                 flatten: bool = False, sliding_window: int | None = None, processor_kwargs: dict | None = None,
                 cp_layout: bool | None = None):
        self.cp_layout = cp_layout
        self.processor, self.image_processor = processor, getattr(processor, "image_processor", processor)
        self.pad_id, self.block_mask, self.video_pixels = pad_id, block_mask, video_pixels
        self.flatten, self.sliding_window, self.processor_kwargs = flatten, sliding_window, processor_kwargs

    def __call__(self, packs: list[dict]) -> dict:
        import torch

        thd = any(needs_padding(p) for p in packs) if self.cp_layout is None else self.cp_layout
        if thd:
            packs = [thd_padded(p, self.pad_id, _TOKEN_FIELDS) for p in packs]
        rows = [packs] if self.flatten else [[p] for p in packs]
        lens = [[n for p in row for n in np.diff(p["cu_seqlens"]).tolist()] for row in rows]
        width = max(sum(r) for r in lens)
        out = {}
        for key, fill, dtype in _TOKEN_FIELDS:
            if key in packs[0]:
                cat = [np.concatenate([p[key] for p in row]) for row in rows]
                out[key] = torch.from_numpy(_pad_rows(cat, width, self.pad_id if fill is None else fill, dtype))
        segments = [r + ([width - sum(r)] if sum(r) < width else []) for r in lens]  # the padding: one more
        out.update(_packing(segments, lens, width))
        out.update(thd_fields(packs, rows, width) if thd else {"cu_seqlens_padded": out["cu_seqlens"].clone()})
        if "rope_position_ids" in packs[0]:
            rope = np.stack(
                [
                    _pad_rows(
                        [np.concatenate([p["rope_position_ids"][a] for p in row]) for row in rows], width, 0, np.int64
                    )
                    for a in range(3)
                ]
            )
            out["rope_position_ids"] = torch.from_numpy(rope)
            out["position_ids"] = torch.cat([out["position_ids"][None], out["rope_position_ids"]])
        if self.block_mask:
            out["attention_mask"] = attention_mask(out, self.sliding_window)
        if "rope_position_ids" in packs[0]:
            out.update(qwen_images(self.image_processor, packs))
            out.update(qwen_videos(self.video_pixels, packs))
        else:
            out.update(processor_pixels(self.processor, packs, self.processor_kwargs))
        return out


def _packing(segments: list[list[int]], lens: list[list[int]], width: int) -> dict:
    """Positions, document ids, cu_seqlens and the padding mask of rows made of these segments."""
    import torch

    flat = [n for s in segments for n in s]
    cu = np.concatenate([[0], np.cumsum(flat)]).astype(np.int32)
    longest = max(flat)
    return {
        "position_ids": torch.from_numpy(np.stack([np.concatenate([np.arange(n) for n in s]) for s in segments])),
        "seq_idx": torch.from_numpy(np.stack([np.repeat(np.arange(len(s), dtype=np.int32), s) for s in segments])),
        "padding_mask": torch.from_numpy(np.stack([np.arange(width) < sum(r) for r in lens])),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": longest,
        "cu_seq_lens_q": torch.from_numpy(cu.copy()),
        "cu_seq_lens_k": torch.from_numpy(cu.copy()),
        "max_length_q": longest,
        "max_length_k": longest,
    }


def _pad_rows(rows: list, width: int, fill, dtype) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
