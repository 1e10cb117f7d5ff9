"""Attention masks from a collated batch's compact form (``seq_idx``: the sub-sample of each token, pads a
segment of their own; Gemma 3's ``token_type_ids``), built where they are used, in torch.

The collator hands the model no L x L object by default: sdpa / eager / flex detect the packing from the
restarting ``position_ids`` and flash-attn / Megatron read ``cu_seqlens``. These are for the cases that need a
mask: Gemma 3, whose bidirectional image blocks transformers (5.24) misplaces in its sliding-window layers
once a later sub-sample of a pack has an image (the block ids are looked up by within-sub-sample positions),
and any caller who wants one: ``attention_mask`` (dense bool ``[B, 1, L, L]``, or for Gemma 3 the
``{"full_attention", "sliding_attention"}`` dict its forward takes as is) and ``flex_block_mask`` (the same
rule as a FlexAttention ``BlockMask``, compact)."""

from __future__ import annotations


def image_blocks(token_type_ids):
    """[B, L]: the index of the image each image token belongs to (one run of type-1 tokens per image or
    crop, counted along the row), -1 elsewhere (Gemma 3's ``get_block_sequence_ids_for_mask``)."""
    import torch

    is_image = token_type_ids == 1
    start = is_image & ~torch.nn.functional.pad(is_image, (1, 0))[:, :-1]
    return torch.where(is_image, torch.cumsum(start.int(), dim=1) - 1, -1)


def mask_mod(seq_idx, blocks=None, sliding_window: int | None = None):
    """``(b, h, q, kv) -> bool``: q sees kv when both are in one sub-sample and kv <= q, or (``blocks``) both
    are in one image; with ``sliding_window`` only kv > q - window (transformers' sliding layers)."""

    def mod(b, h, q, kv):
        same = seq_idx[b, q] == seq_idx[b, kv]
        seen = kv <= q
        if blocks is not None:
            seen = seen | ((blocks[b, q] == blocks[b, kv]) & (blocks[b, q] >= 0))
        ok = same & seen
        return ok & (kv > q - sliding_window) if sliding_window is not None else ok
    return mod


def _dense(mod, batch: int, length: int, device):
    """``mod`` on every (q, kv) of every row, one row at a time (a row's temporaries, not the batch's)."""
    import torch

    out = torch.empty((batch, 1, length, length), dtype=torch.bool, device=device)
    q = torch.arange(length, device=device)[:, None]
    kv = torch.arange(length, device=device)[None, :]
    for b in range(batch):
        out[b, 0] = mod(torch.tensor(b, device=device), 0, q, kv)
    return out


def _mods(batch: dict, sliding_window: int | None) -> dict:
    seq_idx = batch["seq_idx"]
    if "token_type_ids" not in batch:
        return {"": mask_mod(seq_idx)}
    if sliding_window is None:
        raise ValueError("Gemma 3's sliding layers need their window: sliding_window=config.text_config.sliding_window")
    blocks = image_blocks(batch["token_type_ids"])
    return {"full_attention": mask_mod(seq_idx, blocks), "sliding_attention": mask_mod(seq_idx, blocks, sliding_window)}


def attention_mask(batch: dict, sliding_window: int | None = None):
    """The dense mask of a collated batch, on its tensors' device: ``[B, 1, L, L]`` bool (True = attend), or for
    Gemma 3 (a batch with ``token_type_ids``) the dict of both layer kinds' masks. O(L²): build it on the
    device that runs the step, not in a DataLoader worker."""
    B, L = batch["seq_idx"].shape
    masks = {k: _dense(m, B, L, batch["seq_idx"].device) for k, m in _mods(batch, sliding_window).items()}
    return masks[""] if "" in masks else masks


def flex_block_mask(batch: dict, sliding_window: int | None = None):
    """The same masks as FlexAttention ``BlockMask``s (``attn_implementation="flex_attention"``), compact."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, L = batch["seq_idx"].shape
    masks = {k: create_block_mask(m, B=B, H=None, Q_LEN=L, KV_LEN=L, device=batch["seq_idx"].device)
             for k, m in _mods(batch, sliding_window).items()}
    return masks[""] if "" in masks else masks
