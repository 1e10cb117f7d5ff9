"""Proof that packs train correctly: a tiny random Qwen2.5-VL / Qwen3-VL (real configs, shrunken; torch on
CPU, float32) gives the whole pack — block-diagonal attention by ``cu_seqlens``, ``rope_position_ids`` — the
same logits and per-token losses as each sub-sample run alone through transformers' own path (processor
pixels, the model's own ``get_rope_index``). With 1-D positions instead, the logits differ. And the loss
weightings (token, sample, sqrt) of a pack equal the same combination of the sub-samples' own losses.

Runs with the ``train`` extra (torch); with PACK_ASSETS_CI=1 a missing torch fails instead of skipping."""

from __future__ import annotations

import importlib.util
import io
import zlib

import numpy as np
import pytest
from conftest import needs, write_tar
from pack_helpers import MODELS, pack_shards, tiny_media_samples

pytestmark = needs(importlib.util.find_spec("torch") is None, "torch is not installed (pip install -e '.[train]')")

TOL = 1e-4
MAX_DIFF: dict[str, float] = {}  # the measured figures, printed at the end (pytest -s)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is several times faster than two on a shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed_equals") / "in"
    write_tar(root / "tiny.tar", tiny_media_samples(n=90))
    return root


def _processor(profile: str):
    from tiny_models import CHECKPOINTS
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil.from_pretrained(MODELS / CHECKPOINTS[profile])


def _video_pixels(patch: int):
    """Stand-in pixel_values_videos of the right shape, fixed by the video's bytes: the same in both runs."""
    import torch

    def pixels(data: bytes, grid) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(data))
        return torch.randn(int(np.prod(grid)), 3 * 2 * patch * patch, generator=g)
    return pixels


def _alone(model, vocab, proc, video_pixels, res: dict, i: int):
    """Sub-sample ``i`` of an encoded pack through transformers' own path: token types as the processor
    makes them, pixels from the image processor, no mask, no positions (the model's own get_rope_index)."""
    import torch
    from PIL import Image
    from transformers.image_utils import load_image

    a, b = res["cu_seqlens"][i], res["cu_seqlens"][i + 1]
    ids = res["input_ids"][a:b]
    cfg = model.config
    types = np.zeros_like(ids)
    types[ids == 151655], types[ids == 151656] = 1, 2  # <|image_pad|>, <|video_pad|>: create_mm_token_type_ids
    kw = {}
    if res["images"][i]:
        kw = dict(proc(images=[load_image(Image.open(io.BytesIO(d))) for d in res["images"][i]], return_tensors="pt"))
    if res["videos"][i]:
        grids = res["video_grid_thw"][i]
        kw["pixel_values_videos"] = torch.cat([video_pixels(d, g) for d, g in zip(res["videos"][i], grids)])
        kw["video_grid_thw"] = torch.tensor(grids)
        if res["second_per_grid_ts"][i]:
            kw["second_per_grid_ts"] = torch.tensor(res["second_per_grid_ts"][i])
    assert cfg.image_token_id == vocab.table[151655]
    with torch.no_grad():
        out = model(input_ids=vocab(ids[None]), mm_token_type_ids=torch.from_numpy(types[None]), use_cache=False, **kw)
    logits = out.logits[0]
    return logits, _token_losses(logits, vocab(res["labels"][a:b]))


def _token_losses(logits, labels):
    """Per label position j: cross-entropy of logits[j-1] against labels[j] (0 where ignored)."""
    import torch

    out = torch.zeros(len(labels))
    out[1:] = torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="none")
    return out


def _run(model, vocab, batch: dict, position_ids, mask):
    import torch

    kw = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
          if k in batch}
    with torch.no_grad():
        return model(input_ids=vocab(batch["input_ids"]), mm_token_type_ids=batch["mm_token_type_ids"],
                     position_ids=position_ids, attention_mask=mask, use_cache=False, **kw).logits


def _weighted(losses: np.ndarray, weights: np.ndarray) -> float:
    return float((losses * weights).sum() / weights.sum())


def _combined(sums: np.ndarray, counts: np.ndarray, mode: str) -> float:
    """The same weighting from each sub-sample's own summed loss and trainable-token count."""
    keep = counts > 0
    s, n = sums[keep], counts[keep]
    if mode == "token":
        return float(s.sum() / n.sum())
    if mode == "sample":
        return float(np.mean(s / n))
    return float((s / np.sqrt(n)).sum() / np.sqrt(n).sum())


def _check_pack(res: dict, logits: dict, ref_logits, ref_losses, vocab, weights: dict, profile: str) -> None:
    """Every variant's logits and per-token losses against the sub-samples alone; the weightings."""
    L = len(res["input_ids"])
    labels = vocab(res["labels"])
    for name in ("cu_seqlens mask", "4-row position_ids"):
        diff = float((logits[name][:L] - ref_logits).abs().max())
        loss = _token_losses(logits[name][:L], labels)
        ldiff = float((loss - ref_losses).abs().max())
        MAX_DIFF[f"{profile} {name} logits"] = max(MAX_DIFF.get(f"{profile} {name} logits", 0.0), diff)
        MAX_DIFF[f"{profile} {name} loss"] = max(MAX_DIFF.get(f"{profile} {name} loss", 0.0), ldiff)
        assert diff <= TOL and ldiff <= TOL, (name, diff, ldiff)
    cu = res["cu_seqlens"]
    packed_losses = _token_losses(logits["cu_seqlens mask"][:L], labels).double().numpy()
    sums = np.array([float(ref_losses[a:b].double().sum()) for a, b in zip(cu[:-1], cu[1:])])
    counts = np.array([int((res["labels"][a:b] != -100).sum()) for a, b in zip(cu[:-1], cu[1:])])
    for mode, w in weights.items():
        got, want = _weighted(packed_losses, w.astype(np.float64)), _combined(sums, counts, mode)
        MAX_DIFF[f"{profile} weighting {mode}"] = max(MAX_DIFF.get(f"{profile} weighting {mode}", 0.0), abs(got - want))
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (mode, got, want)


@pytest.mark.parametrize("profile", ["qwen2.5-vl", "qwen3-vl"])
def test_pack_logits_and_losses_equal_each_sub_sample_alone(shards, tmp_path, profile):
    import torch
    from tiny_models import tiny_model

    from pack_assets.reader import PackCollator, PackEncoder

    # Qwen3-VL counts fewer tokens per video: a smaller max_len keeps 20+ packs from the same samples
    packs = pack_shards(shards, tmp_path, profile, max_len={"qwen2.5-vl": 448, "qwen3-vl": 384}[profile])
    encoders = {m: PackEncoder(profile, loss_weighting=m) for m in ("token", "sample", "sqrt")}
    encoded = [encoders["token"].encode(p) for p in packs]
    pad = 151643
    model, vocab = tiny_model(profile, np.concatenate([r["input_ids"] for r in encoded] + [np.array([pad])]))
    proc, video_pixels = _processor(profile), _video_pixels(model.config.vision_config.patch_size)
    collate = PackCollator(proc, pad_id=pad, block_mask=True, video_pixels=video_pixels)
    checked, one_d, kinds = 0, [], {1: 0, 2: 0}
    for k in range(0, len(encoded), 2):  # two packs a batch: the collator's padding is in the test too
        group, batch = encoded[k:k + 2], collate(encoded[k:k + 2])
        runs = {"cu_seqlens mask": _run(model, vocab, batch, batch["rope_position_ids"], batch["attention_mask"]),
                "4-row position_ids": _run(model, vocab, batch, batch["position_ids"], None),
                # the counter-check: the same block mask with the 1-D positions
                "1-D": _run(model, vocab, batch, batch["position_ids"][0], batch["attention_mask"])}
        for row, (res, pack) in enumerate(zip(group, packs[k:k + 2])):
            alone = [_alone(model, vocab, proc, video_pixels, res, i) for i in range(len(res["cu_seqlens"]) - 1)]
            ref_logits, ref_losses = torch.cat([a[0] for a in alone]), torch.cat([a[1] for a in alone])
            weights = {m: e.encode(pack)["loss_weights"] for m, e in encoders.items()}
            _check_pack(res, {n: r[row] for n, r in runs.items() if n != "1-D"}, ref_logits, ref_losses, vocab, weights,
                        profile)
            if (res["mm_token_type_ids"] > 0).any():  # 1-D positions differ from mRoPE only around vision tokens
                one_d.append(float((runs["1-D"][row][:len(res["input_ids"])] - ref_logits).abs().max()))
            checked += 1
            for kind in kinds:
                kinds[kind] += bool((res["mm_token_type_ids"] == kind).any())
    MAX_DIFF[f"{profile} 1-D positions, smallest logits diff over packs with media"] = min(one_d)
    print(f"\n{profile}: {checked} packs ({kinds[1]} with images, {kinds[2]} with videos)",
          {k: f"{v:.2e}" for k, v in MAX_DIFF.items() if k.startswith(profile)})
    assert checked >= 20 and len(one_d) >= 10 and min(kinds.values()) >= 3, (checked, kinds)
    assert min(one_d) > 100 * TOL  # the failure it prevents: 1-D positions give other logits


# --- InternVL, LLaVA-OneVision, Gemma 3 (1-D positions; the checkpoint folders of tests/fixtures/models) ---

_FAMILY_MAX_LEN = {"internvl": 1600, "llava-onevision": 2400, "gemma3": 700}
_PIXEL_KEYS = ("pixel_values", "image_sizes", "batch_num_images", "pixel_values_videos")


def _family_alone(model, vocab, proc, sample: dict, ids: np.ndarray):
    """One sub-sample through the processor's own path (apply_chat_template with its media) and the model,
    no positions, no mask; its ids must be the encoder's."""
    import torch
    from pack_helpers import processor_conversation

    conv, metas = processor_conversation(sample["messages"], sample["media"])
    kw = {"video_metadata": metas} if metas else {}
    res = proc.apply_chat_template(conv, tokenize=True, return_dict=True, return_tensors="pt", processor_kwargs=kw)
    assert res["input_ids"][0].tolist() == ids.tolist()  # the encoder's ids are the processor's, token for token
    inputs = {k: v for k, v in res.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    with torch.no_grad():
        return model(input_ids=vocab(res["input_ids"]), use_cache=False, **inputs).logits[0]


@pytest.mark.parametrize("family", ["internvl", "llava-onevision", "gemma3"])
def test_family_pack_logits_equal_each_sub_sample_alone(family, family_models, tmp_path):
    """Packs of text, images (one tiled 2:1) and videos, two a batch (the collator's padding included): the
    packed forward (1-D restarting positions, no mask; Gemma 3 the mask dict of masks.attention_mask) gives
    each sub-sample the logits it gets alone through the processor and the model."""
    import torch
    from family_fixtures import processor
    from pack_helpers import family_samples
    from tiny_models import tiny_family_model

    from pack_assets.core.counting.profiles import profile_from_model_dir
    from pack_assets.reader import PackCollator, PackEncoder, attention_mask

    folder = family_models[family]
    write_tar(tmp_path / "in" / "f.tar", family_samples(videos=family != "gemma3"))
    profile = profile_from_model_dir(folder)
    packs = pack_shards(tmp_path / "in", tmp_path, profile, max_len=_FAMILY_MAX_LEN[family])
    encoded = [PackEncoder(profile).encode(p) for p in packs]
    proc = processor(folder)
    pad = proc.tokenizer.pad_token_id
    model, vocab = tiny_family_model(folder, np.concatenate([r["input_ids"] for r in encoded] + [np.array([pad])]))
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    collate, worst, kinds, own = PackCollator(proc, pad_id=pad), 0.0, {1: 0, 2: 0}, []
    for k in range(0, len(encoded), 2):
        group, batch = encoded[k:k + 2], collate(encoded[k:k + 2])
        kw = {key: batch[key] for key in _PIXEL_KEYS if key in batch}
        mask = attention_mask(batch, sliding_window=window) if family == "gemma3" else None
        with torch.no_grad():
            logits = model(input_ids=vocab(batch["input_ids"]), position_ids=batch["position_ids"], attention_mask=mask,
                           use_cache=False, **kw).logits
            if family == "gemma3":  # transformers' own mask from token_type_ids and the restarting positions
                own_logits = model(
                    input_ids=vocab(batch["input_ids"]),
                    position_ids=batch["position_ids"],
                    use_cache=False,
                    token_type_ids=batch["token_type_ids"],
                    **kw,
                ).logits
        for row, (res, pack) in enumerate(zip(group, packs[k : k + 2])):
            cu = res["cu_seqlens"]
            for i, sample in enumerate(pack["samples"]):
                ref = _family_alone(model, vocab, proc, sample, res["input_ids"][cu[i] : cu[i + 1]])
                worst = max(worst, float((logits[row, cu[i] : cu[i + 1]] - ref).abs().max()))
            for kind in kinds:
                kinds[kind] += bool((res["mm_token_type_ids"] == kind).any())
            if family == "gemma3":  # equal where transformers' own mask is right
                own.append(float((own_logits[row, : cu[-1]] - logits[row, : cu[-1]]).abs().max()))
    MAX_DIFF[f"{family} packed logits"] = worst
    if own:  # transformers 5.24 misplaces the image blocks in the sliding layers (masks.py): if this fails, it
        # no longer does, and Gemma 3 packs need no mask of ours (docs/training.md says why it is there)
        print(f"{family}: transformers' own mask, largest diff over the packs {max(own):.2e}")
        assert max(own) > 100 * TOL, own
    print(f"\n{family}: {len(encoded)} packs ({kinds[1]} with images, {kinds[2]} with videos), max diff {worst:.2e}")
    assert worst <= TOL
    assert len(encoded) >= 4 and kinds[1] >= 2 and (kinds[2] >= 1 or family == "gemma3"), kinds
