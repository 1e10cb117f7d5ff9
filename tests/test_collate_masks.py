"""PackCollator's packing metadata and masks.py's masks, against definitions written out here from the
segment lengths alone: by default no L x L object (a document-id vector, cu_seqlens, a padding mask), the
dense mask and Gemma 3's mask dict only on request, a FlexAttention BlockMask of the same rule; and the
padding mask keeps the pads out of an MoE router's load-balancing statistic."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import needs

pytestmark = needs(importlib.util.find_spec("torch") is None, "torch is not installed (pip install -e '.[train]')")


def _pack(lens: list[int], seed: int, types: list[int] | None = None) -> dict:
    """An encoded text pack of sub-samples of these lengths (the keys PackCollator reads)."""
    rng = np.random.default_rng(seed)
    n = sum(lens)
    out = {
        "family": "gemma3",
        "input_ids": rng.integers(5, 90, n),
        "labels": rng.integers(5, 90, n),
        "loss_weights": np.ones(n, np.float32),
        "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        "position_ids": np.concatenate([np.arange(k) for k in lens]),
        "mm_token_type_ids": np.zeros(n, np.int64),
        "visual_order": [[] for _ in lens],
        "images": [[] for _ in lens],
        "videos": [[] for _ in lens],
    }
    if types is not None:
        out["token_type_ids"] = out["mm_token_type_ids"] = np.asarray(types, np.int64)
    return out


def _reference(segments: list[list[int]], width: int, blocks=None, window=None) -> np.ndarray:
    """[B, 1, L, L]: q sees kv in its own segment when kv <= q or both are in one image block, within window."""
    out = np.zeros((len(segments), 1, width, width), bool)
    for b, seg in enumerate(segments):
        doc = np.repeat(np.arange(len(seg)), seg)
        for q in range(width):
            for kv in range(width):
                img = blocks is not None and blocks[b][q] >= 0 and blocks[b][q] == blocks[b][kv]
                ok = doc[q] == doc[kv] and (kv <= q or img)
                out[b, 0, q, kv] = ok and (window is None or kv > q - window)
    return out


def test_default_batch_is_compact_and_the_dense_mask_only_on_request():
    from pack_assets.reader import PackCollator, attention_mask

    packs = [_pack([5, 9, 3], 0), _pack([11, 4], 1)]
    batch = PackCollator(pad_id=0)(packs)
    assert "attention_mask" not in batch
    assert all(v.dim() <= 2 for v in batch.values() if hasattr(v, "dim"))  # nothing L x L
    segments = [[5, 9, 3], [11, 4, 2]]  # the second row's padding is a segment of its own
    assert batch["seq_idx"].dtype.is_floating_point is False and batch["seq_idx"].tolist() == [
        np.repeat(np.arange(len(s)), s).tolist() for s in segments
    ]
    assert batch["cu_seqlens"].tolist() == batch["cu_seq_lens_q"].tolist() == np.cumsum([0, 5, 9, 3, 11, 4, 2]).tolist()
    assert batch["max_length_q"] == batch["max_seqlen"] == 11
    assert batch["padding_mask"].tolist() == [[True] * 17, [True] * 15 + [False] * 2]
    assert batch["position_ids"].tolist() == [np.concatenate([np.arange(k) for k in s]).tolist() for s in segments]
    assert batch["labels"][1, 15:].tolist() == [-100, -100] and batch["input_ids"][1, 15:].tolist() == [0, 0]
    want = _reference(segments, 17)
    assert np.array_equal(attention_mask(batch).numpy(), want)
    assert np.array_equal(PackCollator(pad_id=0, block_mask=True)(packs)["attention_mask"].numpy(), want)


def test_gemma3_mask_dict_has_bidirectional_images_inside_their_sub_sample_and_the_window():
    from pack_assets.reader import PackCollator, attention_mask, flex_block_mask

    # sub-sample 0: text, image (4 tokens), text; sub-sample 1: text, image (3), text, image (2); row 2 pads
    t0 = [0, 0] + [1] * 4 + [0, 0]
    t1 = [0] + [1] * 3 + [0, 0] + [1] * 2 + [0]
    packs = [_pack([8, 9], 2, t0 + t1), _pack([6], 3, [0, 1, 1, 0, 0, 0])]
    batch = PackCollator(pad_id=0)(packs)
    with pytest.raises(ValueError, match="sliding_window"):
        attention_mask(batch)
    masks = attention_mask(batch, sliding_window=3)
    blocks = [[-1, -1, 0, 0, 0, 0, -1, -1, -1, 1, 1, 1, -1, -1, 2, 2, -1], [-1, 0, 0, -1, -1, -1] + [-1] * 11]
    segments = [[8, 9], [6, 11]]
    assert np.array_equal(masks["full_attention"].numpy(), _reference(segments, 17, blocks))
    assert np.array_equal(masks["sliding_attention"].numpy(), _reference(segments, 17, blocks, window=3))
    assert set(flex_block_mask(batch, sliding_window=3)) == {"full_attention", "sliding_attention"}


def test_flex_block_mask_skips_exactly_the_blocks_the_dense_mask_leaves_empty():
    from pack_assets.reader import PackCollator, attention_mask, flex_block_mask

    batch = PackCollator(pad_id=0)([_pack([200, 150, 90], 6), _pack([300], 7)])
    dense = attention_mask(batch).numpy()[:, 0]
    B, L, _ = dense.shape
    n = -(-L // 128)
    padded = np.zeros((B, n * 128, n * 128), bool)
    padded[:, :L, :L] = dense
    want = padded.reshape(B, n, 128, n, 128).any(axis=(2, 4))
    got = flex_block_mask(batch).to_dense().numpy()[:, 0].astype(bool)
    assert np.array_equal(got, want) and not want.all()  # whole 128 x 128 blocks are skipped


def test_padding_mask_keeps_pads_out_of_the_moe_router_statistic():
    """Qwen3-MoE's load-balancing loss over padded rows with ``padding_mask`` equals the loss over the same
    packs flattened (no pads), and differs without it: the router statistic sees only real tokens."""
    import torch
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeForCausalLM, load_balancing_loss_func

    from pack_assets.reader import PackCollator

    cfg = Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    packs = [_pack([20, 7], 4), _pack([9], 5)]
    losses = {}
    for name, batch in (
        ("padded", PackCollator(pad_id=0)(packs)),
        ("flat", PackCollator(pad_id=0, flatten=True)(packs)),
    ):
        with torch.no_grad():
            out = model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                output_router_logits=True,
                use_cache=False,
            )
        losses[name] = load_balancing_loss_func(out.router_logits, 4, 2, batch["padding_mask"])
        losses[name + " unmasked"] = load_balancing_loss_func(out.router_logits, 4, 2, None)
    assert abs(float(losses["padded"]) - float(losses["flat"])) <= 1e-5
    assert abs(float(losses["padded unmasked"]) - float(losses["flat"])) > 1e-4
