"""token_lengths stage: exact token counts for the target model, from headers and text only.

Two rules: ``fast`` (below; header-only, proven equal to the model's processor) and ``processor`` (a
--model-dir family without a fast rule: its own transformers processor, core/procount.py). Each row's
``counted_by`` says which.

total = len(tokenize(render(chat_template, messages))) + Σ(N_image − 1) + Σ(N_video − 1): the
conversation is rendered once with one pad placeholder per media item, then each placeholder grows to its
real token count. ``text_tokens`` excludes those placeholders (it keeps the vision start/end tokens).
A ``MediaRule`` family (InternVL, LLaVA-OneVision, Gemma 3) first has each placeholder written out as its
processor writes it, with one image token and the wrappers (``<img>``/``</img>``, Gemma's "\\n\\n" +
``<start_of_image>``/``<end_of_image>`` + "\\n\\n"), so the wrappers are tokenized in context.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import numpy as np
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from . import store
from .chunkcount import ChunkCounts, tokenizer_rule
from .profiles import ImageRule, MediaRule, ModelProfile, VideoRule, _tokenizer, fast_counter_for, tokenizer_for
from .reasons import ReasonError
from .records import TOKEN_LENGTHS_SCHEMA, Rejection
from .results import KEPT, FilePath

_BATCH = 512


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
        cols, rows = _tile_grid(height, width, rule.tile, rule.min_tiles, rule.max_tiles) if rule.max_tiles > 1 else (1, 1)
        n = cols * rows
        return rule.tokens * (n + 1 if n > 1 else 1)
    n = rule.tokens + 1 if n_images != 1 else _anyres_features(height, width, rule)
    return n - 1 if rule.drop_cls else n



def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of up to ``size`` items in order (itertools.batched from Python 3.12)."""
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch

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


def _video_meta(meta: dict) -> tuple[int, float]:
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
    total, src_fps = _video_meta(meta)
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
        raise ReasonError("video_sampling", "do_sample_frames with neither num_frames nor fps: InternVL's sampler fails")
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


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@functools.lru_cache(maxsize=8)  # compiled once per process, not per shard (~20 ms each): a Template renders reentrantly
def _template(source: str) -> jinja2.Template:
    return _environment().from_string(source)


def _environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers' ``apply_chat_template`` renders with."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _plain_lengths(tokenizer, texts: list[str]) -> list[int]:
    return [len(e) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


@functools.lru_cache(maxsize=8)  # one per tokenizer and worker process: every shard it counts shares the cache
def _chunk_counts(path: str, last_added_id: int) -> ChunkCounts | None:
    tok = _tokenizer(path, last_added_id)
    pattern, glue = tokenizer_rule(tok)
    return ChunkCounts(pattern, functools.partial(_plain_lengths, tok), glue) if pattern else None


class TokenCounter:
    """Counts for one profile; batches the tokenizer calls.

    Token counts come from tiktoken built from the profile's own tokenizer.json where that file is a plain
    byte-level BPE (the Qwen family): same ids as Hugging Face ``tokenizers`` (tested), several times
    faster (the chunk -> count cache is not used there). Any other tokenizer file, or a byte-level BPE with
    ``backend="tokenizers"``, is run by ``tokenizers`` itself, through the chunk -> count cache where its proof
    holds for that file (Gemma 3, byte-level BPE; core/chunkcount.py).
    """

    def __init__(self, profile: ModelProfile, backend: str = "auto", chunk_cache: bool = True):
        self.profile = profile
        self._processor = None
        self._use_chunks = chunk_cache  # False: every text through the tokenizer (benchmarks' "before")
        if profile.rule == "processor":  # the folder's own processor counts (core/procount.py)
            from .procount import processor_counter

            self._processor = processor_counter(profile)
            self.backend = "processor"
            return
        self.template = _template(profile.chat_template)
        # as transformers renders: the tokenizer's named tokens, then chat_template_kwargs over them
        self._variables = {**dict(profile.template_vars), **profile.template_kwargs}
        self.fast = fast_counter_for(profile) if backend in ("auto", "tiktoken") else None
        if backend == "tiktoken" and self.fast is None:
            raise ValueError(f"the tokenizer of {profile.name} cannot run on tiktoken")
        self.backend = "tiktoken" if self.fast is not None else "tokenizers"
        self._special_split: re.Pattern | None = None
        self._media_cache: dict[tuple[int, int, bool], int] = {}  # sizes repeat: hashing a MediaRule does not pay
        self._labels: list[int] = [0, 0]  # InternVL videos: [k] = tokens of "\nFrame2: " ... "\nFrame{k}: "
        self._first_label = 0  # tokens of "Frame1: " on its own

    @functools.cached_property
    def tokenizer(self):
        """The profile's ``tokenizers`` tokenizer, built on first use (a tiktoken counter never needs it)."""
        return tokenizer_for(self.profile)

    @functools.cached_property
    def chunks(self) -> ChunkCounts | None:
        """The chunk -> count cache (core/chunkcount.py) where its proof holds for this tokenizer, else None."""
        if self._processor is not None or self.fast is not None or not self._use_chunks:
            return None
        return _chunk_counts(self.profile.tokenizer_file, self.profile.last_added_id)

    def lengths(self, texts: list[str]) -> list[int]:
        if self.fast is not None:
            encode = self.fast.encode
            return [len(encode(self._nfc(t), allowed_special="all")) for t in texts]
        if self.chunks is not None:
            return self.chunks.lengths(texts)
        return _plain_lengths(self.tokenizer, texts)

    def _nfc(self, text: str) -> str:
        """NFC as HF applies it: after the added tokens are split off ("<|vision_end|>\u0338" must not
        compose '>' + U+0338 into '≯' and break the token)."""
        if unicodedata.is_normalized("NFC", text):
            return text
        if self._special_split is None:
            names = sorted(self.fast.special_tokens_set, key=len, reverse=True)
            self._special_split = re.compile("(" + "|".join(map(re.escape, names)) + ")")
        pieces = self._special_split.split(text)  # odd positions are the special tokens
        return "".join(p if i % 2 else unicodedata.normalize("NFC", p) for i, p in enumerate(pieces))

    def render(self, messages: list[dict], tools: list | None = None) -> str:
        if tools is None and messages and messages[0].get("tools"):
            tools = messages[0]["tools"]  # the record's tools ride on the first message (see conversation.py)
        return self.template.render(messages=messages, tools=tools, add_generation_prompt=False, **self._variables)

    def _expand(self, text: str, image_sizes) -> tuple[str, int, int]:
        """A media rule's text: each placeholder as the processor writes it with one image token per image
        block (its wrappers and, with Gemma 3 crops, its words tokenized in context); the image tokens of all
        images; how many image tokens the text holds."""
        rule = self.profile.media
        if text.count(rule.placeholder) != len(image_sizes):  # the processor would refuse the sample
            raise ReasonError("placeholder_mismatch", f"the template wrote {text.count(rule.placeholder)} "
                              f"{rule.placeholder} for {len(image_sizes)} image(s)")
        n = len(image_sizes)
        img = 0
        crops = []
        for w, h in image_sizes:
            key = (int(w), int(h), n == 1)  # the rule depends on the size and on one image or several
            got = self._media_cache.get(key)
            if got is None:
                if len(self._media_cache) >= 65536:  # bounded: a set of all-distinct sizes stays small
                    self._media_cache.clear()
                got = self._media_cache[key] = (media_image_tokens(int(w), int(h), n, rule),
                                                media_crops(int(w), int(h), rule))
            img += got[0]
            crops.append(got[1])
        block = rule.prefix + rule.token + rule.suffix
        if not any(crops):
            return (text.replace(rule.placeholder, block) if n else text), img, n
        # split, not replace: the replacement holds the placeholder (<start_of_image>) itself
        parts = text.split(rule.placeholder)
        out = [parts[0]]
        for k, part in zip(crops, parts[1:]):
            # Gemma3Processor.replace_image_token's text, one image token per block
            out += [f"Here is the original image {block} and here are some crops to help you see better "
                    + " ".join([block] * k) if k else block, part]
        return "".join(out), img, n + sum(crops)

    def _expand_videos(self, text: str, videos: list[dict]) -> tuple[str, int, int]:
        """A media rule's videos: (text, video tokens, tokens to add to the text's length). InternVL: each
        placeholder becomes its first frame, "Frame1: <img><IMG_CONTEXT></img>", tokenized in context (it
        touches the text before it); the rest is added: the other context tokens and frames 2..n, whose
        "\nFrame{i}: " sits between two special tokens, so its length is the same everywhere (cached).
        LLaVA-OneVision: the one <video> token stays and grows to n · frame_tokens + 1."""
        rule = self.profile.media
        if text.count(rule.video) != len(videos):
            raise ReasonError("placeholder_mismatch", f"the template wrote {text.count(rule.video)} {rule.video} "
                              f"for {len(videos)} video(s)")
        if not videos:
            return text, 0, 0
        frames = [sampled_frames(v, self.profile.video) for v in videos]
        if rule.kind == "anyres":
            return text, sum(n * rule.frame_tokens + 1 for n in frames), sum(n * rule.frame_tokens for n in frames)
        if len(set(frames)) > 1:  # InternVLProcessor stacks the videos of a sample into one tensor
            raise ReasonError("video_frames_differ", f"videos of {', '.join(map(str, frames))} frames in one sample")
        self._frame_labels(frames[0])
        per = rule.frame_tokens + 2  # the context tokens and <img> </img>
        # "Frame1: " counts in video_tokens on its own; the total takes it in context
        video = sum(self._first_label + self._labels[n] + n * per for n in frames)
        extra = sum(rule.frame_tokens - 1 + self._labels[n] + (n - 1) * per for n in frames)
        return text.replace(rule.video, f"Frame1: {rule.prefix}{rule.token}{rule.suffix}"), video, extra

    def _frame_labels(self, n: int) -> None:
        """Grow the cumulative label lengths to n frames."""
        if not self._first_label:
            self._first_label = self.lengths(["Frame1: "])[0]
        have = len(self._labels)
        if n >= have:
            more = self.lengths([f"\nFrame{i}: " for i in range(have, n + 1)])
            for k in more:
                self._labels.append(self._labels[-1] + k)

    def _vision(self, image_sizes, videos) -> tuple[int, int, list[VideoCount]]:
        if self.profile.media is not None:
            if videos and not self.profile.media.video:
                raise ReasonError("video_not_supported", f"{self.profile.family}: the model takes no video")
            return 0, len(image_sizes), []
        img = sum(image_tokens(w, h, self.profile.image) for w, h in image_sizes)
        vids = [video_count(v, self.profile.video) for v in videos]
        return img, len(image_sizes), vids

    def count_many(self, items: Iterable[tuple[list[dict], list, list]]) -> Iterator[dict | ReasonError]:
        """(messages, image_sizes [[w, h]], videos [meta]) -> counts, or a ReasonError, in input order."""
        if self._processor is not None:
            yield from self._processor.count_many(items)
            return
        for batch in batched(items, _BATCH):
            yield from self._count_batch(batch)

    def _count_batch(self, batch) -> list[dict | ReasonError]:
        prepared: list = []
        texts: list[str] = []
        for messages, image_sizes, videos in batch:
            media_video = None  # a media rule's (video tokens, tokens added to the text's length)
            try:
                img, n_img, vids = self._vision(image_sizes, videos)
                text = self.render(messages)
                if self.profile.media is not None:
                    text, img, n_img = self._expand(text, image_sizes)
                    media_video = (0, 0)
                    if self.profile.media.video:
                        text, *media_video = self._expand_videos(text, videos)
            except ReasonError as e:
                prepared.append(e)
                continue
            except jinja2.exceptions.TemplateError as e:
                prepared.append(ReasonError("template_error", str(e)))
                continue
            first = len(texts)
            texts.append(text)
            for v in vids:
                texts.extend(v.timestamps)
            prepared.append((first, len(texts), img, n_img, vids, media_video))
        lengths = self.lengths(texts) if texts else []
        out: list[dict | ReasonError] = []
        for p in prepared:
            if isinstance(p, ReasonError):
                out.append(p)
                continue
            first, end, img, n_img, vids, media_video = p
            rendered = lengths[first]
            if media_video is not None:  # one image token per image in the text; videos added whole
                video, extra = media_video
                text_tokens = rendered - n_img + extra - video
            else:
                stamps = sum(lengths[first + 1 : end])
                video = sum(v.pad_tokens for v in vids) + stamps
                text_tokens = rendered - n_img - len(vids)
            out.append(
                {
                    "text_tokens": text_tokens,
                    "image_tokens": img,
                    "video_tokens": video,
                    "total_tokens": text_tokens + img + video,
                    "counted_by": "fast",
                }
            )
        return out


def count_shard_rows(counter: TokenCounter, samples: Iterable[dict], media_bytes: dict[str, int]) -> tuple[list[dict], list[Rejection]]:
    """token_lengths rows for a shard's manifest rows (ok ones are counted; rejected ones are skipped)."""
    ok = [s for s in samples if s["status"] == "ok"]
    items = (
        (json.loads(s["conversation"]), s["image_sizes"] or [], json.loads(s["videos"] or "[]")) for s in ok
    )
    rows: list[dict] = []
    rejections: list[Rejection] = []
    for s, res in zip(ok, counter.count_many(items)):
        row = {
            "sample_id": s["sample_id"],
            "shard": s["shard"],
            "media_type": s["media_type"],
            "n_images": s["n_images"],
            "n_videos": s["n_videos"],
            "media_bytes": media_bytes.get(s["sample_id"], 0),
            "profile": counter.profile.name,
        }
        if isinstance(res, ReasonError):
            row.update(text_tokens=None, image_tokens=None, video_tokens=None, total_tokens=None, vision_tokens=None,
                       status="rejected", reason=res.reason, counted_by=counter.profile.rule)
            rejections.append(Rejection(s["shard"], s["key"], res.reason, res.detail, stage="token_lengths"))
        else:
            row.update(res, vision_tokens=res["image_tokens"] + res["video_tokens"], status="ok", reason=None)
        rows.append(row)
    return rows, rejections


# -- the stage: one shard's counts into <work>/token_lengths/<profile>/<shard>/, kept while current --------


@dataclass(frozen=True)
class ShardCounts:
    shard: str
    profile: str
    counted: int
    rejected: int
    total_tokens: int
    seconds: float
    cached: bool  # counted earlier from the same manifest and profile: kept


@dataclass(frozen=True)
class TokenLengthsSummary:
    shards: list[ShardCounts]
    profile: str
    profile_fingerprint: str
    folder: Path

    def as_metadata(self) -> dict:
        counted = sum(s.counted for s in self.shards)
        rejected = sum(s.rejected for s in self.shards)
        seconds = sum(s.seconds for s in self.shards)
        return {"dagster/row_count": counted + rejected, "profile": self.profile,
                "profile_fingerprint": self.profile_fingerprint, "counted": counted, "rejected": rejected,
                "total_tokens": sum(s.total_tokens for s in self.shards),
                "samples_per_second": round(counted / seconds, 1) if seconds else None,
                "dagster/uri": FilePath(self.folder), "dagster/column_schema": TOKEN_LENGTHS_SCHEMA}


# 2: token_lengths.parquet has `counted_by`; older counts are stale, so every file a view reads has the column
TOKEN_LENGTHS_FORMAT = 2


def _token_stamp(work: Path, shard: str, profile: ModelProfile) -> str:
    info = store.read_shard_info(work, shard) or {}
    return json.dumps({"profile": profile.fingerprint, "size": info.get("size"), "mtime_ns": info.get("mtime_ns"),
                       "format": TOKEN_LENGTHS_FORMAT})


def token_lengths_are_current(work: Path, shard: str, profile: ModelProfile) -> bool:
    stamp = store.token_dir(work, profile.name, shard) / "stamp.json"
    return stamp.exists() and stamp.read_text() == _token_stamp(work, shard, profile)


def run_token_lengths(work: Path, shard: str, profile: ModelProfile, force: bool = False) -> ShardCounts:
    """Count one shard for the profile; counts made from the same manifest and profile are kept."""
    with store.shard_lock(work, shard):  # the manifest read here and the stamp written last stay paired
        tdir = store.token_dir(work, profile.name, shard)
        if not force and token_lengths_are_current(work, shard, profile):
            t = store.read_parquet(tdir / "token_lengths.parquet", ["status", "total_tokens"]).to_pylist()
            ok = [r["total_tokens"] for r in t if r["status"] == "ok"]
            return ShardCounts(shard, profile.name, len(ok), len(t) - len(ok), int(sum(ok)), 0.0, cached=True)
        t0 = time.perf_counter()
        rows, rejections = count_shard_rows(TokenCounter(profile), *_manifest_rows(work, shard))
        store.write_token_lengths(work, profile.name, shard, rows, rejections)
        store.atomic_write_text(tdir / "stamp.json", _token_stamp(work, shard, profile))
    ok = [r["total_tokens"] for r in rows if r["status"] == "ok"]
    return ShardCounts(shard, profile.name, len(ok), len(rejections), int(sum(ok)),
                       round(time.perf_counter() - t0, 3), cached=False)


def _manifest_rows(work: Path, shard: str) -> tuple[list[dict], dict[str, int]]:
    """A shard's manifest rows and each sample's media bytes (what the planner fills output shards by)."""
    mdir = store.manifest_dir(work, shard)
    if not (mdir / "samples.parquet").exists():
        raise FileNotFoundError(f"no manifest for shard {shard!r} under {mdir}: materialize `manifest` first")
    samples = store.read_parquet(mdir / "samples.parquet").to_pylist()
    members = store.read_parquet(mdir / "members.parquet", ["sample_id", "name", "size"]).to_pylist()
    media_names = {s["sample_id"]: set(s["media_members"] or []) for s in samples}
    media_bytes: dict[str, int] = {}
    for m in members:
        if m["name"] in media_names.get(m["sample_id"], ()):
            media_bytes[m["sample_id"]] = media_bytes.get(m["sample_id"], 0) + m["size"]
    return samples, media_bytes


def run_token_counts(work: Path, shards: list[str], profile: ModelProfile, log: Callable[[str], None] | None = None,
                     by_helpers: Collection[str] = (), on_shard: Callable[[ShardCounts], None] | None = None
                     ) -> TokenLengthsSummary:
    """Count the shards one by one, a log line and an `on_shard` call each. `by_helpers`: as in
    `scan.run_manifests`."""
    counts = []
    for shard in shards:
        c = run_token_lengths(work, shard, profile)
        if log:
            log(f"{shard}: counted {c.counted} samples, {c.rejected} rejected, {c.total_tokens} tokens"
                f"{KEPT[shard in by_helpers] if c.cached else ''}")
        counts.append(c)
        if on_shard:
            on_shard(c)
    return TokenLengthsSummary(counts, profile.name, profile.fingerprint, store.token_dir(work, profile.name, shards[0]))
