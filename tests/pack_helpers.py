"""Pack a folder of shards end to end (manifest, token_lengths, plan, write) and read the packs back."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

from pack_assets.core import blend, epochs, store
from pack_assets.core import recipe as rc
from pack_assets.core.counting.profiles import ModelProfile, load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import WRITERS, run_write
from pack_assets.reader import iter_packs

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"  # config files only (see SOURCE.md there)


def pack_shards(
    shards: Path, tmp: Path, profile: str | ModelProfile, max_len: int, out: Path | None = None
) -> list[dict]:
    """All packs of the shards in ``shards``, packed for ``profile`` (a built-in name, or a profile such as a
    --model-dir's) with ``max_len`` (into ``out``)."""
    prof = profile if isinstance(profile, ModelProfile) else load_profile(profile)
    work, out = tmp / f"work-{prof.family}", out or tmp / f"out-{prof.family}"
    keys = list(store.find_shards(shards))
    for k in keys:
        run_manifest(shards, work, k)
        run_token_lengths(work, k, prof)
    run_plan(work, keys, PlanConfig(max_len=max_len), prof)
    run_write(work, shards, out, workers=1)
    return list(iter_packs(sorted(out.glob("*.tar"))))


def packed_outputs(shards: Path, tmp: Path, profile: str, max_len: int, per_shard: int = 2) -> dict[str, Path]:
    """The shards packed three ways, at most ``per_shard`` packs per output shard: ``copy`` and ``index`` (one
    plan, in ``work``) and a two-epoch recipe ``blend`` (the dataset ``a`` at repeat 1.5, index mode, in
    ``blend_work``)."""
    prof, paths = load_profile(profile), {k: tmp / k for k in ("work", "copy", "index", "blend_work", "blend")}
    keys = list(store.find_shards(shards))
    for k in keys:
        run_manifest(shards, paths["work"], k)
        run_token_lengths(paths["work"], k, prof)
    run_plan(paths["work"], keys, PlanConfig(max_len=max_len, max_packs_per_shard=per_shard), prof)
    for mode in ("copy", "index"):
        WRITERS[mode](paths["work"], shards, paths[mode], workers=1)
    recipe = rc.Recipe((rc.Dataset("a", str(shards), 1.5),), epochs=2, seed=3)
    keys = list(store.find_sources(recipe.roots))
    for k in keys:
        run_manifest(recipe.roots, paths["blend_work"], k)
        run_token_lengths(paths["blend_work"], k, prof)
    cfg = PlanConfig(max_len=max_len, max_packs_per_shard=per_shard, seed=recipe.seed)
    blend.run_blend_plan(paths["blend_work"], keys, cfg, prof, recipe)
    epochs.run_blend_write(paths["blend_work"], recipe, paths["blend"], workers=1, mode="index")
    return paths


def rotated_jpeg(w: int, h: int, orientation: int, color=(10, 200, 90)) -> bytes:
    """A w x h JPEG (as stored) whose EXIF says how to turn it for display."""
    im = Image.new("RGB", (w, h), color)
    im.paste((250, 250, 0), (0, 0, w // 3, h // 4))  # not symmetric: a wrong turn changes the pixels
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="JPEG", exif=exif.tobytes())
    return buf.getvalue()


def rotated_samples(n: int = 8) -> list[tuple[str, bytes | str]]:
    """Members of ``n`` samples with one or two EXIF-rotated JPEGs (orientations 1-8, non-square sizes)."""
    members: list[tuple[str, bytes | str]] = []
    for i in range(n):
        images = [
            (f"img{m}.jpg", rotated_jpeg(120 + 40 * i + 13 * m, 60 + 9 * i, (i + m) % 8 + 1)) for m in range(1 + i % 2)
        ]
        asked = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"Turned {i}?"}]
        rec = {
            "messages": [{"role": "user", "content": asked}, {"role": "assistant", "content": "Yes, it is turned."}],
            "images": [name for name, _ in images],
        }
        members.append((f"rot{i:03d}.json", json.dumps(rec)))
        members += [(f"rot{i:03d}.{name}", data) for name, data in images]
    return members


def tiny_media_samples(n: int = 72, seed: int = 3) -> list[tuple[str, bytes | str]]:
    """Short samples for running a model on: text (one to three turns), one or two small images (some EXIF
    turned), and short small videos; small enough that a pack holds several."""
    import numpy as np

    from pack_assets.core.demo import video_bytes

    rng = np.random.default_rng(seed)
    words = "the a red blue cat dog left right shows picture count two three what where small".split()
    clips = [
        video_bytes(f, w, h, fps, seed=i)
        for i, (f, w, h, fps) in enumerate([(4, 32, 32, 2), (8, 48, 32, 4), (6, 32, 48, 3)])
    ]
    members: list[tuple[str, bytes | str]] = []
    for i in range(n):
        kind = ("text", "image", "text", "images", "text", "video")[i % 6]
        turns = 1 + i % 3
        msgs = []
        for t in range(turns):
            content = [{"type": "text", "text": " ".join(rng.choice(words, int(rng.integers(2, 12))))}]
            if t == 0 and kind != "text":
                media = [{"type": "video" if kind == "video" else "image"} for _ in range(2 if kind == "images" else 1)]
                content = media + content
            msgs += [
                {"role": "user", "content": content},
                {"role": "assistant", "content": " ".join(rng.choice(words, int(rng.integers(1, 10))))},
            ]
        rec, key = {"messages": msgs}, f"t{i:04d}"
        if kind in ("image", "images"):
            sizes = [
                (int(rng.integers(20, 90)), int(rng.integers(20, 90))) for _ in range(2 if kind == "images" else 1)
            ]
            rec["images"] = [f"img{m}.jpg" for m in range(len(sizes))]
            members += [
                (
                    f"{key}.img{m}.jpg",
                    rotated_jpeg(w, h, int(rng.integers(1, 9)), tuple(int(c) for c in rng.integers(0, 255, 3))),
                )
                for m, (w, h) in enumerate(sizes)
            ]
        elif kind == "video":
            rec["video"] = "mp4"
            members.append((f"{key}.mp4", clips[i % len(clips)]))
        members.insert(len(members) - len(rec.get("images", [])) - (kind == "video"), (f"{key}.json", json.dumps(rec)))
    return members


def family_samples(videos: bool = True) -> list[tuple[str, bytes | str]]:
    """Few, short samples for the InternVL / LLaVA-OneVision / Gemma 3 models: text (one to three turns), one
    image (EXIF-turned ones among them), two images (one 2:1, which InternVL tiles), a 4-frame video."""
    from pack_assets.core.demo import video_bytes

    clip = video_bytes(4, 32, 32, 2, seed=0)
    plan = ["text", "image", "text", "images", "image", "video", "text", "image", "text", "video", "images", "text"]
    members: list[tuple[str, bytes | str]] = []
    for i, kind in enumerate(plan):
        if kind == "video" and not videos:
            kind = "image"
        sizes = {"image": [(40 + 4 * i, 40)], "images": [(36, 36), (80, 40)]}.get(kind, [])
        first = [{"type": "video"}] if kind == "video" else [{"type": "image"} for _ in sizes]
        msgs = []
        for t in range(1 + i % 3):
            msgs += [
                {
                    "role": "user",
                    "content": (first if t == 0 else []) + [{"type": "text", "text": f"Question {i} {t}?"}],
                },
                {"role": "assistant", "content": f"Answer {i}, turn {t}."},
            ]
        rec, key = {"messages": msgs}, f"f{i:03d}"
        if sizes:
            rec["images"] = [f"img{m}.jpg" for m in range(len(sizes))]
        if kind == "video":
            rec["video"] = "mp4"
        members.append((f"{key}.json", json.dumps(rec)))
        members += [(f"{key}.img{m}.jpg", rotated_jpeg(w, h, 1 + (i + m) % 8)) for m, (w, h) in enumerate(sizes)]
        if kind == "video":
            members.append((f"{key}.mp4", clip))
    return members


def processor_conversation(messages: list[dict], media: list[tuple[str, bytes]]) -> tuple[list[dict], list]:
    """A sub-sample's messages with its media attached the way ``processor.apply_chat_template`` takes them
    (images loaded as transformers loads them, videos decoded with PyAV), and the videos' metadata."""
    from pack_assets.reader.vision import decode_video, load_image

    it, metas, out = iter(media), [], []
    for m in messages:
        if not isinstance(m.get("content"), list):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p.get("type") == "image":
                parts.append({**p, "image": load_image(next(it)[1])})
            elif p.get("type") == "video":
                frames, meta = decode_video(next(it)[1])
                metas.append(meta)
                parts.append({**p, "video": frames})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, metas
