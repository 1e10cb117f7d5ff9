"""The pixel inputs of a batch of encoded packs, in the order the model fills its placeholders (torch and
transformers' processors; imported only by the collator)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

# what the processor returns besides pixels: the text side is the encoder's
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def load_image(data: bytes) -> Image.Image:
    """An image as transformers' ``load_image`` gives it: EXIF orientation applied, RGB."""
    from PIL import ImageOps

    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def decode_video(data: bytes):
    """(every frame [T, H, W, 3] uint8, ``VideoMetadata``) read with PyAV as transformers' PyAV loader reads
    them: T and the rate from the container header (the average rate: what the profile sampled by; a header
    without a frame count, as some webm / mkv have, counts the decoded frames, as the manifest's probe counts
    packets); the video processor samples from these."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        total, fps = int(stream.frames) or len(frames), float(stream.average_rate or 0)
        meta = VideoMetadata(
            total_num_frames=total,
            fps=fps,
            duration=total / fps if fps else 0.0,
            video_backend="pyav",
            height=stream.height,
            width=stream.width,
            frames_indices=np.arange(total),
        )
    return np.stack(frames[:total]), meta


def qwen_images(image_processor, packs: list[dict]) -> dict:
    import torch

    data = [d for p in packs for sub in p["images"] for d in sub]
    if not data:
        return {}
    if image_processor is None:
        raise ValueError("the batch has images: give PackCollator the model's processor")
    res = image_processor(images=[load_image(d) for d in data], return_tensors="pt")
    grids = [list(g) for p in packs for sub in p["image_grid_thw"] for g in sub]
    if res["image_grid_thw"].tolist() != grids:  # another processor config than the packing profile's
        raise ValueError(f"processor grids {res['image_grid_thw'].tolist()} differ from the pack's {grids}")
    return {"pixel_values": res["pixel_values"], "image_grid_thw": torch.tensor(grids)}


def qwen_videos(video_pixels, packs: list[dict]) -> dict:
    import torch

    items = [(d, g) for p in packs for vs, gs in zip(p["videos"], p["video_grid_thw"]) for d, g in zip(vs, gs)]
    if not items:
        return {}
    if video_pixels is None:
        raise ValueError("the batch has videos: give PackCollator video_pixels(data, grid)")
    out = {
        "pixel_values_videos": torch.cat([video_pixels(d, g) for d, g in items]),
        "video_grid_thw": torch.tensor([list(g) for _, g in items]),
    }
    seconds = [s for p in packs for sub in p["second_per_grid_ts"] for s in sub]
    if seconds:
        out["second_per_grid_ts"] = torch.tensor(seconds)
    return out


def processor_pixels(processor, packs: list[dict], processor_kwargs: dict | None = None) -> dict:
    """InternVL / LLaVA-OneVision / Gemma 3: the model's processor run on each sub-sample's placeholders only
    (one text per sub-sample with media), so its pixels come in the model's order with its own defaults
    (InternVL's tiles with images and frames interleaved, LLaVA-OneVision's ``image_sizes`` and
    ``batch_num_images``); the placeholder tokens it writes must be the pack's, count for count."""
    texts, images, videos, metas, want = [], [], [], [], []
    for p in packs:
        cu, types = p["cu_seqlens"], p["mm_token_type_ids"]
        for i, order in enumerate(p["visual_order"]):
            if not order:
                continue
            texts.append("".join(processor.image_token if k == "image" else processor.video_token for k in order))
            images.append([load_image(d) for d in p["images"][i]])
            frames = [decode_video(d) for d in p["videos"][i]]
            videos.append([f for f, _ in frames])
            metas += [m for _, m in frames]
            want.append(int((types[cu[i] : cu[i + 1]] > 0).sum()))
    if not texts:
        return {}
    if processor is None or not hasattr(processor, "image_token"):
        raise ValueError("the batch has images or videos: give PackCollator the model's processor (AutoProcessor)")
    kw = {"text": texts, "return_tensors": "pt", "padding": True, **(processor_kwargs or {})}
    if any(images):
        kw["images"] = images
    if any(videos):
        kw["videos"], kw["video_metadata"] = videos, metas
    res = processor(**kw)
    media_ids = np.unique(np.concatenate([p["input_ids"][p["mm_token_type_ids"] > 0] for p in packs]))
    got = np.isin(res["input_ids"].numpy(), media_ids).sum(axis=1).tolist()
    if got != want:  # another processor config than the packing profile's (tiles, crops, frames)
        raise ValueError(
            f"the processor writes {got} placeholder tokens for the sub-samples' media; the packs hold {want}"
        )
    return {k: v for k, v in res.items() if k not in _TEXT_KEYS}
