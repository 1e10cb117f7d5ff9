"""Training-side reader for packed shards (no torch needed; arrays are numpy).

``iter_packs(paths)`` yields each pack with its sub-samples (conversation, source record, media bytes, and
the bytes of ``extra`` members the record does not name).
``PackEncoder(profile).encode(pack)`` turns a pack into what a trainer feeds the model without letting
sub-samples attend to each other:

- ``input_ids`` (int64): each sub-sample rendered with the model's chat template, its image/video pads
  expanded to their real counts (Qwen3-VL: with the per-frame-pair timestamps);
- ``labels``: the ids on assistant turns (content and ``<|im_end|>``), -100 elsewhere, and -100 on the
  first token of every sub-sample;
- ``cu_seqlens`` (int32, ``[0, l1, l1+l2, ...]``) for flash-attn varlen / Megatron THD;
- ``position_ids`` restarting at 0 for each sub-sample (the 1-D positions; mRoPE needs the grids below);
- ``image_grid_thw`` / ``video_grid_thw`` per sub-sample, in media order;
- ``loss_weights``: 1 per trainable token (``token``), 1/n_i (``sample``) or 1/sqrt(n_i) (``sqrt``) where n_i
  is the trainable tokens of sub-sample i; divide by their sum over the global batch.

The total length is checked against ``_meta.total_token_len``, and each sub-sample's against the planner's
``sample_token_lens``: a count that differs raises instead of overflowing a pack at training time.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .core.media import VIDEO_EXTS, probe_image, probe_video
from .core.profiles import ModelProfile, resolve_profile, tokenizer_for
from .core.records import PackMeta
from .core.tario import iter_pack_parts
from .core.tokens import TokenCounter, image_grid, video_count

_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def iter_packs(paths: Iterable[str | Path]) -> Iterator[dict]:
    """Each pack of the given output shards: ``pack_id``, ``media_type``, ``samples`` (with ``media`` as a
    list of (part name, bytes) in order) and ``_meta``."""
    for path in paths:
        for _, parts in iter_pack_parts(path):
            yield _pack(parts)


def _pack(parts: dict[str, bytes]) -> dict:
    doc = json.loads(parts["json"])
    for s in doc["samples"]:
        s["media"] = [(name, parts[name]) for name in s["media"]]
        # members the record does not name, carried byte for byte; never fed to the model
        s["extra"] = [(name, parts[name]) for name in s.get("extra", [])]
    return doc


class PackEncoder:
    def __init__(self, profile: ModelProfile | str | None = None, model_dir: str | None = None, loss_weighting: str = "token"):
        if loss_weighting not in ("token", "sample", "sqrt"):
            raise ValueError("loss_weighting is one of token, sample, sqrt")
        self.profile = profile if isinstance(profile, ModelProfile) else resolve_profile(profile, model_dir)
        self.counter = TokenCounter(self.profile, backend="tokenizers")
        self.tok = tokenizer_for(self.profile)
        self.weighting = loss_weighting
        ids = {t: self.tok.token_to_id(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
        self.image_pad, self.video_pad = ids["<|image_pad|>"], ids["<|video_pad|>"]
        self.vision_start, self.vision_end = ids["<|vision_start|>"], ids["<|vision_end|>"]

    def encode_sample(self, messages: list[dict], media: list[tuple[str, bytes]]) -> dict:
        text = self.counter.render(messages)
        enc = self.tok.encode(text, add_special_tokens=False)
        spans = [(m.start(1), m.end(1)) for m in _ASSISTANT.finditer(text)]
        trainable = [any(a <= start < b for a, b in spans) for start, _ in enc.offsets]
        images = [probe_image(data) for name, data in media if not name.endswith(_VIDEO_SUFFIXES)]
        videos = [probe_video(io.BytesIO(data)) for name, data in media if name.endswith(_VIDEO_SUFFIXES)]
        image_grids = [image_grid(w, h, self.profile.image) for w, h in images]
        vcounts = [video_count(v, self.profile.video) for v in videos]
        merge = self.profile.image.merge_size ** 2
        ids: list[int] = []
        labels: list[int] = []
        it_img, it_vid = iter(image_grids), iter(vcounts)
        for tid, train in zip(enc.ids, trainable):
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
        if labels:
            labels[0] = -100  # nothing before it in this sub-sample to predict it from
        return {"input_ids": ids, "labels": labels, "image_grid_thw": image_grids,
                "video_grid_thw": [v.grid for v in vcounts]}

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

    def encode(self, pack: dict) -> dict:
        meta = PackMeta.from_dict(pack["_meta"])
        subs = [self.encode_sample(s["messages"], s["media"]) for s in pack["samples"]]
        lens = [len(s["input_ids"]) for s in subs]
        if lens != meta.sample_token_lens or sum(lens) != meta.total_token_len:
            raise ValueError(f"pack {meta.pack_id}: encoded lengths {lens} differ from the plan's "
                             f"{meta.sample_token_lens} (profile {self.profile.name} vs {meta.context.get('profile')})")
        weights = []
        for s in subs:
            n = sum(lab != -100 for lab in s["labels"])
            w = 1.0 if self.weighting == "token" else (1.0 / n if self.weighting == "sample" else 1.0 / math.sqrt(n)) if n else 0.0
            weights += [w if lab != -100 else 0.0 for lab in s["labels"]]
        return {
            "pack_id": meta.pack_id,
            "sample_ids": meta.sample_ids,
            "input_ids": np.asarray([t for s in subs for t in s["input_ids"]], dtype=np.int64),
            "labels": np.asarray([t for s in subs for t in s["labels"]], dtype=np.int64),
            "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
            "position_ids": np.concatenate([np.arange(n) for n in lens]).astype(np.int64) if lens else np.zeros(0, np.int64),
            "image_grid_thw": [s["image_grid_thw"] for s in subs],
            "video_grid_thw": [s["video_grid_thw"] for s in subs],
            "loss_weights": np.asarray(weights, dtype=np.float32),
            "media": [[data for _, data in s["media"]] for s in pack["samples"]],
        }


_VIDEO_SUFFIXES = tuple(f".{e}" for e in sorted(VIDEO_EXTS))


def iter_encoded(paths: Iterable[str | Path], profile: str | None = None, model_dir: str | None = None,
                 loss_weighting: str = "token") -> Iterator[dict]:
    enc = PackEncoder(profile, model_dir, loss_weighting)
    for pack in iter_packs(paths):
        yield enc.encode(pack)
