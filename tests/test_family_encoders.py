"""PackEncoder for InternVL, LLaVA-OneVision and Gemma 3 against each model's real processor on the fixture
checkpoint folders: the ids token for token (images tiled / anyres / fixed, EXIF-turned, videos sampled as
the folder's video processor config says), the token types the design promises and those the model reads,
the labels of the label policy, and iter_encoded over a packed folder. Needs the processors' torch +
torchvision (InternVL / LLaVA-OneVision build a video processor)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import needs, write_tar
from family_fixtures import VIDEOS, video_variant
from family_fixtures import processor as _processor
from pack_helpers import family_samples, pack_shards, processor_conversation, rotated_jpeg

pytestmark = needs(importlib.util.find_spec("torchvision") is None, "torchvision is not installed (extra `processor`)")

FAMILIES = ("internvl", "llava-onevision", "gemma3")
CLIP = (VIDEOS / "g40_80x60_ntsc.mov").read_bytes()  # 40 frames at 29.97 fps


@pytest.fixture(scope="module")
def dirs(family_models):
    return family_models


def _messages(kinds: list[str], system: bool = True) -> list[dict]:
    msgs = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}] if system else []
    return msgs + [
        {"role": "user", "content": [{"type": k} for k in kinds] + [{"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A thing."}]},
        {"role": "user", "content": [{"type": "text", "text": "More?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "No more."}]},
    ]


def _oracle(folder, messages, media) -> dict:
    proc = _processor(folder)
    conv, metas = processor_conversation(messages, media)
    kw = {"return_mm_token_type_ids": True, **({"video_metadata": metas} if metas else {})}
    out = proc.apply_chat_template(conv, tokenize=True, return_dict=True, processor_kwargs=kw)
    return {k: np.asarray(v[0]) for k, v in out.items() if k in ("input_ids", "mm_token_type_ids", "token_type_ids")}


_IMAGES = [("a.jpg", rotated_jpeg(80, 40, 6)), ("b.jpg", rotated_jpeg(36, 36, 3))]
_SHORT = (VIDEOS / "g7_32x320_10fps.webm").read_bytes()  # 7 frames: every frame is taken by default
_CASES = {
    "text": ([], []),
    "image": (["image"], _IMAGES[:1]),
    "images": (["image", "image"], _IMAGES),
    "video": (["video"], [("v.webm", _SHORT)]),
    "image+video": (["image", "video"], [_IMAGES[1], ("v.webm", _SHORT)]),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_and_token_types_are_the_processors(family, dirs):
    from pack_assets.reader import PackEncoder

    enc = PackEncoder(model_dir=str(dirs[family]))
    for name, (kinds, media) in _CASES.items():
        if "video" in name and family == "gemma3":
            continue
        got, want = enc.encode_sample(_messages(kinds), media), _oracle(dirs[family], _messages(kinds), media)
        ids, types = np.asarray(got["input_ids"]), got["mm_token_type_ids"]
        assert ids.tolist() == want["input_ids"].tolist(), name
        placeholder = ids == enc.tok.token_to_id(enc.profile.media.token)
        if family == "gemma3":  # what the processor returns and the model reads: 1 at <image_soft_token>
            assert np.array_equal(got["token_type_ids"], want["token_type_ids"]) and np.array_equal(
                types, want["token_type_ids"]
            )
        elif family == "llava-onevision":  # <image> 1, <video> 2, as the processor's
            assert np.array_equal(types, want["mm_token_type_ids"]), name
        else:  # the processor also marks <img> </img> and video frames 1; the contract: 1 at image, 2 at frame tokens
            assert np.array_equal(types > 0, placeholder) and np.array_equal(
                want["mm_token_type_ids"] > 0, placeholder | (want["mm_token_type_ids"] > 0)
            )
            frames = sum(got["video_frames"])
            assert (types == 2).sum() == frames * 256 and (types == 1).sum() == sum(got["image_tokens"])
        assert int((types > 0).sum()) == sum(got["image_tokens"]) + (
            (types == 2).sum() if family != "internvl" else sum(got["video_frames"]) * 256
        ), name


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("internvl", "num_frames_8"),
        ("internvl", "fps_2_no_shift"),
        ("llava-onevision", "fps_10"),
        ("llava-onevision", "num_frames_8"),
    ],
)
def test_videos_are_sampled_as_the_folder_video_config_says(family, config, dirs):
    from pack_assets.reader import PackEncoder

    folder = video_variant(dirs[family], family, config)
    got = PackEncoder(model_dir=str(folder)).encode_sample(_messages(["video"]), [("v.mov", CLIP)])
    assert got["input_ids"] == _oracle(folder, _messages(["video"]), [("v.mov", CLIP)])["input_ids"].tolist()
    assert 1 < got["video_frames"][0] < 40


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_train_the_assistant_turns_of_the_policy(family, dirs):
    from pack_assets.reader import PackEncoder

    enc = PackEncoder(model_dir=str(dirs[family]))
    end = "<end_of_turn>" if family == "gemma3" else "<|im_end|>"
    for policy, want in (("all", ["A thing." + end, "No more." + end]), ("last_turn", ["No more." + end])):
        out = enc.encode_sample(_messages(["image"]), _IMAGES[:1], policy)
        lab = np.asarray(out["labels"])
        assert np.array_equal(lab[lab != -100], np.asarray(out["input_ids"])[lab != -100])  # a label is its own token
        runs = np.split(np.flatnonzero(lab != -100), np.flatnonzero(np.diff(np.flatnonzero(lab != -100)) > 1) + 1)
        assert [enc.tok.decode(lab[r].tolist(), skip_special_tokens=False) for r in runs] == want


@pytest.mark.parametrize("family", ["internvl"])  # the other families' packs: test_packed_equals_unpacked.py
def test_iter_encoded_reads_a_packed_folder_with_model_dir(family, dirs, tmp_path):
    from pack_assets.core.counting.profiles import profile_from_model_dir
    from pack_assets.reader import iter_encoded

    write_tar(tmp_path / "in" / "f.tar", family_samples(videos=family != "gemma3"))
    packs = pack_shards(
        tmp_path / "in", tmp_path, profile_from_model_dir(dirs[family]), max_len=2400, out=tmp_path / "out"
    )
    encoded = list(iter_encoded(tmp_path / "out", model_dir=str(dirs[family])))  # raises on a length the plan lacks
    assert [e["pack_id"] for e in encoded] == [p["pack_id"] for p in packs] and len(encoded) >= 3
    for e in encoded:
        assert (
            e["family"] == family
            and len(e["input_ids"]) == len(e["labels"]) == len(e["position_ids"]) == e["cu_seqlens"][-1]
        )
        assert all(int(e["position_ids"][a]) == 0 for a in e["cu_seqlens"][:-1]) and "rope_position_ids" not in e


def test_a_processor_rule_folder_has_no_encoder(dirs, tmp_path):
    import json
    import shutil

    from pack_assets.reader import PackEncoder

    folder = tmp_path / "glm"
    shutil.copytree(dirs["gemma3"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "glm4v"}))
    with pytest.raises(ValueError, match="counted by its processor"):
        PackEncoder(model_dir=str(folder))


def test_gemma3_pan_and_scan_crops_are_encoded_and_collated_as_the_processor_makes_them(dirs, tmp_path):
    """A Gemma 3 folder with pan-and-scan on: the encoder writes the processor's "Here is the original image"
    text and a block per crop; the collator's pixels come from the processor called with the same settings
    (``processor_kwargs``), and without them its placeholder count differs from the pack's: refused."""
    import json
    import shutil

    from pack_assets.reader import PackCollator, PackEncoder

    folder = tmp_path / "gemma-pas"
    shutil.copytree(dirs["gemma3"], folder)
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**pre, "do_pan_and_scan": True}))
    media = [("wide.jpg", rotated_jpeg(900, 300, 1))]
    enc = PackEncoder(model_dir=str(folder))
    out = enc.encode_sample(_messages(["image"]), media)
    conv, _ = processor_conversation(_messages(["image"]), media)
    want = _processor(folder).apply_chat_template(
        conv, tokenize=True, return_dict=True, processor_kwargs={"do_pan_and_scan": True}
    )
    assert out["input_ids"] == want["input_ids"][0] and out["image_tokens"] == [256 * 4]  # the image and 3 crops
    ids = np.asarray(out["input_ids"])
    pack = {
        **out,
        "family": "gemma3",
        "input_ids": ids,
        "labels": np.asarray(out["labels"]),
        "cu_seqlens": np.array([0, len(ids)], np.int32),
        "position_ids": np.arange(len(ids)),
        "loss_weights": np.ones(len(ids), np.float32),
        **{k: [out[k]] for k in ("images", "videos", "visual_order")},
    }
    batch = PackCollator(_processor(folder), pad_id=0, processor_kwargs={"do_pan_and_scan": True})([pack])
    assert tuple(batch["pixel_values"].shape) == (4, 3, 896, 896)
    with pytest.raises(ValueError, match="placeholder tokens"):
        PackCollator(_processor(folder), pad_id=0)([pack])
