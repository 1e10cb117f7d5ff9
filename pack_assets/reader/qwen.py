"""Qwen2/2.5/3-VL sub-samples: pads expanded to their real counts (Qwen3-VL videos with their per-frame-pair
timestamps), the grids the processor reports, and the mRoPE positions of ``get_rope_index``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from ._core import ModelProfile, TokenCounter, image_grid, probe_image, probe_video, video_count
from .samples import split_media, tokens_and_trainable

_PAD_NAMES = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


class QwenSamples:
    """Encodes one sub-sample for a Qwen-VL profile (``encode``); the pack keys it adds are
    ``rope_position_ids``, ``image_grid_thw``, ``video_grid_thw`` and ``second_per_grid_ts``."""

    family_kind = "qwen"

    def __init__(self, profile: ModelProfile, tok):
        self.profile, self.tok = profile, tok
        self.tokens_per_second = np.float32(_tokens_per_second(profile))  # Qwen2.5-VL's video time scale
        self.image_pad, self.video_pad, self.vision_start, self.vision_end = (tok.token_to_id(t) for t in _PAD_NAMES)

    def encode(self, counter: TokenCounter, messages: list[dict], media: list[tuple[str, bytes]], policy: str,
               carried: int = 0) -> dict:
        text = counter.render(messages)
        text_ids, trainable = tokens_and_trainable(self.tok, text, policy, carried=carried)
        images, videos = split_media(media)
        image_grids = [image_grid(*probe_image(data), self.profile.image) for data in images]
        metas = [probe_video(io.BytesIO(data)) for data in videos]
        vcounts = [video_count(v, self.profile.video) for v in metas]
        merge = self.profile.image.merge_size ** 2
        ids: list[int] = []
        labels: list[int] = []
        it_img, it_vid = iter(image_grids), iter(vcounts)
        for tid, train in zip(text_ids, trainable):
            if tid == self.image_pad:
                t, h, w = next(it_img)
                ids += [self.image_pad] * (t * h * w // merge)
                labels += [-100] * (t * h * w // merge)
            elif tid == self.video_pad:
                block = self._video_block(next(it_vid))
                ids += block
                labels += [-100] * len(block)
            else:
                ids.append(tid)
                labels.append(tid if train else -100)
        # Qwen3-VL places frames by their timestamps instead; its processor returns no second_per_grid_ts
        seconds = ([] if self.profile.family == "qwen3-vl" else
                   [_seconds_per_grid(m, v, self.profile.video) for m, v in zip(metas, vcounts)])
        out = {"input_ids": ids, "labels": labels, "image_grid_thw": image_grids,
               "video_grid_thw": [v.grid for v in vcounts], "second_per_grid_ts": seconds,
               "images": images, "videos": videos, "visual_order": _order(text_ids, self.image_pad, self.video_pad)}
        out["mm_token_type_ids"], out["rope_position_ids"] = self._mrope(out)
        return out

    def _mrope(self, s: dict) -> tuple[np.ndarray, np.ndarray]:
        """Token types and mRoPE positions of one sub-sample, the way each family's get_rope_index makes them."""
        ids = np.asarray(s["input_ids"], dtype=np.int64)
        types = np.zeros(len(ids), np.int64)
        types[ids == self.image_pad], types[ids == self.video_pad] = 1, 2
        family = self.profile.family
        if family == "qwen3-vl":  # timestamps split each video into one block per frame pair, t=1 each
            videos = [((1, h, w), 1.0) for t, h, w in s["video_grid_thw"] for _ in range(t)]
        elif family == "qwen2.5-vl":  # absolute time: tokens_per_second * seconds per grid, in float32 as torch
            videos = [
                (g, self.tokens_per_second * np.float32(sec))
                for g, sec in zip(s["video_grid_thw"], s["second_per_grid_ts"])
            ]
        else:
            videos = [(g, 1.0) for g in s["video_grid_thw"]]
        images = [(g, 1.0) for g in s["image_grid_thw"]]
        return types, mrope_positions(types, images, videos, self.profile.image.merge_size)

    def _video_block(self, v) -> list[int]:
        """What replaces one <|video_pad|>: the pads alone (Qwen2/2.5-VL), or for Qwen3-VL per frame pair
        "<t seconds>" + <|vision_start|> + pads + <|vision_end|> (the template's own start/end stay around)."""
        if not v.timestamps:
            return [self.video_pad] * v.pad_tokens
        out: list[int] = []
        for stamp in v.timestamps:
            out += self.tok.encode(stamp, add_special_tokens=False).ids
            out += [self.vision_start] + [self.video_pad] * v.frame_tokens + [self.vision_end]
        return out


def _order(ids: list[int], image: int, video: int) -> list[str]:
    """ "image" / "video" for each placeholder of the rendered text, in order."""
    return ["image" if t == image else "video" for t in ids if t in (image, video)]


def _seconds_per_grid(meta: dict, v, rule) -> float:
    """Qwen2/2.5-VL ``second_per_grid_ts`` of one video: temporal_patch_size / sampled fps, where the sampled
    fps is sampled frames / total frames * source fps (qwen-vl-utils and transformers' ``sampled_fps``)."""
    total, src_fps = int(meta["frames"]), float(meta.get("fps") or 24.0)
    return rule.temporal_patch_size / (v.grid[0] * rule.temporal_patch_size / total * src_fps)


def _tokens_per_second(profile: ModelProfile) -> int:
    """Qwen2.5-VL's ``vision_config.tokens_per_second`` (2 in every released checkpoint)."""
    cfg = Path(profile.model_dir) / "config.json" if profile.model_dir else None
    if cfg is not None and cfg.exists():
        return int(json.loads(cfg.read_text(encoding="utf-8")).get("vision_config", {}).get("tokens_per_second", 2))
    return 2


def mrope_positions(types: np.ndarray, images: list, videos: list, merge: int) -> np.ndarray:
    """(3, L) int64 mRoPE positions for one sequence, transformers' ``get_rope_index`` in numpy.

    ``types``: 0 text, 1 image, 2 video per token; ``images`` / ``videos``: ((t, h, w) in patches, time
    interval) per run of vision tokens, in order. Text advances all three axes by one per token; a vision
    run gets (start + floor(frame * interval), start + row, start + column) and the next token starts at
    start + max(rows, columns)."""
    out = np.empty((3, len(types)), np.int64)
    grids = {1: iter(images), 2: iter(videos)}
    edges = np.flatnonzero(np.diff(types)) + 1
    pos = 0
    for a, b in zip(np.concatenate([[0], edges]), np.concatenate([edges, [len(types)]])):
        kind = int(types[a])
        if kind == 0:
            out[:, a:b] = np.arange(b - a) + pos
            pos += int(b - a)
            continue
        (t, h, w), interval = next(grids[kind])
        h, w = h // merge, w // merge
        if t * h * w != b - a:
            raise ValueError(f"{b - a} vision tokens for a grid of {t}x{h}x{w} after the merge")
        # torch: (arange(t) * interval).long(), in float32 and truncated
        frames = (np.arange(t, dtype=np.float32) * np.float32(interval)).astype(np.int64)
        out[0, a:b] = np.repeat(frames, h * w) + pos
        out[1, a:b] = np.tile(np.repeat(np.arange(h), w), t) + pos
        out[2, a:b] = np.tile(np.arange(w), t * h) + pos
        pos += max(h, w)
    return out
