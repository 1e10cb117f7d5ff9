"""The processor rule: counts from a checkpoint folder's own transformers processor, no weights.

A sample's length is ``len(input_ids)`` of the processor's chat path (render with its template and the
record's tools, then ``processor(text=..., images=..., add_special_tokens=False)``, as
``apply_chat_template(tokenize=True)`` does), so it is exact by construction.

Made fast without leaving the processor's own code. transformers' processors expand each placeholder with
the string ``replace_image_token(image_processor_output, i)`` returns, and that string depends on the image's
size alone (the pixels never decide a count). So, per distinct image size, the processor's own
``_process_images`` runs once on a blank image of that size and its replacement string is kept; per sample
the template is rendered once (transformers' ``render_jinja_template``), the processor's own
``get_text_with_replacements`` puts the kept strings in, and the tokenizer runs once, batched over many
samples. A run of one repeated media token (Gemma 3's 256 ``<image_soft_token>``) is tokenized as one and
the rest added back (each is an added token, split off before anything else); where the tokenizer is of a
shape core/counting/chunkcount.py proves (Gemma 3; the byte-level BPE of Qwen2/2.5/3-VL, InternVL3, LLaVA-OneVision),
the expanded texts are counted through its chunk -> count cache, each distinct chunk by the same tokenizer
call. The first sample that shows a new image size is also counted the slow way (the whole processor
call); if the two ever differ the counter falls back to the whole call for every sample, so an unusual
processor costs speed, never exactness.

Videos the same way: a video's replacement string depends on its metadata alone (frame count, fps, width,
height, duration; the manifest stores them, nothing is decoded). The processor's own ``_process_videos`` runs
once per distinct metadata on blank stride-0 frames ``(frames, 3, H, W)`` uint8 (torch, as torchcodec hands
a decoded file over) with a transformers ``VideoMetadata`` of those values, so its own frame sampling
(``do_sample_frames``, ``num_frames``, ``fps``)
decides the frames, and Qwen3-VL's timestamps come from the same fps and sampled indices (all in the key).
The whole call (``processor(..., videos=..., video_metadata=...)``) stays the reference: a sample whose set
of video keys is new is counted by it and compared. Missing or implausible metadata is ``bad_video`` (as for
the fast rules); what the processor refuses is ``processor_error`` with its message; a sample whose videos
would make the processor hold more than the memory budget (video_budget(): it materializes the frames it
keeps) is ``video_memory_budget``, before any call; without torchvision, ``missing_dependency``
(``NoVideo``).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable

from ..reasons import ReasonError
from .processors import NoVideo, load_processor
from .profiles import ModelProfile, ProfileError
from .tokens import batched
from .vision import video_meta

_CACHE_MAX = 4096  # video replacement strings kept (`_video_reps`, least recently used evicted)
_BATCH = 256  # samples per tokenizer call


@functools.lru_cache(maxsize=32)  # stand-ins for real images; big ones are big, keep few
def _blank(width: int, height: int):
    from PIL import Image

    return Image.new("RGB", (width, height))


class ProcessorCounter:
    """``count_many`` of the processor rule (`counters.counter_for` gives it to such profiles)."""

    def __init__(self, profile: ModelProfile):
        self.profile = profile
        self.processor = proc = load_processor(profile.model_dir, profile.trust_remote_code)
        self.tokenizer = tok = getattr(proc, "tokenizer", None)
        if tok is None:
            raise ProfileError(f"the processor of {profile.model_dir} has no tokenizer")
        # the tokenizer's own media token ids where it names them (Gemma 3's processor calls its placeholder,
        # <start_of_image>, the image token; the repeated one is the tokenizer's <image_soft_token>)
        ids = (getattr(tok, a, None) if isinstance(getattr(tok, a, None), int) else getattr(proc, a, None)
               for a in ("image_token_id", "video_token_id"))
        self._media_ids = tuple(sorted({i for i in ids if isinstance(i, int)}))
        self._runs = [(t, re.compile(f"(?:{re.escape(t)}){{2,}}")) for t in self._media_strings()]
        self._template = proc._resolve_chat_template(None) if hasattr(proc, "_resolve_chat_template") else None
        self._variables = {**tok.special_tokens_map, **profile.template_kwargs}  # as apply_chat_template passes them
        self._direct = self._template is not None and _has_replacements(proc)
        vp = getattr(proc, "video_processor", None)
        # videos the direct way too: the processor expands them through replace_video_token
        self._direct_video = self._direct and vp is not None and not isinstance(vp, NoVideo) \
            and _has_video_replacements(proc)
        if self._direct:
            merged = proc._merge_kwargs(tokenizer_init_kwargs=tok.init_kwargs, add_special_tokens=False)
            self._images_kwargs = merged["images_kwargs"]
            self._videos_kwargs = {k: v for k, v in merged.get("videos_kwargs", {}).items() if k != "video_metadata"}
            self._text_kwargs = {k: v for k, v in merged["text_kwargs"].items()
                                 if k not in ("return_mm_token_type_ids", "return_text_replacement_offsets",
                                              "return_tensors")}
        # chunk -> (tokens, media tokens) cache where its proof holds for this tokenizer (core/counting/chunkcount.py)
        self.chunks = _chunk_counts(tok, self._text_kwargs, self._media_ids) if self._direct else None
        self._image_rep: dict[tuple[int, int], tuple[str, int]] = {}  # size -> (replacement, tokens folded)
        # (size, alone): sizes the direct path was checked on, in a sample with one image or with several (a
        # processor may expand an image by how many the sample has: LLaVA-OneVision's anyres for one only)
        self._checked: set[tuple[tuple[int, int], bool]] = set()
        # video metadata key -> (replacement, tokens folded, media tokens in it, its tokens); per video, alone
        self._video_reps: dict[tuple, tuple[str, int, int, int]] = {}
        # the video keys of a sample (all of them, in order: a processor may treat a sample's videos together,
        # InternVL stacks them) the direct path was checked on
        self._checked_videos: set[tuple] = set()
        self._kept: dict[tuple, int] = {}  # video key -> frames the video processor keeps (for the budget)
        self._frame_out: dict[tuple[int, int], int] = {}  # frame size -> the processor's output bytes per frame
        video_budget()  # a bad PACK_ASSETS_VIDEO_BUDGET_GB stops here, before any shard is counted
        self.fallbacks = 0  # self-checks the direct path failed (it is then off: whole calls only)
        self.direct_counts = 0  # samples counted by the direct path

    def _media_strings(self) -> list[str]:
        tok, out = self.tokenizer, []
        for i in self._media_ids:
            s = tok.convert_ids_to_tokens(i)
            if isinstance(s, str) and s:
                out.append(s)
        return out

    # -- per sample ------------------------------------------------------------------------------------------

    def count_many(self, items: Iterable[tuple[list[dict], list, list]]):
        for batch in batched(items, _BATCH):
            yield from self._count_batch(batch)

    def _count_batch(self, batch) -> list:
        if not self._direct:
            return [self._safe(self.count, *item) for item in batch]
        prepared: list = []
        for item in batch:
            try:
                p = self._prepare(*item)
                # a sample showing a new size is counted by the whole call right away (which checks the direct
                # path on it), so the rest of the batch with that size goes the direct way
                prepared.append(self._checked_count(*item) if isinstance(p, _Whole) else p)
            except ReasonError as e:
                prepared.append(e)
        texts = [p[0] for p in prepared if isinstance(p, tuple)]
        if self.chunks is not None and texts:
            try:
                packed = self.chunks.lengths(texts)
            except Exception:  # one text the tokenizer refuses: the plain path finds it
                packed = None
            if packed is not None:
                it = iter(packed)
                out = []
                for p in prepared:
                    if isinstance(p, tuple):
                        self.direct_counts += 1
                        p = _unpack(next(it), p[1], p[2])
                    out.append(p)
                return out
        try:
            all_ids = self.tokenizer(texts, **self._text_kwargs)["input_ids"] if texts else []
        except Exception:  # one text the tokenizer refuses: find it sample by sample
            all_ids = None
        out, at = [], 0
        for p in prepared:
            if not isinstance(p, tuple):  # a ReasonError, or the whole call's count
                out.append(p)
                continue
            ids = all_ids[at] if all_ids is not None else None
            at += 1
            self.direct_counts += 1
            out.append(self._safe(self._from_ids, p, ids))
        return out

    def _safe(self, fn, *args):
        try:
            return fn(*args)
        except ReasonError as e:
            return e

    def _render(self, messages: list[dict]) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        tools = messages[0].get("tools") if messages else None
        msgs = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
        try:
            prompts, _ = render_jinja_template(conversations=[msgs], tools=tools, chat_template=self._template,
                                               add_generation_prompt=False, **self._variables)
        except Exception as e:
            raise ReasonError("template_error", f"{type(e).__name__}: {e}") from None
        return prompts[0]

    def _prepare(self, messages, image_sizes, videos):
        """(expanded text, tokens folded, video tokens) for the batched tokenizer, or _Whole for a sample
        showing a size or video metadata not checked yet."""
        vkeys = self._video_keys(videos)
        if not self._direct or (videos and not self._direct_video):  # a failed self-check: the whole call
            return _Whole()
        sizes = [(int(w), int(h)) for w, h in image_sizes]
        alone = len(sizes) == 1
        if any((s, alone) not in self._checked for s in sizes) or (vkeys and vkeys not in self._checked_videos):
            return _Whole()
        return self._expand(messages, sizes, vkeys)

    def _expand(self, messages, sizes, vkeys=()) -> tuple[str, int, tuple[int, int]]:
        text = self._render(messages)
        if (found := text.count(self.processor.image_token)) != len(sizes):  # as the processor's own check
            raise ReasonError("processor_error", f"the rendered text has {found} image placeholder(s) for "
                                                 f"{len(sizes)} image(s)")
        if vkeys and (found := text.count(self.processor.video_token)) != len(vkeys):
            raise ReasonError("processor_error", f"the rendered text has {found} video placeholder(s) for "
                                                 f"{len(vkeys)} video(s)")
        reps = [self._image_rep[s] for s in sizes]
        vreps = [self._video_rep(k) for k in vkeys]
        (expanded,), _ = self.processor.get_text_with_replacements([text], [r for r, _ in reps],
                                                                   [v[0] for v in vreps], [])
        return expanded, sum(n for _, n in reps) + sum(v[1] for v in vreps), \
            (sum(v[2] for v in vreps), sum(v[3] for v in vreps))

    def _from_ids(self, prepared, ids) -> dict:
        text, folded, video = prepared
        if ids is None:
            try:
                ids = self.tokenizer([text], **self._text_kwargs)["input_ids"][0]
            except Exception as e:
                raise ReasonError("processor_error", f"{type(e).__name__}: {e}") from None
        media = sum(ids.count(i) for i in self._media_ids) + folded
        return _result(len(ids) + folded, media - video[0], video[1])

    def _rep_for(self, size: tuple[int, int]) -> tuple[str, int]:
        """The processor's own replacement string for one image of this size, media-token runs folded."""
        hit = self._image_rep.get(size)
        if hit is None:
            proc = self.processor
            images, *_ = proc.prepare_inputs_layout(images=[[_blank(*size)]], text=[""])
            _, (rep,) = proc._process_images(images, **self._images_kwargs)
            folded = 0
            for unit, run in self._runs:
                rep, folded = _fold(unit, run, rep, folded)
            hit = self._image_rep[size] = (rep, folded)
        return hit

    # -- videos: stand-in frames + the manifest's metadata, through the processor's own video path -----------

    def _video_keys(self, videos) -> tuple:
        """One hashable key per video (its metadata, checked as the fast rules check it); a reason where the
        processor cannot take it here."""
        if not videos:
            return ()
        self._no_video(videos)
        if getattr(self.processor, "video_processor", None) is None:
            raise ReasonError("video_not_supported", f"{type(self.processor).__name__} takes no video")
        keys = tuple(_video_meta_key(v) for v in videos)
        self._within_budget(keys)
        return keys

    def _within_budget(self, keys: tuple) -> None:
        """Refuse, before any processor call, a sample whose videos would make the video processor hold more
        than video_budget() bytes in one call (a sample's videos go to one call). The stand-ins are virtual,
        but the processor materializes the frames it keeps at full size (uint8) and its output for each:
        kept frames x (3 x width x height + the output bytes of one frame of that size, measured once per size
        on a two-frame stand-in). Measured: a 30 s 1080p clip InternVL keeps whole, +5.9 GB; 120 frames of
        1080p through Qwen2.5-VL, +2.9 GB. One such sample must not take the worker, and the run, down."""
        need, parts = 0, []
        for key in keys:
            kept = self._kept.get(key)
            if kept is None:
                kept = self._kept[key] = _kept_frames(self.processor.video_processor, key)
            m = dict(key)
            size = (m["width"], m["height"])
            if size not in self._frame_out:
                self._frame_out[size] = self._output_bytes_per_frame(key)
            need += kept * (3 * m["width"] * m["height"] + self._frame_out[size])
            parts.append(f"{kept} frames of {m['width']}x{m['height']}")
        budget = video_budget()
        if need > budget:
            raise ReasonError("video_memory_budget", (
                f"counting this sample's video(s) ({', '.join(parts)}) would take the video processor "
                f"~{need / 2**30:.1f} GiB, over the {budget / 2**30:g} GiB budget of each worker ({BUDGET_ENV}); "
                f"sample fewer frames (num_frames / fps in the folder's video config) or raise the budget"))

    def _output_bytes_per_frame(self, key: tuple) -> int:
        """What the video processor returns per frame for frames of this size (its resize decides: a 64x48 clip
        that LLaVA-OneVision upsamples to 384x384 holds far more than its input), from a two-frame stand-in
        without sampling; a float32 copy of the input where the processor will not say."""
        m = dict(key)
        two = tuple((k, 2 if k == "total_num_frames" else v) for k, v in key)
        try:
            frames, metas = _stand_ins([two])
            out = self.processor.video_processor(videos=frames, video_metadata=metas, do_sample_frames=False)
            total = sum(v.numel() * v.element_size() for v in _tensors(out))
            return max(total // 2, 1)
        except Exception:
            return 12 * m["width"] * m["height"]

    def _video_rep(self, key: tuple) -> tuple[str, int, int, int]:
        """The processor's own replacement string for one video of this metadata (alone), media-token runs
        folded; how many media tokens it holds; how many tokens it is on its own (a sample's video_tokens, as
        the fast rules count them: timestamps, frame labels and per-frame wrappers included)."""
        hit = self._video_reps.pop(key, None)
        if hit is not None:
            self._video_reps[key] = hit  # most recently used last: eviction takes the oldest
        else:
            frames, metas = _stand_ins([key])
            _, (rep,) = self.processor._process_videos(frames, video_metadata=metas, **self._videos_kwargs)
            media = sum(rep.count(unit) for unit, _ in self._runs)
            folded = 0
            for unit, run in self._runs:
                rep, folded = _fold(unit, run, rep, folded)
            own = len(self.tokenizer([rep], **self._text_kwargs)["input_ids"][0]) + folded
            if len(self._video_reps) >= _CACHE_MAX:
                self._video_reps.pop(next(iter(self._video_reps)))
                self._checked_videos.clear()  # a checked key must keep its replacement: check anew
            hit = self._video_reps[key] = (rep, folded, media, own)
        return hit

    def _checked_count(self, messages, image_sizes, videos) -> dict:
        """The whole processor call (the reference); for a new size or video also the direct path, compared."""
        whole = self.count(messages, image_sizes, videos)
        if not self._direct or (videos and not self._direct_video):
            return whole
        sizes = [(int(w), int(h)) for w, h in image_sizes]
        vkeys = self._video_keys(videos)
        try:
            for s in sizes:
                self._rep_for(s)
            for k in vkeys:
                self._video_rep(k)
            text, folded, video = self._expand(messages, sizes, vkeys)
            # the self-check covers the path the batch takes: the chunk cache where it is on
            direct = _unpack(self.chunks.lengths([text])[0], folded, video) if self.chunks is not None else \
                self._from_ids((text, folded, video), None)
        except Exception:
            direct = None
        if direct == whole:
            self._checked.update((s, len(sizes) == 1) for s in sizes)
            if vkeys:
                self._checked_videos.add(vkeys)
        else:  # this processor does not expand the way the direct path assumes: whole calls only
            self._direct = self._direct_video = False
            self.fallbacks += 1
        return whole

    def count(self, messages: list[dict], image_sizes: list, videos: list) -> dict:
        """The whole processor call: template, then ``processor(text=..., images=..., videos=...,
        video_metadata=...)`` with blank stand-ins (image and video work memoized)."""
        vkeys = self._video_keys(videos)
        tools = messages[0].get("tools") if messages else None
        msgs = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
        try:
            text = self.processor.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False,
                                                      **self.profile.template_kwargs)
            images = [_blank(int(w), int(h)) for w, h in image_sizes] or None
            kw = {}
            if vkeys:
                frames, metas = _stand_ins(vkeys)
                kw = {"videos": frames, "video_metadata": metas}
            out = self.processor(text=[text], images=[images] if images else None, add_special_tokens=False, **kw)
        except ReasonError:
            raise
        except Exception as e:  # the processor's own refusal (bad aspect ratio, template error, ...)
            if vkeys and any(dict(k)["fps"] is None for k in vkeys) and "fps" in str(e):
                raise ReasonError("bad_video", f"video metadata has no frame rate; the processor: "
                                               f"{type(e).__name__}: {e}") from None
            raise ReasonError("processor_error", f"{type(e).__name__}: {e}") from None
        ids = list(out["input_ids"][0])
        # image_tokens: the processor's media token ids (its wrappers, e.g. <start_of_image>, count as text);
        # video_tokens: those of the videos' replacement strings (InternVL writes a video as image tokens)
        media = sum(ids.count(i) for i in self._media_ids) if images or vkeys else 0
        vmedia, video = self._video_media(vkeys, ids)
        return _result(len(ids), media - vmedia, video)

    def _video_media(self, vkeys: tuple, ids: list) -> tuple[int, int]:
        """(media tokens, tokens) of a sample's videos: from each video's replacement string where the direct
        path has it, else the video token id's count for both."""
        if not vkeys:
            return 0, 0
        if self._direct_video:
            try:
                reps = [self._video_rep(k) for k in vkeys]
                return sum(r[2] for r in reps), sum(r[3] for r in reps)
            except Exception:
                pass
        vid = getattr(self.processor, "video_token_id", None)
        img = getattr(self.processor, "image_token_id", None)
        n = ids.count(vid) if isinstance(vid, int) and vid != img else 0
        return n, n

    def video_status(self) -> str:
        vp = getattr(self.processor, "video_processor", None)
        if vp is None:
            return "none (the processor takes no video): video samples are rejected (video_not_supported)"
        if isinstance(vp, NoVideo):
            return f"refused per sample (missing_dependency): {vp.why}"
        how = "replacement string cached per video metadata, self-checked against the whole call" \
            if self._direct_video else "the whole processor call per sample"
        return (f"counted by {type(getattr(vp, '_inner', vp)).__name__} on blank stand-in frames with the "
                f"manifest's metadata (frames, fps, size, duration), its own frame sampling; {how}")

    def _no_video(self, videos) -> None:
        vp = getattr(self.processor, "video_processor", None)
        if videos and isinstance(vp, NoVideo):
            raise ReasonError("missing_dependency", vp.why)


@functools.lru_cache(maxsize=2)
def processor_counter(profile: ModelProfile) -> ProcessorCounter:
    """One counter per profile and worker process: its size cache serves every shard the worker counts."""
    return ProcessorCounter(profile)


class _Whole:
    """Marks a sample for the whole processor call."""


def _fold(unit: str, run: re.Pattern, text: str, folded: int) -> tuple[str, int]:
    """Each run of k copies of the token string `unit` kept as one; k - 1 added to `folded`."""
    def one(m: re.Match) -> str:
        nonlocal folded
        folded += len(m.group(0)) // len(unit) - 1
        return unit

    return run.sub(one, text), folded


def _has_video_replacements(proc) -> bool:
    from transformers.processing_utils import ProcessorMixin

    cls = type(proc)
    return (hasattr(proc, "_process_videos") and getattr(proc, "video_token", None) is not None
            and getattr(cls, "replace_video_token", None) is not ProcessorMixin.replace_video_token)


def _video_meta_key(meta) -> tuple:
    """A manifest video entry as the key of its replacement string: every field the VideoMetadata handed to
    the processor carries (frames, fps, width, height, duration: Qwen3-VL's timestamps depend on fps and
    the sampled indices, which depend on frames and fps). Missing or implausible metadata is the fast rules'
    reason (bad_video)."""
    total, fps = video_meta(meta)
    try:
        width, height = int(meta["width"]), int(meta["height"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReasonError("bad_video", f"unreadable video size in {meta!r}: {e}") from None
    if width <= 0 or height <= 0 or width * height > 1 << 28:
        raise ReasonError("bad_video", f"video metadata says {width}x{height}")
    fps = fps if fps > 0 else None
    duration = meta.get("duration")
    try:
        duration = float(duration) if duration else (total / fps if fps else None)
    except (TypeError, ValueError):
        duration = total / fps if fps else None
    return (("total_num_frames", total), ("fps", fps), ("width", width), ("height", height),
            ("duration", duration))


BUDGET_ENV = "PACK_ASSETS_VIDEO_BUDGET_GB"
DEFAULT_VIDEO_BUDGET_GB = 8


def video_budget() -> int:
    """Bytes of kept frames a video may need (PACK_ASSETS_VIDEO_BUDGET_GB, GiB; default 8). Read at each check,
    validated when a counter is built, so a bad value stops the run at once with this message."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_VIDEO_BUDGET_GB << 30
    try:
        gb = float(raw)
    except ValueError:
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        raise ValueError(f"{BUDGET_ENV}={raw!r}: expected a positive number of GiB (default {DEFAULT_VIDEO_BUDGET_GB})")
    return int(gb * 2**30)
# preprocess() hands these to the video processor's own call, not to its sampler
_NOT_SAMPLER_KWARGS = ("input_data_format", "do_convert_rgb", "do_sample_frames", "device", "video_metadata",
                       "return_tensors", "return_metadata")


def _kept_frames(video_processor, key: tuple) -> int:
    """How many frames the video processor keeps of a video of this metadata: its own ``sample_frames`` (what
    ``preprocess`` calls with the metadata alone, no pixels) when it samples, else every frame; every frame
    where the sampler cannot tell (the processor call then gives its own answer)."""
    from transformers.video_utils import VideoMetadata

    inner = getattr(video_processor, "_inner", video_processor)
    m = dict(key)
    names = getattr(getattr(inner, "valid_kwargs", None), "__annotations__", {})
    kwargs = {n: getattr(inner, n, None) for n in names}
    if not kwargs.get("do_sample_frames"):
        return m["total_num_frames"]
    for n in _NOT_SAMPLER_KWARGS:
        kwargs.pop(n, None)
    try:
        return min(m["total_num_frames"], len(inner.sample_frames(metadata=VideoMetadata(**m), **kwargs)))
    except Exception:
        return m["total_num_frames"]


def _tensors(value):
    """Every torch tensor in a processor output (a BatchFeature or dict, lists of them)."""
    if hasattr(value, "numel") and hasattr(value, "element_size"):
        yield value
    elif hasattr(value, "items"):  # a dict or a BatchFeature
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _stand_ins(keys) -> tuple[list, list]:
    """Blank frames per video key, (frames, 3, H, W) uint8 torch tensors of stride 0 (what torchcodec hands
    the processor when it decodes a file, without the memory: a numpy stand-in is copied whole by the
    processor's ``torch.from_numpy(...).contiguous()``, an hour of 1080p would be ~670 GB; this one stays
    virtual until a resize or the frames the sampling keeps), and a transformers VideoMetadata per key."""
    import torch
    from transformers.video_utils import VideoMetadata

    frames, metas = [], []
    for key in keys:
        m = dict(key)
        frames.append(torch.zeros((), dtype=torch.uint8).expand(m["total_num_frames"], 3, m["height"], m["width"]))
        metas.append(VideoMetadata(**m, video_backend="pyav"))
    return frames, metas


def _has_replacements(proc) -> bool:
    """The processor expands through the base class's per-image replacement hooks (transformers 5)."""
    from transformers.processing_utils import ProcessorMixin

    cls = type(proc)
    return (hasattr(ProcessorMixin, "get_text_with_replacements") and hasattr(proc, "_process_images")
            and getattr(cls, "replace_image_token", None) is not ProcessorMixin.replace_image_token
            and getattr(proc, "image_token", None) is not None)


_OUTPUT_PICKS = ("return_token_type_ids", "return_attention_mask")  # text kwargs that never change input_ids
_HIGH = 32  # a chunk's value: tokens + (media tokens << 32), so a text's sum carries both


def _chunk_counts(tok, text_kwargs: dict, media_ids: tuple[int, ...]):
    """A ChunkCounts over the processor's tokenizer, or None. The proof (core/counting/chunkcount.py) is about its
    ``tokenizers`` backend; the call the direct path makes must be that backend's plain encode: transformers'
    own ``__call__``/``_encode_plus`` (which hand the texts to ``encode_batch`` unchanged), no kwargs but
    add_special_tokens=False and ones that only pick outputs (Qwen3-VL's processor sets
    return_token_type_ids=False), special tokens not split."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    from .chunkcount import ChunkCounts, tokenizer_rule

    cls = type(tok)
    if (not isinstance(tok, TokenizersBackend) or cls.__call__ is not PreTrainedTokenizerBase.__call__
            or cls._encode_plus is not TokenizersBackend._encode_plus
            or text_kwargs.get("add_special_tokens") is not False
            or set(text_kwargs) - {"add_special_tokens", *_OUTPUT_PICKS}
            or getattr(tok, "split_special_tokens", True)):
        return None
    pattern, glue = tokenizer_rule(tok.backend_tokenizer)
    if pattern is None:
        return None

    def count(chunks: list[str]) -> list[int]:
        ids = tok(chunks, **text_kwargs)["input_ids"]  # the same call as the plain direct path
        return [len(x) + (sum(x.count(i) for i in media_ids) << _HIGH) for x in ids]

    return ChunkCounts(pattern, count, glue)


def _unpack(value: int, folded: int, video: tuple[int, int] = (0, 0)) -> dict:
    """A chunk-cache value as counts; ``video``: (media tokens, tokens) of the sample's videos."""
    media = (value >> _HIGH) + folded
    return _result((value & ((1 << _HIGH) - 1)) + folded, media - video[0], video[1])


def _result(total: int, image: int, video: int) -> dict:
    return {"text_tokens": total - image - video, "image_tokens": image, "video_tokens": video,
            "total_tokens": total, "counted_by": "processor"}
