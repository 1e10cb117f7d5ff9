"""Hybrid linear-attention models (Qwen3.5 / Qwen3-Next Gated DeltaNet): their linear layers keep sub-samples
apart only when the kernels get the boundaries, ``cu_seq_lens_q`` (the delta rule) AND ``seq_idx`` (the
causal convolution); restarting ``position_ids`` reach neither. ``PackCollator(flatten=True)`` emits them
exactly as transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)``
does. The real kernels (flash-linear-attention, causal-conv1d) need a GPU; transformers 5.24's CPU fallbacks
refuse both keys (``integrations/hub_kernels.py``): shown here. The packed = alone proof on CPU runs on
TEST-SIDE PATCHES of those two fallbacks that honour the boundaries by calling the original per segment:
it proves the emitted keys reach both kernels and suffice, not the kernels themselves."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from conftest import needs, write_tar
from pack_helpers import pack_shards

pytestmark = needs(importlib.util.find_spec("torch") is None, "torch is not installed (pip install -e '.[train]')")
TOL = 1e-4
_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """Encoded Qwen3-VL packs of text samples of one to three turns (several sub-samples a pack)."""
    from pack_assets.reader import PackEncoder

    root = tmp_path_factory.mktemp("hybrid")
    members = []
    for i in range(14):
        msgs = []
        for t in range(1 + i % 3):
            msgs += [{"role": "user", "content": f"Question {i}.{t}: " + "word " * (3 + 5 * ((i + t) % 4))},
                     {"role": "assistant", "content": f"Answer {i}.{t} " + "yes " * (2 + i % 5)}]
        members.append((f"h{i:03d}.json", json.dumps({"messages": msgs})))
    write_tar(root / "in" / "h.tar", members)
    packs = pack_shards(root / "in", root, "qwen3-vl", max_len=200)
    enc = PackEncoder("qwen3-vl")
    return [enc.encode(p) for p in packs]


def test_flattened_batch_is_what_data_collator_with_flattening_emits(encoded):
    from transformers import DataCollatorWithFlattening

    from pack_assets.reader import PackCollator

    group = encoded[:3]
    ours = PackCollator(flatten=True)(group)
    subs = [{"input_ids": p["input_ids"][a:b].tolist(), "labels": p["labels"][a:b].tolist()}
            for p in group for a, b in zip(p["cu_seqlens"][:-1], p["cu_seqlens"][1:])]
    assert len(subs) > len(group)  # packs of several sub-samples
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(subs, return_tensors="pt")
    for key in ("input_ids", "labels", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx"):
        assert ours[key].dtype == theirs[key].dtype and ours[key].tolist() == theirs[key].tolist(), key
    assert ours["position_ids"][0].tolist() == theirs["position_ids"].tolist()  # the 1-D row of Qwen-VL's four
    assert (ours["max_length_q"], ours["max_length_k"]) == (theirs["max_length_q"], theirs["max_length_k"])
    assert ours["padding_mask"].all() and ours["input_ids"].shape == (1, sum(len(p["input_ids"]) for p in group))


def _tiny_qwen35(vocab_size: int):
    import torch
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    cfg = Qwen3_5TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
                            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                            initializer_range=0.3, layer_types=["linear_attention"] * 3 + ["full_attention"])
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()


def _boundary_aware_fallbacks(monkeypatch):
    """TEST-SIDE PATCH: Qwen3.5's torch fallbacks of the delta rule and the causal conv1d, run per segment of
    ``cu_seqlens`` / ``seq_idx`` (the originals, unwrapped, never see the boundaries)."""
    import torch
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen35

    chunk0, conv0 = qwen35.torch_chunk_gated_delta_rule.__wrapped__, qwen35.causal_conv1d_fn.__wrapped__

    def chunk(q, k, v, g, beta, cu_seqlens=None, **kw):
        if cu_seqlens is None:
            return chunk0(q, k, v, g=g, beta=beta, **kw)
        cuts = zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())
        return torch.cat(
            [chunk0(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b], **kw)[0] for a, b in cuts], 1
        ), None

    def conv(x, weight, bias=None, activation=None, seq_idx=None, **kw):
        if seq_idx is None:
            return conv0(x, weight, bias, activation=activation)
        ids = seq_idx[0]
        cuts = torch.nonzero(torch.diff(ids, prepend=ids[:1] - 1)).flatten().tolist() + [x.shape[-1]]
        return torch.cat(
            [conv0(x[..., a:b], weight, bias, activation=activation) for a, b in zip(cuts[:-1], cuts[1:])], -1
        )

    monkeypatch.setattr(qwen35, "torch_chunk_gated_delta_rule", chunk)
    monkeypatch.setattr(qwen35, "causal_conv1d_fn", conv)


def test_hybrid_cpu_fallbacks_refuse_boundaries_and_positions_alone_leak(encoded):
    """What blocks the real proof on CPU, and why the keys are needed at all."""
    import torch
    from tiny_models import Vocab

    from pack_assets.reader import PackCollator

    batch = PackCollator(flatten=True)(encoded[:2])
    vocab = Vocab(batch["input_ids"].numpy(), [])
    model = _tiny_qwen35(vocab.size)
    ids, pos = vocab(batch["input_ids"]), batch["position_ids"][0]
    with torch.no_grad(), pytest.raises(ValueError, match="can't keep packed sequences apart"):
        model(input_ids=ids, position_ids=pos, use_cache=False, **{k: batch[k] for k in _KEYS})
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        cu = batch["cu_seq_lens_q"].tolist()
        alone = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(cu[:-1], cu[1:])])
    assert float((packed - alone).abs().max()) > 100 * TOL  # restarting positions alone: the state leaks


def test_hybrid_packed_equals_alone_with_boundary_aware_fallbacks(encoded, monkeypatch):
    """TEST-SIDE PATCHED fallbacks: with the collator's keys the packed logits are each sub-sample's own; with
    cu_seq_lens only (no seq_idx) they are not (the convolution leaks)."""
    import torch
    from tiny_models import Vocab

    from pack_assets.reader import PackCollator

    _boundary_aware_fallbacks(monkeypatch)
    batch = PackCollator(flatten=True)(encoded[:3])
    vocab = Vocab(batch["input_ids"].numpy(), [])
    model = _tiny_qwen35(vocab.size)
    ids, pos = vocab(batch["input_ids"]), batch["position_ids"][0]
    cu = batch["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        alone = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(cu[:-1], cu[1:])])
        packed = model(input_ids=ids, position_ids=pos, use_cache=False, **{k: batch[k] for k in _KEYS}).logits[0]
        no_seq_idx = model(input_ids=ids, position_ids=pos, use_cache=False, **{k: batch[k] for k in _KEYS[:4]}).logits[
            0
        ]
    assert len(cu) > 4 and float((packed - alone).abs().max()) <= TOL
    assert float((no_seq_idx - alone).abs().max()) > 100 * TOL
    np.testing.assert_array_equal(batch["seq_idx"][0].numpy(), np.repeat(np.arange(len(cu) - 1), np.diff(cu)))
