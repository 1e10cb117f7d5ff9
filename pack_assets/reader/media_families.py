"""InternVL, LLaVA-OneVision and Gemma 3 sub-samples (the families with a ``MediaRule``): the rendered text with
each placeholder written out as the model's processor writes it, tokenized whole, as the processor tokenizes
it (so the wrappers and InternVL's "FrameN: " labels are tokenized in context).

- InternVL: an image is ``<img>`` + ``<IMG_CONTEXT>`` x 256 per tile + ``</img>``; a video is
  "Frame1: <img>...</img>\\nFrame2: ..." with 256 context tokens per frame (frames as images);
- LLaVA-OneVision: ``<image>`` x the anyres feature count (729 + 1 each when the sample has several
  images), ``<video>`` x (frames * 196 + 1);
- Gemma 3: "\\n\\n<start_of_image>" + ``<image_soft_token>`` x 256 + "<end_of_image>\\n\\n" per image, and
  with pan-and-scan crops the processor's "Here is the original image ..." text.

``mm_token_type_ids`` is 1 exactly at the per-visual-token placeholders and 2 at video ones (the design's
contract). InternVL's processor returns 1 also at ``<img>``/``</img>`` and at video frames, but no InternVL
forward reads it; Gemma 3's forward reads ``token_type_ids`` (1 at ``<image_soft_token>``: its bidirectional
image blocks), returned as the processor returns it."""

from __future__ import annotations

import io
import re

import numpy as np

from ._core import ModelProfile, TokenCounter, media_crops, media_image_tokens, probe_image, probe_video, sampled_frames
from .samples import split_media, tokens_and_trainable

# Gemma 3's template: "<start_of_turn>model\n" + text + "<end_of_turn>\n"; the text and <end_of_turn> train
GEMMA_ASSISTANT = re.compile(r"<start_of_turn>model\n(.*?<end_of_turn>)", re.S)


class MediaSamples:
    """Encodes one sub-sample for an InternVL / LLaVA-OneVision / Gemma 3 profile (``encode``); the pack keys
    it adds are ``visual_order``, ``image_tokens`` (per image, its repeated placeholder tokens),
    ``video_frames`` (per video) and, for Gemma 3, ``token_type_ids``."""

    family_kind = "media"

    def __init__(self, profile: ModelProfile, tok):
        self.profile, self.tok, self.rule = profile, tok, profile.media
        self.image_id = tok.token_to_id(self.rule.token)
        self.video_id = tok.token_to_id(self.rule.video) if self.rule.kind == "anyres" and self.rule.video else None
        self.assistant = GEMMA_ASSISTANT if profile.family == "gemma3" else None
        kinds = [re.escape(self.rule.placeholder)] + ([re.escape(self.rule.video)] if self.rule.video else [])
        self._visuals = re.compile("|".join(f"({k})" for k in kinds))

    def encode(self, counter: TokenCounter, messages: list[dict], media: list[tuple[str, bytes]], policy: str,
               carried: int = 0) -> dict:
        text = counter.render(messages)
        images, videos = split_media(media)
        order = ["image" if m.group(1) else "video" for m in self._visuals.finditer(text)]
        if order.count("image") != len(images) or order.count("video") != len(videos):
            raise ValueError(f"the template wrote {order.count('image')} image and {order.count('video')} video "
                             f"placeholder(s) for {len(images)} image(s) and {len(videos)} video(s)")
        sizes = [probe_image(data) for data in images]
        tokens = [media_image_tokens(w, h, len(sizes), self.rule) for w, h in sizes]
        crops = [media_crops(w, h, self.rule) for w, h in sizes]
        frames = [sampled_frames(probe_video(io.BytesIO(data)), self.profile.video) for data in videos]
        text = self._expand(text, order, tokens, crops, frames)
        kw = {} if self.assistant is None else {"assistant": self.assistant}
        ids, trainable = tokens_and_trainable(self.tok, text, policy, carried=carried, **kw)
        types = self._types(np.asarray(ids, dtype=np.int64), order, frames)
        out = {
            "input_ids": ids,
            "labels": [t if train and not k else -100 for t, train, k in zip(ids, trainable, types)],
            "mm_token_type_ids": types,
            "images": images,
            "videos": videos,
            "visual_order": order,
            "image_tokens": tokens,
            "video_frames": frames,
        }
        if self.profile.family == "gemma3":
            out["token_type_ids"] = (types == 1).astype(np.int64)
        return out

    def _expand(self, text: str, order: list[str], tokens: list[int], crops: list[int], frames: list[int]) -> str:
        """Each placeholder of the rendered text replaced by what the processor writes for it."""
        it_img, it_vid = iter(zip(tokens, crops)), iter(frames)
        pieces = self._visuals.split(text)  # text, (image, video) groups, text, ...
        out = [pieces[0]]
        step = 1 + self._visuals.groups
        for k, kind in enumerate(order):
            out.append(self._image(*next(it_img)) if kind == "image" else self._video(next(it_vid)))
            out.append(pieces[(k + 1) * step])
        return "".join(out)

    def _image(self, n: int, crops: int) -> str:
        rule = self.rule
        if rule.kind == "fixed":  # Gemma3Processor.replace_image_token: one block per image and crop
            block = rule.prefix + rule.token * rule.tokens + rule.suffix
            if not crops:
                return block
            return f"Here is the original image {block} and here are some crops to help you see better " + " ".join(
                [block] * crops
            )
        return rule.prefix + rule.token * n + rule.suffix

    def _video(self, frames: int) -> str:
        rule = self.rule
        if rule.kind == "anyres":  # LlavaOnevisionProcessor: the <video> token, frames * 196 + 1 times
            return rule.video * (frames * rule.frame_tokens + 1)
        # InternVLProcessor.replace_video_token
        return "\n".join(
            f"Frame{i + 1}: {rule.prefix}{rule.token * rule.frame_tokens}{rule.suffix}" for i in range(frames)
        )

    def _types(self, ids: np.ndarray, order: list[str], frames: list[int]) -> np.ndarray:
        """0 text, 1 image placeholder, 2 video placeholder per token. InternVL writes its video frames with the
        image token: each run of it is one image or one frame, in ``order``."""
        types = (ids == self.image_id).astype(np.int64)
        if self.video_id is not None:
            types[ids == self.video_id] = 2
        if "video" in order and self.video_id is None:
            is_image = types == 1
            starts = np.flatnonzero(is_image & ~np.concatenate([[False], is_image[:-1]]))
            ends = np.flatnonzero(is_image & ~np.concatenate([is_image[1:], [False]])) + 1
            runs = [2 if kind == "video" else 1 for kind, n in zip(order, _per_visual(order, frames)) for _ in range(n)]
            if len(runs) != len(starts):
                raise ValueError(f"{len(starts)} runs of image tokens for {len(runs)} images and frames")
            for a, b, kind in zip(starts, ends, runs):
                types[a:b] = kind
        return types


def _per_visual(order: list[str], frames: list[int]) -> list[int]:
    """Runs of the image token each visual writes: one per image, one per frame of a video."""
    it = iter(frames)
    return [next(it) if kind == "video" else 1 for kind in order]
