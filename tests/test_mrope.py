"""mRoPE positions and token types from the reader equal transformers' own ``get_rope_index`` of the real
Qwen2-VL, Qwen2.5-VL and Qwen3-VL model classes, run on each sub-sample alone (models built from the real
config files on the meta device: no weights). And grids of EXIF-rotated JPEGs equal the image processor's."""

from __future__ import annotations

import importlib.util
import io
import json

import numpy as np
import pytest
from conftest import needs, write_tar
from pack_helpers import MODELS, pack_shards, rotated_samples

from pack_assets.core.demo import make_demo, video_bytes
from pack_assets.reader import PackEncoder, mrope_positions

needs_torch = needs(importlib.util.find_spec("torch") is None, "torch is not installed (pip install -e '.[train]')")

CONFIGS = {"qwen2-vl": None, "qwen2.5-vl": "Qwen2.5-VL-7B-Instruct", "qwen3-vl": "Qwen3-VL-8B-Instruct"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Text, one to six images, videos, one to three turns (the demo set), plus EXIF-rotated JPEGs."""
    root = tmp_path_factory.mktemp("mrope") / "in"
    make_demo(root, n_shards=1, per_shard=60, seed=7)
    write_tar(root / "rot-00000.tar", rotated_samples())
    # odd frame rates: Qwen2.5-VL's seconds per grid is not a round number, so the float32 truncation counts
    videos = []
    for i, (frames, w, h, fps) in enumerate([(25, 64, 48, 7), (40, 96, 64, 9), (13, 64, 64, 5), (31, 80, 48, 11)]):
        rec = {"conversations": [{"from": "human", "value": "<video>\nWhat moves?"},
                                 {"from": "gpt", "value": "Stripes."}, {"from": "human", "value": "And then?"},
                                 {"from": "gpt", "value": "They move on."}],
               "video": "mp4"}
        videos += [(f"v{i:03d}.json", json.dumps(rec)), (f"v{i:03d}.mp4", video_bytes(frames, w, h, fps, seed=i))]
    write_tar(root / "vid-00000.tar", videos)
    return root


def _model(profile: str):
    """The real model class on the meta device: get_rope_index needs only its config."""
    import torch
    from transformers import AutoConfig, Qwen2VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cls = {"qwen2-vl": Qwen2VLModel, "qwen2.5-vl": Qwen2_5_VLModel, "qwen3-vl": Qwen3VLModel}[profile]
    # Qwen2-VL: no config.json in the fixtures; transformers' defaults (spatial_merge_size 2) are the 7B's
    cfg = Qwen2VLConfig() if CONFIGS[profile] is None else AutoConfig.from_pretrained(MODELS / CONFIGS[profile])
    with torch.device("meta"):
        return cls(cfg)


def _reference(model, sub: dict, family: str) -> tuple[np.ndarray, np.ndarray]:
    """transformers for one sub-sample: token types the processor's way, then get_rope_index."""
    import torch

    cfg = model.config
    ids = np.asarray(sub["input_ids"])
    types = np.zeros_like(ids)
    types[np.isin(ids, [cfg.image_token_id])] = 1  # ProcessorMixin.create_mm_token_type_ids
    types[np.isin(ids, [cfg.video_token_id])] = 2
    kw = {"image_grid_thw": torch.tensor(sub["image_grid_thw"]) if sub["image_grid_thw"] else None,
          "video_grid_thw": torch.tensor(sub["video_grid_thw"]) if sub["video_grid_thw"] else None}
    if family == "qwen2.5-vl" and sub["video_grid_thw"]:
        kw["second_per_grid_ts"] = torch.tensor(sub["second_per_grid_ts"])  # float32, as the processor returns it
    pos, _ = model.get_rope_index(torch.tensor(ids)[None], torch.tensor(types)[None], **kw)
    return types, pos[:, 0].numpy()


@needs_torch
@pytest.mark.parametrize("profile", list(CONFIGS))
def test_rope_positions_equal_transformers_get_rope_index_per_sub_sample(shards, tmp_path, profile):
    model, enc = _model(profile), PackEncoder(profile)
    packs = pack_shards(shards, tmp_path, profile, max_len=6144)
    seen = {"packs": 0, "subs": 0, "image": 0, "video": 0, "multi_turn": 0, "vision_runs_in_pack": 0, "odd_seconds": 0}
    for pack in packs:
        res = enc.encode(pack)
        cu, rope = res["cu_seqlens"], res["rope_position_ids"]
        assert rope.dtype == np.int64 and rope.shape == (3, len(res["input_ids"]))
        for i, s in enumerate(pack["samples"]):
            sub = enc.encode_sample(s["messages"], s["media"])
            types, expected = _reference(model, sub, profile)
            assert (res["input_ids"][cu[i]:cu[i + 1]] == sub["input_ids"]).all()
            assert (res["mm_token_type_ids"][cu[i]:cu[i + 1]] == types).all()
            np.testing.assert_array_equal(rope[:, cu[i]:cu[i + 1]], expected)
            assert res["image_grid_thw"][i] == sub["image_grid_thw"]
            assert len(res["images"][i]) == len(sub["image_grid_thw"])
            assert len(res["videos"][i]) == len(sub["video_grid_thw"])
            assert len(res["second_per_grid_ts"][i]) == (0 if profile == "qwen3-vl" else len(sub["video_grid_thw"]))
            seen["odd_seconds"] += any(sec * 2 % 1 for sec in sub["second_per_grid_ts"])
            seen["subs"] += 1
            seen["image"] += bool(sub["image_grid_thw"])
            seen["video"] += bool(sub["video_grid_thw"])
            seen["multi_turn"] += sum(m["role"] == "assistant" for m in s["messages"]) > 1
        seen["packs"] += 1
        seen["vision_runs_in_pack"] += (res["mm_token_type_ids"] > 0).any() and len(pack["samples"]) > 1
    assert seen["packs"] >= 6 and seen["subs"] >= 60, seen
    assert min(seen["image"], seen["video"], seen["multi_turn"], seen["vision_runs_in_pack"]) >= 3, seen
    assert seen["odd_seconds"] >= (2 if profile != "qwen3-vl" else 0), seen


def test_mrope_positions_by_hand():
    # text 2, a 1x4x6 image (2x3 after the 2x2 merge), text 1: text resumes at start + max(2, 3)
    types = np.array([0, 0] + [1] * 6 + [0])
    pos = mrope_positions(types, [((1, 4, 6), 1.0)], [], 2)
    assert pos[:, :2].tolist() == [[0, 1]] * 3
    assert pos[:, 2:8].tolist() == [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    assert pos[:, 8].tolist() == [5, 5, 5]
    # a video of 3 temporal groups, 1x1 after the merge, 0.5 s per group at 2 tokens per second (interval 1.0 → 0,1,2),
    # and at 25 tokens/s with 1/3 s per group: floor(k * 8.333...) in float32
    assert mrope_positions(np.array([2, 2, 2]), [], [((3, 2, 2), 1.0)], 2)[0].tolist() == [0, 1, 2]
    assert mrope_positions(np.array([2, 2, 2]), [], [((3, 2, 2), 25 / 3)], 2)[0].tolist() == [0, 8, 16]
    with pytest.raises(ValueError, match="vision tokens"):
        mrope_positions(np.array([1, 1]), [((1, 4, 6), 1.0)], [], 2)


@needs_torch
@pytest.mark.parametrize("profile", ["qwen2.5-vl", "qwen3-vl"])
def test_grids_of_exif_rotated_jpegs_equal_the_image_processor(tmp_path, profile):
    from PIL import Image
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil.from_pretrained(MODELS / CONFIGS[profile])
    write_tar(tmp_path / "in" / "rot.tar", rotated_samples())
    packs = pack_shards(tmp_path / "in", tmp_path, profile, max_len=4096)  # counts unchanged: encode checks them
    enc, turned = PackEncoder(profile), 0
    for pack in packs:
        res = enc.encode(pack)
        for grids, images in zip(res["image_grid_thw"], res["images"]):
            for grid, data in zip(grids, images):
                # the processor's path: load_image applies the EXIF orientation
                loaded = load_image(Image.open(io.BytesIO(data)))
                expected = proc(images=[loaded], return_tensors="np")["image_grid_thw"]
                assert list(grid) == expected[0].tolist()
                turned += Image.open(io.BytesIO(data)).getexif().get(0x0112, 1) >= 5 and grid[1] != grid[2]
    assert turned >= 4
