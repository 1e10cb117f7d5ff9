"""A deterministic demo dataset: WebDataset shards of chat samples, made locally (nothing downloaded).

Text-only, single-image, multi-image (2-6) and video samples; `conversations` (from/value, LLaVA
`<image>` placeholders) and `messages` (role/content, typed parts, system and tool turns) styles;
lognormal lengths with a few over the default max length; JPEG/PNG/WebP images from 8 px to over
3,000 px on a side; short real MPEG-4 videos written with PyAV; three deliberately bad samples.
"""

from __future__ import annotations

import io
import json
import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .tario import add_member

WORDS = (
    "the a model image shows of and to in is that for on with as this person scene left right color table "
    "red blue green describe answer question count objects background picture dog cat car street building "
    "people sky water tree window light small large two three how what where why because region chart value "
    "数据 图像 описание größe café naïve 🙂"
).split()
IMAGE_SIZES = [(8, 8), (33, 20), (64, 48), (120, 90), (200, 300), (320, 240), (448, 448), (512, 384),
               (640, 480), (800, 600), (1024, 768), (1280, 720), (300, 1500), (1920, 1080), (3200, 2400), (4000, 300)]


def _image_bytes(w: int, h: int, fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), tuple(int(x) for x in rng.integers(0, 255, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.rectangle([x0, y0, x0 + w // 4, y0 + h // 4], fill=tuple(int(x) for x in rng.integers(0, 255, 3)))
    buf = io.BytesIO()
    im.save(buf, format=fmt, quality=80) if fmt != "PNG" else im.save(buf, format=fmt)
    return buf.getvalue()


def video_bytes(frames: int, w: int, h: int, fps: int, seed: int = 0) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.time_base = Fraction(1, fps)
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        for i in range(frames):
            arr = np.roll(base, i * 2, axis=1)
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            frame.pts = i
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def _text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), max(1, n_words)))


def _conversation(rng, n_words: int, n_media: int, kind: str, style: str) -> tuple[dict, int]:
    turns = int(rng.integers(1, 4))
    split = np.maximum(1, rng.dirichlet(np.ones(turns * 2)) * n_words).astype(int)
    marker = f"<{kind}>\n" * n_media if kind else ""
    if style == "conversations":
        conv = []
        for t in range(turns):
            q = _text(rng, split[2 * t] // 3 + 1)
            conv.append({"from": "human", "value": (marker if t == 0 else "") + q})
            conv.append({"from": "gpt", "value": _text(rng, split[2 * t + 1])})
        rec = {"conversations": conv}
        if rng.random() < 0.2:
            rec["system"] = "You are a careful visual assistant."
        return rec, turns
    msgs = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": "You are a helpful assistant. " + _text(rng, 8)})
    for t in range(turns):
        parts = [{"type": kind} for _ in range(n_media)] if (t == 0 and kind) else []
        parts.append({"type": "text", "text": _text(rng, split[2 * t] // 3 + 1)})
        msgs.append({"role": "user", "content": parts})
        if t == turns - 1 and rng.random() < 0.1 and not kind:
            msgs.append({"role": "assistant", "content": "Let me look that up."})
            msgs.append({"role": "tool", "content": json.dumps({"result": _text(rng, 12)})})
        msgs.append({"role": "assistant", "content": _text(rng, split[2 * t + 1])})
    return {"messages": msgs}, turns


def make_demo(out_dir: Path, n_shards: int = 4, per_shard: int = 520, seed: int = 1234) -> list[Path]:
    """Write the demo shards (idempotent: same seed, same bytes). Returns the shard paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    formats = ["JPEG", "PNG", "WEBP"]
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
    pool = []  # sorted by area: small images common, huge ones rare (as in real SFT data)
    for i, (w, h) in enumerate(sorted(IMAGE_SIZES * 3, key=lambda s: s[0] * s[1])):
        fmt = formats[i % 3]
        pool.append((_image_bytes(w, h, fmt, seed + i), ext[fmt]))
    weights = 0.8 ** np.arange(len(pool))
    weights /= weights.sum()
    clips = [(8, 64, 48, 4), (16, 96, 64, 8), (24, 128, 96, 12), (30, 160, 120, 10), (48, 112, 112, 24),
             (12, 320, 64, 6)]
    videos = [video_bytes(f, w, h, fps, seed + i) for i, (f, w, h, fps) in enumerate(clips)]
    paths = []
    for s in range(n_shards):
        path = out_dir / f"part-{s:05d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for j in range(per_shard):
                key = f"{s:02d}{j:05d}"
                r = rng.random()
                kind, n_media = ("", 0) if r < 0.35 else ("image", 1) if r < 0.65 else \
                    ("image", int(rng.integers(2, 7))) if r < 0.88 else ("video", 1)
                n_words = int(rng.lognormal(np.log(600), 0.9))
                if rng.random() < 0.006:
                    n_words = int(rng.integers(11000, 16000))  # over the default max length
                style = "conversations" if rng.random() < 0.5 else "messages"
                rec, _ = _conversation(rng, n_words, n_media, kind, style)
                members: list[tuple[str, bytes]] = []
                if kind == "image":
                    names = []
                    for m in range(n_media):
                        data, e = pool[int(rng.choice(len(pool), p=weights))]
                        part = f"img{m}.{e}"
                        names.append(part)
                        members.append((f"{key}.{part}", data))
                    rec["images"] = names
                elif kind == "video":
                    members.append((f"{key}.mp4", videos[int(rng.integers(0, len(videos)))]))
                    rec["video"] = "mp4"
                rec["id"] = key
                add_member(tf, f"{key}.json", json.dumps(rec, ensure_ascii=False).encode())
                for name, data in members:
                    add_member(tf, name, data)
            if s == n_shards - 1:  # a few bad samples, so the demo shows rejected rows with reasons
                add_member(tf, "bad0001.json", json.dumps({"conversations": [{"from": "human", "value": "<image>\nhi"},
                                                                        {"from": "gpt", "value": "hello"}],
                                                     "image": "missing.jpg"}).encode())
                add_member(tf, "bad0002.json", b'{"conversations": [')
                two = {"conversations": [{"from": "human", "value": "<image><image> two?"},
                                         {"from": "gpt", "value": "one"}]}
                add_member(tf, "bad0003.json", json.dumps(two).encode())
                add_member(tf, "bad0003.jpg", pool[0][0])
        tmp.replace(path)
        paths.append(path)
    return paths
