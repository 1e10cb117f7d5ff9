"""Training-side reader for packed shards (no torch needed; arrays are numpy).

``iter_packs(paths)`` yields each pack with its sub-samples (conversation, source record, media bytes, and
the bytes of ``extra`` members the record does not name), from an output folder of either mode (copy: the
media are in the shards; index: they are read by byte range from the source shards) or from tar paths.
``PackEncoder(profile).encode(pack)`` turns a pack into what a trainer feeds the model without letting
sub-samples attend to each other:

- ``input_ids`` (int64): each sub-sample rendered with the model's chat template, its image/video pads
  expanded to their real counts (Qwen3-VL: with the per-frame-pair timestamps);
- ``labels``: the ids on assistant turns (content and ``<|im_end|>``), -100 elsewhere, and -100 on the
  first token of every sub-sample;
- ``cu_seqlens`` (int32, ``[0, l1, l1+l2, ...]``) for flash-attn varlen / Megatron THD;
- ``position_ids`` restarting at 0 for each sub-sample (the 1-D positions: not what Qwen-VL models rotate by);
- ``rope_position_ids`` (int64, ``(3, T)``): the mRoPE (temporal, height, width) positions, per sub-sample
  exactly what transformers' ``get_rope_index`` returns for that sub-sample alone, concatenated;
- ``mm_token_type_ids`` (int64, ``[T]``): 0 text, 1 image pad, 2 video pad, as the processor returns them;
- ``image_grid_thw`` / ``video_grid_thw`` per sub-sample, in model order (images as the EXIF orientation
  turns them, as the processor loads them); ``second_per_grid_ts`` per sub-sample, per video (Qwen2.5-VL);
- ``images`` / ``videos``: per sub-sample, the raw bytes in the order of those grids;
- ``loss_weights``: 1 per trainable token (``token``), 1/n_i (``sample``) or 1/sqrt(n_i) (``sqrt``) where n_i
  is the trainable tokens of sub-sample i; divide by their sum over the global batch.

``PackCollator`` (torch, imported only when it is called) turns a batch of encoded packs into padded tensors
with ``cu_seqlens`` and pixel values from the model's processor; ``pack_from_parts`` makes a pack from one
WebDataset sample's parts (Megatron-Energon). The proof that a pack so fed gives each sub-sample's own
logits is ``tests/test_packed_equals_unpacked.py``.

The total length is checked against ``_meta.total_token_len``, and each sub-sample's against the planner's
``sample_token_lens``: a count that differs raises instead of overflowing a pack at training time.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from .core import labels
from .core.chatkw import canonical
from .core.counting.profiles import ModelProfile, resolve_profile
from .core.counting.tokenizers import tokenizer_for
from .core.counting.tokens import TokenCounter
from .core.counting.vision import image_grid, video_count
from .core.indexmode import INDEX_PART, IndexSourceChanged, SourceFiles  # noqa: F401 (IndexSourceChanged: for callers)
from .core.labels import policy_for, trainable_spans
from .core.media import VIDEO_EXTS, probe_image, probe_video
from .core.records import PackMeta
from .core.tario import iter_pack_parts


def iter_packs(paths: str | Path | Iterable[str | Path], source_root: str | Path | Mapping | None = None,
               verify: bool = False) -> Iterator[dict]:
    """Each pack of the given output shards: ``pack_id``, ``media_type``, ``samples`` (with ``media`` as a
    list of (part name, bytes) in order) and ``_meta``. ``paths``: an output folder (copy or index mode;
    its shards in order), one tar, or a list of tars. An index-mode pack's media are read from its source
    shards (``pread`` on kept fds) after their size and mtime are checked against the index: a changed
    source raises ``IndexSourceChanged`` naming it before any of its bytes are used. ``source_root``: where
    the sources are now, when they moved since packing (a folder; for a recipe's epoch folder, a mapping
    dataset name -> folder of the datasets that moved); ``verify``: also compare each range's sha256."""
    with SourceFiles(source_root, verify) as sources:
        for path in shard_paths(paths):
            for _, parts in iter_pack_parts(path):
                yield _pack(sources.resolve(parts) if INDEX_PART in parts else parts)


def shard_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The tars to read: an output folder's shards (the order `wids-index.json` lists them in, else by
    name), one tar, or the given list."""
    if not isinstance(paths, (str, Path)):
        return [Path(p) for p in paths]
    p = Path(paths)
    if not p.is_dir():
        return [p]
    try:
        return [p / s["url"] for s in json.loads((p / "wids-index.json").read_text())["shardlist"]]
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(p.glob("*.tar"))


def _pack(parts: dict) -> dict:
    doc = parts["json"]
    doc = json.loads(doc) if isinstance(doc, (bytes, str)) else json.loads(json.dumps(doc))  # a copy: media go in
    for s in doc["samples"]:
        s["media"] = [(name, parts[name]) for name in s["media"]]
        # members the record does not name, carried byte for byte; never fed to the model
        s["extra"] = [(name, parts[name]) for name in s.get("extra", [])]
    return doc


def pack_from_parts(parts: dict, sources: SourceFiles | None = None) -> dict:
    """A pack as ``iter_packs`` yields it, from one WebDataset sample's parts (``{"json": ..., part name:
    bytes}``, e.g. a Megatron-Energon ``CrudeWebdataset`` raw sample with ``decoder = None``). An index-mode
    sample (an ``index.json`` part) is read from its sources through ``sources`` (keep one
    ``SourceFiles(source_root)`` per worker; default: one per process, at the recorded input root)."""
    if INDEX_PART in parts:
        parts = (sources or _process_sources()).resolve(parts)
    return _pack(parts)


_SOURCES: tuple[int, SourceFiles] | None = None


def _process_sources() -> SourceFiles:
    global _SOURCES
    if _SOURCES is None or _SOURCES[0] != os.getpid():  # a forked worker opens its own fds
        _SOURCES = (os.getpid(), SourceFiles())
    return _SOURCES[1]


class PackEncoder:
    """``chat_template_kwargs``: the template variables to render with; None (the default): each pack's own, as
    its ``_meta`` records them (what its lengths were counted with). ``label_policy``: which tokens train (a
    policy name or dataset -> name, core/labels.py); None: each sub-sample's as its pack's ``_meta`` records."""

    def __init__(self, profile: ModelProfile | str | None = None, model_dir: str | None = None, loss_weighting: str = "token",
                 chat_template_kwargs: str | dict | None = None, label_policy: str | dict | None = None):
        if loss_weighting not in ("token", "sample", "sqrt"):
            raise ValueError("loss_weighting is one of token, sample, sqrt")
        self.profile = profile if isinstance(profile, ModelProfile) else resolve_profile(profile, model_dir)
        if self.profile.rule != "fast" or self.profile.media is not None:  # M-RoPE ids and pads are Qwen-VL's
            raise ValueError(f"PackEncoder encodes Qwen2/2.5/3-VL packs; {self.profile.name} has no encoder here "
                             "(use the model's own processor on each sample of the pack)")
        self.template_kwargs = None if chat_template_kwargs is None else canonical(chat_template_kwargs)
        self.label_policy = None if label_policy is None else labels.meta_value(labels.canonical(label_policy))
        self._counters: dict[str, TokenCounter] = {}
        self.counter = self._counter(self.template_kwargs or self.profile.chat_template_kwargs)
        self.tok = tokenizer_for(self.profile)
        self.weighting = loss_weighting
        self.tokens_per_second = np.float32(_tokens_per_second(self.profile))  # Qwen2.5-VL's video time scale
        ids = {t: self.tok.token_to_id(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
        self.image_pad, self.video_pad = ids["<|image_pad|>"], ids["<|video_pad|>"]
        self.vision_start, self.vision_end = ids["<|vision_start|>"], ids["<|vision_end|>"]

    def _counter(self, kwargs: str) -> TokenCounter:
        """The renderer for one set of template variables (canonical JSON text)."""
        if kwargs not in self._counters:
            self._counters[kwargs] = TokenCounter(replace(self.profile, chat_template_kwargs=kwargs), backend="tokenizers")
        return self._counters[kwargs]

    def encode_sample(self, messages: list[dict], media: list[tuple[str, bytes]], label_policy: str = "all") -> dict:
        text = self.counter.render(messages)
        enc = self.tok.encode(text, add_special_tokens=False)
        spans = trainable_spans(text, label_policy)
        trainable = [any(a <= start < b for a, b in spans) for start, _ in enc.offsets]
        images = [data for name, data in media if not name.endswith(_VIDEO_SUFFIXES)]
        videos = [data for name, data in media if name.endswith(_VIDEO_SUFFIXES)]
        image_grids = [image_grid(*probe_image(data), self.profile.image) for data in images]
        metas = [probe_video(io.BytesIO(data)) for data in videos]
        vcounts = [video_count(v, self.profile.video) for v in metas]
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
        # Qwen3-VL places frames by their timestamps instead; its processor returns no second_per_grid_ts
        seconds = ([] if self.profile.family == "qwen3-vl" else
                   [_seconds_per_grid(m, v, self.profile.video) for m, v in zip(metas, vcounts)])
        out = {"input_ids": ids, "labels": labels, "image_grid_thw": image_grids,
               "video_grid_thw": [v.grid for v in vcounts], "second_per_grid_ts": seconds,
               "images": images, "videos": videos}
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
            videos = [(g, self.tokens_per_second * np.float32(sec)) for g, sec in zip(s["video_grid_thw"], s["second_per_grid_ts"])]
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

    def encode(self, pack: dict) -> dict:
        meta = PackMeta.from_dict(pack["_meta"])
        kwargs = self.template_kwargs
        self.counter = self._counter(canonical(meta.context.get("chat_template_kwargs")) if kwargs is None else kwargs)
        recorded = meta.context.get("label_policy") if self.label_policy is None else self.label_policy
        subs = [self.encode_sample(s["messages"], s["media"], policy_for(recorded, sid))
                for s, sid in zip(pack["samples"], meta.sample_ids)]
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
            "rope_position_ids": np.concatenate([s["rope_position_ids"] for s in subs], axis=1) if subs else np.zeros((3, 0), np.int64),
            "mm_token_type_ids": np.concatenate([s["mm_token_type_ids"] for s in subs]) if subs else np.zeros(0, np.int64),
            "image_grid_thw": [s["image_grid_thw"] for s in subs],
            "video_grid_thw": [s["video_grid_thw"] for s in subs],
            "second_per_grid_ts": [s["second_per_grid_ts"] for s in subs],
            "images": [s["images"] for s in subs],
            "videos": [s["videos"] for s in subs],
            "loss_weights": np.asarray(weights, dtype=np.float32),
            "media": [[data for _, data in s["media"]] for s in pack["samples"]],
        }


_VIDEO_SUFFIXES = tuple(f".{e}" for e in sorted(VIDEO_EXTS))
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


def iter_encoded(paths: str | Path | Iterable[str | Path], profile: str | None = None, model_dir: str | None = None,
                 loss_weighting: str = "token", source_root: str | Path | Mapping | None = None,
                 chat_template_kwargs: str | dict | None = None, label_policy: str | dict | None = None) -> Iterator[dict]:
    enc = PackEncoder(profile, model_dir, loss_weighting, chat_template_kwargs, label_policy)
    for pack in iter_packs(paths, source_root=source_root):
        yield enc.encode(pack)


class PackCollator:
    """A ``DataLoader`` ``collate_fn``: a batch of encoded packs (``PackEncoder.encode``) → torch tensors.

    Right-padded ``[B, L]``: ``input_ids`` (``pad_id``), ``labels`` (-100), ``loss_weights`` (0),
    ``mm_token_type_ids``; ``rope_position_ids`` ``[3, B, L]``; ``position_ids`` ``[4, B, L]``: the 1-D
    positions then the mRoPE ones, the form in which transformers' Qwen-VL models build the block-diagonal
    mask themselves (no ``attention_mask``); ``cu_seqlens`` (int32) and ``max_seqlen`` over the flattened
    ``[B * L]`` tokens, each row's padding its own segment (flash-attn varlen, Megatron THD); with
    ``block_mask=True`` also ``attention_mask`` ``[B, 1, L, L]`` (bool, block-diagonal causal) for sdpa/eager.
    ``pixel_values`` / ``image_grid_thw`` come from ``processor`` (a Qwen-VL processor or image processor),
    the images loaded as transformers' ``load_image`` does (EXIF orientation applied); ``video_pixels(data,
    grid)`` returns one video's ``pixel_values_videos`` rows. torch is imported only here.
    """

    def __init__(self, processor=None, pad_id: int = 151643, block_mask: bool = False, video_pixels=None):
        self.image_processor = getattr(processor, "image_processor", processor)
        self.pad_id, self.block_mask, self.video_pixels = pad_id, block_mask, video_pixels

    def __call__(self, packs: list[dict]) -> dict:
        import torch

        width = max(len(p["input_ids"]) for p in packs)
        out = {k: torch.from_numpy(_pad_rows([p[k] for p in packs], width, fill, dtype))
               for k, fill, dtype in (("input_ids", self.pad_id, np.int64), ("labels", -100, np.int64),
                                      ("loss_weights", 0, np.float32), ("mm_token_type_ids", 0, np.int64))}
        rope = np.stack([_pad_rows(list(p["rope_position_ids"][a] for p in packs), width, 0, np.int64) for a in range(3)])
        text = _pad_rows([p["position_ids"] for p in packs], width, 0, np.int64)
        out["rope_position_ids"] = torch.from_numpy(rope)
        out["position_ids"] = torch.from_numpy(np.concatenate([text[None], rope]))
        lens = [np.diff(p["cu_seqlens"]).tolist() + ([width - len(p["input_ids"])] if len(p["input_ids"]) < width else [])
                for p in packs]
        flat = [n for row in lens for n in row]
        out["cu_seqlens"] = torch.from_numpy(np.concatenate([[0], np.cumsum(flat)]).astype(np.int32))
        out["max_seqlen"] = max(flat)
        if self.block_mask:
            out["attention_mask"] = torch.from_numpy(np.stack([_block_causal(row) for row in lens])[:, None])
        out.update(self._images(packs))
        out.update(self._videos(packs))
        return out

    def _images(self, packs: list[dict]) -> dict:
        import torch
        from PIL import ImageOps

        data = [d for p in packs for sub in p["images"] for d in sub]
        if not data:
            return {}
        if self.image_processor is None:
            raise ValueError("the batch has images: give PackCollator the model's processor")
        images = [ImageOps.exif_transpose(Image.open(io.BytesIO(d))).convert("RGB") for d in data]
        res = self.image_processor(images=images, return_tensors="pt")
        grids = [list(g) for p in packs for sub in p["image_grid_thw"] for g in sub]
        if res["image_grid_thw"].tolist() != grids:  # another processor config than the packing profile's
            raise ValueError(f"processor grids {res['image_grid_thw'].tolist()} differ from the pack's {grids}")
        return {"pixel_values": res["pixel_values"], "image_grid_thw": torch.tensor(grids)}

    def _videos(self, packs: list[dict]) -> dict:
        import torch

        items = [(d, g) for p in packs for vs, gs in zip(p["videos"], p["video_grid_thw"]) for d, g in zip(vs, gs)]
        if not items:
            return {}
        if self.video_pixels is None:
            raise ValueError("the batch has videos: give PackCollator video_pixels(data, grid)")
        out = {"pixel_values_videos": torch.cat([self.video_pixels(d, g) for d, g in items]),
               "video_grid_thw": torch.tensor([list(g) for _, g in items])}
        seconds = [s for p in packs for sub in p["second_per_grid_ts"] for s in sub]
        if seconds:
            out["second_per_grid_ts"] = torch.tensor(seconds)
        return out


def _pad_rows(rows: list, width: int, fill, dtype) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def _block_causal(lens: list[int]) -> np.ndarray:
    """[L, L] bool: token q sees token k when both are in one segment and k <= q."""
    seg = np.repeat(np.arange(len(lens)), lens)
    return (seg[:, None] == seg[None, :]) & np.tri(len(seg), dtype=bool)
