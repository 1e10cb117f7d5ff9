"""How many tokens an image or a video becomes, from its size (and a video's frames and fps) alone, for each
rule a profile can carry: Qwen-VL's ``smart_resize`` (images; videos by qwen-vl-utils' sampling or
transformers' Qwen3-VL sampler with its timestamps), GotOcr2 tiles (InternVL), LLaVA-OneVision's anyres grid,
Gemma 3's fixed count with pan-and-scan crops, and the frames InternVL's / LLaVA-OneVision's video processors
keep. Each is transformers' arithmetic, checked against the real processors in the tests."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..reasons import ReasonError
from .profiles import ImageRule, MediaRule, VideoRule


def _round(x: float, f: int) -> int:
    return round(x / f) * f


def smart_resize(height: int, width: int, rule: ImageRule) -> tuple[int, int]:
    """transformers' Qwen2-VL ``smart_resize`` (also used by Qwen3-VL images)."""
    f = rule.factor
    if max(height, width) / min(height, width) > 200:
        raise ReasonError("image_aspect_ratio", f"aspect ratio {max(height, width) / min(height, width):.1f} > 200")
    h_bar, w_bar = _round(height, f), _round(width, f)
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def image_tokens(width: int, height: int, rule: ImageRule) -> int:
    h, w = smart_resize(height, width, rule)
    return (h // rule.factor) * (w // rule.factor)


def image_grid(width: int, height: int, rule: ImageRule) -> tuple[int, int, int]:
    """image_grid_thw in patches, as the processor reports it."""
    h, w = smart_resize(height, width, rule)
    return 1, h // rule.patch_size, w // rule.patch_size


@functools.lru_cache(maxsize=4096)
def _tile_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """GotOcr2's ``get_optimal_tiled_canvas``: (columns, rows) of the closest aspect ratio; on a tie the grid
    with more tiles while the image covers more than half of it."""
    grids = sorted(((c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
                    if min_tiles <= c * r <= max_tiles), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for c, r in grids:
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and area > 0.5 * tile * tile * c * r:
            best = (c, r)
    return best


def _best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """transformers' ``select_best_resolution``: the canvas keeping most of the image, then wasting least."""
    best, max_eff, min_waste = pinpoints[0], 0, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        eff = min(int(width * scale) * int(height * scale), width * height)
        waste = pw * ph - eff
        if eff > max_eff or (eff == max_eff and waste < min_waste):
            best, max_eff, min_waste = (ph, pw), eff, waste
    return best


def _anyres_features(height: int, width: int, rule: MediaRule) -> int:
    """``LlavaOnevisionProcessor._get_number_of_features`` (base + unpadded grid + one newline per row)."""
    best_h, best_w = _best_resolution(height, width, rule.pinpoints)
    side = int(math.sqrt(rule.tokens))
    cur_h, cur_w = side * (best_h // rule.tile), side * (best_w // rule.tile)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= ((cur_h - new_h) // 2) * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= ((cur_w - new_w) // 2) * 2
    unpadded, newlines = cur_h * cur_w, cur_h
    ratio = math.sqrt(cur_h * cur_w / (rule.max_crops * side**2))
    if ratio > 1.1:
        unpadded, newlines = int(cur_h // ratio) * int(cur_w // ratio), int(cur_h // ratio)
    return unpadded + newlines + rule.tokens


def pan_and_scan_crops(width: int, height: int, min_crop: int, max_crops: int, min_ratio: float) -> int:
    """Gemma 3's crop count (transformers 5.23 ``Gemma3ImageProcessor[Pil].pan_and_scan``, the same arithmetic
    in both backends): crops along the long side only (a square counts as landscape), about one per aspect
    ratio unit (half rounds up), at least 2 and at most ``max_crops``, none below ``min_ratio`` or when a crop
    would be under ``min_crop`` px. Floats and floors as the processor does them, so boundaries agree. Only
    the long and short sides matter (the two branches mirror each other), so an EXIF 90° rotation cannot
    change the count: the header's stored size is as good as the rotated image's."""
    if width < 1 or height < 1:
        raise ReasonError("bad_image", f"image size {width}x{height}")
    long, short = (width, height) if width >= height else (height, width)
    if long / short < min_ratio:
        return 0
    n = min(int(math.floor(long / min_crop)), int(math.floor(long / short + 0.5)))
    n = min(max_crops, max(2, n))
    if min(int(math.ceil(long / n)), short) < min_crop:
        return 0
    return n


def media_crops(width: int, height: int, rule: MediaRule) -> int:
    """Extra images an image becomes (Gemma 3 pan-and-scan crops); 0 for every other rule."""
    return pan_and_scan_crops(width, height, *rule.crops) if rule.crops else 0


def media_image_tokens(width: int, height: int, n_images: int, rule: MediaRule) -> int:
    """Image tokens (the repeated token only, wrappers excluded) for one image of a sample with n_images."""
    if rule.kind == "fixed":
        return rule.tokens * (1 + media_crops(width, height, rule))
    if rule.kind == "tiles":
        cols, rows = (1, 1)
        if rule.max_tiles > 1:
            cols, rows = _tile_grid(height, width, rule.tile, rule.min_tiles, rule.max_tiles)
        n = cols * rows
        return rule.tokens * (n + 1 if n > 1 else 1)
    n = rule.tokens + 1 if n_images != 1 else _anyres_features(height, width, rule)
    return n - 1 if rule.drop_cls else n


@dataclass(frozen=True, slots=True)
class VideoCount:
    pad_tokens: int  # tokens that replace the one <|video_pad|>, timestamps excluded
    timestamps: tuple[str, ...]  # Qwen3-VL: one "<t seconds>" text per frame pair
    grid: tuple[int, int, int] = (0, 0, 0)  # video_grid_thw in patches (t, h, w), as the processor reports it
    frame_tokens: int = 0  # tokens per temporal group (after the spatial merge)


def _qvu_resize(height: int, width: int, f: int, min_pixels: int, max_pixels: float) -> tuple[int, int]:
    """qwen-vl-utils ``smart_resize`` (its own rounding, floor at one factor)."""
    if max(height, width) / min(height, width) > 200:
        raise ReasonError("video_aspect_ratio", f"aspect ratio {max(height, width) / min(height, width):.1f} > 200")
    h_bar = max(f, _round(height, f))
    w_bar = max(f, _round(width, f))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def video_count(meta: dict, rule: VideoRule) -> VideoCount:
    total, src_fps = int(meta["frames"]), float(meta.get("fps") or 24.0)
    height, width = int(meta["height"]), int(meta["width"])
    f, t = rule.factor, rule.temporal_patch_size
    if rule.sampler == "qwen-vl-utils":
        min_frames = math.ceil(rule.min_frames / t) * t
        max_frames = math.floor(min(rule.max_frames, total) / t) * t
        n = total / src_fps * rule.fps
        n = min(min(max(n, min_frames), max_frames), total)
        n = math.floor(n / t) * t
        if n < t:
            raise ReasonError("video_too_short", f"{total} frame(s): fewer than {t} to sample")
        max_pixels = max(min(rule.max_pixels, rule.total_pixels / n * t), int(rule.min_pixels * 1.05))
        h, w = _qvu_resize(height, width, f, rule.min_pixels, max_pixels)
        per = (h // f) * (w // f)
        return VideoCount((n // t) * per, (), (n // t, h // rule.patch_size, w // rule.patch_size), per)
    # transformers Qwen3VLVideoProcessor.sample_frames + video smart_resize + processor timestamps
    n = int(total / src_fps * rule.fps)
    n = min(max(n, rule.min_frames), rule.max_frames, total)
    if n < t:
        raise ReasonError("video_too_short", f"{total} frame(s): fewer than {t} to sample")
    if rule.frame_max_pixels and height * width > rule.frame_max_pixels:  # frames pre-resized (qwen-vl-utils)
        height, width = _qvu_resize(height, width, f, 0, rule.frame_max_pixels)
    if height < f or width < f:
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ReasonError("video_aspect_ratio", f"aspect ratio {max(height, width) / min(height, width):.1f} > 200")
    h_bar, w_bar, t_bar = _round(height, f), _round(width, f), _round(n, t)
    if t_bar * h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((n * height * width) / rule.max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif t_bar * h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (n * height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    grid_t = -(-n // t)
    frame_seqlen = (h_bar // f) * (w_bar // f)
    indices = np.linspace(0, total - 1, n).round().astype(int).tolist()
    if len(indices) % t:
        indices.extend(indices[-1] for _ in range(t - len(indices) % t))
    stamps = [idx / src_fps for idx in indices]
    pairs = [(stamps[i] + stamps[i + t - 1]) / 2 for i in range(0, len(stamps), t)]
    # each frame pair: "<t seconds>" + <|vision_start|> + frame_seqlen pads + <|vision_end|>
    return VideoCount(grid_t * (frame_seqlen + 2), tuple(f"<{p:.1f} seconds>" for p in pairs[:grid_t]),
                      (grid_t, h_bar // rule.patch_size, w_bar // rule.patch_size), frame_seqlen)


# ~9 h at 30 fps: a header claiming more is not believed. InternVL tokenizes a "FrameN: " label per frame (kept
# per worker), and such a video is millions of tokens for every family: over any max length.
_MAX_FRAMES = 1_000_000


def video_meta(meta: dict) -> tuple[int, float]:
    """(frames, the header's fps or 0) of a probed video; a malformed entry is a reason, not a crash."""
    try:
        # the header's average rate, as transformers' PyAV loader reports it; torchcodec (its default loader)
        # measures the decoded stream instead and can differ by a frame's duration (docs/usage.md)
        total, fps = int(meta["frames"]), float(meta.get("fps") or 0)
    except (KeyError, TypeError, ValueError) as e:
        raise ReasonError("bad_video", f"unreadable video metadata {meta!r}: {e}") from None
    if not 0 < total <= _MAX_FRAMES:
        raise ReasonError("bad_video", f"video metadata says {total} frames")
    return total, fps


def sampled_frames(meta: dict, rule: VideoRule) -> int:
    """Frames InternVL's / LLaVA-OneVision's video processor keeps of a video (see ``VideoRule``); what the
    processor refuses is a ``video_sampling`` reason."""
    total, src_fps = video_meta(meta)
    if rule.sampler == "all-frames":
        return total
    num, fps = rule.num_frames, rule.sample_fps
    if rule.sampler == "uniform" and num is not None and fps is not None:
        raise ReasonError("video_sampling", "num_frames and fps are both set: the processor takes one of them")
    if num is None and fps is not None:
        if not src_fps > 0:
            raise ReasonError("bad_video", f"video metadata has no frame rate to sample {fps} fps by")
        num = int(total / src_fps * fps)
        if rule.sampler == "uniform":
            num = max(1, num)
    if num is None:
        if rule.sampler == "uniform":
            return total
        raise ReasonError("video_sampling",
                          "do_sample_frames with neither num_frames nor fps: InternVL's sampler fails")
    if num <= 0:
        raise ReasonError("video_sampling", f"{total} frames at {src_fps:.3f} fps sample {num} frames")
    if num > total:
        raise ReasonError("video_sampling", f"{num} frames asked of a video of {total}")
    if rule.sampler == "uniform":
        return num
    step = total / num  # torch.arange(shift, T, step): its length is ceil((T - shift) / step), in doubles
    shift = step / 2 if rule.initial_shift is None else rule.initial_shift
    n = math.ceil((total - shift) / step)
    if n <= 0:
        raise ReasonError("video_sampling", f"initial_shift {shift} is past the video's {total} frames")
    return n
