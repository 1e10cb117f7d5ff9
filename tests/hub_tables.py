"""Small tables in the exact column schemas of the Hub datasets `convert` reads (docs/formats.md cites each
card), and each row's JSON twin: the same record as JSON + image files, as `pack-assets count` reads it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets' Image feature in Arrow
SCHEMAS = {
    # HuggingFaceM4/the_cauldron: images (sequence: image), texts (list: user, assistant, source)
    "cauldron": pa.schema([("images", pa.list_(IMAGE)), ("texts", pa.list_(pa.struct(
        [("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])))]),
    # HuggingFaceM4/FineVision: images, texts (user, assistant), source, per-turn ratings and their minimum
    "finevision": pa.schema([("images", pa.list_(IMAGE)), ("texts", pa.list_(pa.struct(
        [("user", pa.string()), ("assistant", pa.string())]))), ("source", pa.string()),
        *((f"{r}_ratings", pa.list_(pa.int64())) for r in ("image_correspondence", "visual_dependency",
                                                           "relevance", "formatting"))]),
    # lmms-lab/LLaVA-OneVision-Data: id, image (image), conversations (list: from, value), data_source
    "llava": pa.schema([("id", pa.string()), ("image", IMAGE), ("conversations", pa.list_(pa.struct(
        [("from", pa.string()), ("value", pa.string())]))), ("data_source", pa.string())]),
    # HuggingFaceH4/llava-instruct-mix-vsft: messages (content: list of index, text, type; role), images
    "messages": pa.schema([("messages", pa.list_(pa.struct([("content", pa.list_(pa.struct(
        [("index", pa.int64()), ("text", pa.string()), ("type", pa.string())]))), ("role", pa.string())]))),
        ("images", pa.list_(IMAGE))]),
}
_FORMATS = (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("GIF", "gif"))


def image(i: int) -> tuple[bytes, str]:
    """Image ``i``: a size and format of its own (JPEG, PNG, WebP, GIF in turn), and its file extension."""
    fmt, ext = _FORMATS[i % len(_FORMATS)]
    buf = io.BytesIO()
    Image.new("RGB", (40 + 13 * (i % 7), 30 + 29 * (i % 5)), (i % 256, 90, 160)).save(buf, format=fmt)
    return buf.getvalue(), ext


def rows(shape: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` rows of a shape: 1-3 turns, 0-2 images (LLaVA: one image or none), words that vary."""
    out = []
    for r in range(n):
        k = seed + r
        imgs = [{"bytes": image(k * 3 + j)[0], "path": f"src_{k}_{j}.bin"}
                for j in range((k % 3) if shape != "llava" else 1)]
        turns = [(f"Question {k}.{t}: " + "what is here? " * (1 + (k + t) % 4), f"Answer {k}.{t}. " * (1 + (k * t) % 5))
                 for t in range(1 + k % 3)]
        if shape == "cauldron":
            out.append({"images": imgs, "texts": [{"user": u, "assistant": a, "source": "AI2D"} for u, a in turns]})
        elif shape == "finevision":
            out.append({"images": imgs, "texts": [{"user": u, "assistant": a} for u, a in turns],
                        "source": "ai2d_merged",
                        **{f"{x}_ratings": [4 + t % 2 for t in range(len(turns))] for x in
                           ("image_correspondence", "visual_dependency", "relevance", "formatting")}})
        elif shape == "llava":
            img = imgs[0] if k % 5 else None  # every fifth row text-only, as in the text subsets
            conv = []
            for t, (u, a) in enumerate(turns):
                conv += [{"from": "human", "value": ("<image>\n" if t == 0 and img else "") + u},
                         {"from": "gpt", "value": a}]
            out.append({"id": f"ov-{k}", "image": img, "conversations": conv, "data_source": "CLEVR-Math(MathV360K)"})
        else:
            msgs = []
            for t, (u, a) in enumerate(turns):
                lead = [{"index": j, "text": None, "type": "image"} for j in range(len(imgs))] if t == 0 else []
                msgs += [{"content": [*lead, {"index": None, "text": u, "type": "text"}], "role": "user"},
                         {"content": [{"index": None, "text": a, "type": "text"}], "role": "assistant"}]
            out.append({"messages": msgs, "images": imgs})
    return out


def write_parquet(path: Path, shape: str, table_rows: list[dict], row_group_size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table_rows, schema=SCHEMAS[shape]), path, row_group_size=row_group_size)
    return path


def json_twin(shape: str, row: dict, media: Path, stem: str) -> dict:
    """The row as a JSON record with its images as files (written under ``media``): what a user with the
    same data as JSON + image files would count."""
    media.mkdir(parents=True, exist_ok=True)
    values = [row["image"]] if shape == "llava" and row["image"] else [] if shape == "llava" else row["images"]
    paths = []
    for j, v in enumerate(values):
        ext = {b"\xff\xd8": "jpg", b"\x89P": "png", b"RI": "webp", b"GI": "gif"}[v["bytes"][:2]]
        (media / f"{stem}_{j}.{ext}").write_bytes(v["bytes"])
        paths.append(f"{stem}_{j}.{ext}")
    if shape in ("cauldron", "finevision"):  # plain turns: the images go at the start of the first user turn
        turns = [m for t in row["texts"] for m in ({"role": "user", "content": t["user"]},
                                                    {"role": "assistant", "content": t["assistant"]})]
        return {"messages": turns, "images": paths}
    if shape == "llava":
        return {"id": row["id"], "conversations": row["conversations"], **({"image": paths[0]} if paths else {})}
    return {"messages": row["messages"], "images": paths}


def write_twins(path: Path, shape: str, table_rows: list[dict], media: Path) -> Path:
    path.write_text("".join(json.dumps(json_twin(shape, r, media, f"{shape}_{i}")) + "\n"
                            for i, r in enumerate(table_rows)))
    return path
