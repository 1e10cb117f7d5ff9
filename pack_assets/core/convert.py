"""ShareGPT / LLaVA / "messages" JSON or JSONL datasets plus media folders -> WebDataset shards.

Each record becomes one sample keyed by its position (`000000042`): `<key>.json` (the record, its media
paths rewritten to the member names) and its media as `<key>.img0.jpg`, `<key>.vid0.mp4`, ... in the order
the conversation uses them. Shards are written with fixed tar headers, atomically, so the same input gives
the same bytes. Records whose media is missing, remote or of a kind we do not pack are listed with a reason
in `<out>/convert_rejected.jsonl`, never silently skipped.
"""

from __future__ import annotations

import copy
import json
import os
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .ingest import iter_records
from .media import IMAGE_EXTS, VIDEO_EXTS
from .reasons import ReasonError
from .safety import mkstemp
from .tario import add_member

_IMAGE_KEYS = ("image", "image_url", "image_path")
_VIDEO_KEYS = ("video", "video_url", "video_path")
_AUDIO_FIELDS = ("audio", "audios")


def _part_ref(part: dict) -> tuple[str, str] | None:
    """(kind, path) of a typed content part that carries media, e.g. {"type": "image", "image": "a.jpg"}."""
    kind = part.get("type", "")
    is_image = kind in ("image", "image_url") or any(k in part for k in ("image", "image_url"))
    is_video = kind in ("video", "video_url") or any(k in part for k in ("video", "video_url"))
    if not (is_image or is_video):
        return None
    for k in (*(_IMAGE_KEYS if is_image else _VIDEO_KEYS), "path", "url", "value", "content"):
        v = part.get(k)
        if isinstance(v, dict):
            v = v.get("url") or v.get("path")
        if isinstance(v, str) and v:
            return ("image" if is_image else "video"), v
    return ("image" if is_image else "video"), ""


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]


@dataclass
class Converted:
    record: dict
    media: list[tuple[str, Path]]  # (member part name, source file)


def _locate(ref: str, roots: list[Path]) -> Path:
    if Path(ref).is_absolute():
        return Path(ref)
    for root in roots:
        if (root / ref).is_file():
            return root / ref
    return roots[0] / ref


def convert_record(rec, roots: list[Path]) -> Converted:
    """The record with its media resolved to files and renamed to member parts (or a ReasonError)."""
    if not isinstance(rec, dict):
        raise ReasonError("not_an_object", f"record is a {type(rec).__name__}")
    if any(rec.get(f) for f in _AUDIO_FIELDS):
        raise ReasonError("unsupported_media", "audio is not packed")
    rec = copy.deepcopy(rec)
    refs: list[tuple[str, str, dict | None]] = []  # (kind, path, typed part holding it)
    for turns in (rec.get("messages"), rec.get("conversations")):
        for turn in turns or []:
            content = turn.get("content") if isinstance(turn, dict) else None
            for part in content if isinstance(content, list) else []:
                ref = _part_ref(part) if isinstance(part, dict) else None
                if ref:
                    refs.append((*ref, part))
    if not refs:  # LLaVA / LLaMA-Factory fields, placeholders in the text
        refs = [("image", p, None) for p in _as_list(rec.pop("image", None)) + _as_list(rec.pop("images", None))]
        refs += [("video", p, None) for p in _as_list(rec.pop("video", None)) + _as_list(rec.pop("videos", None))]
    media: list[tuple[str, Path]] = []
    names: dict[str, list[str]] = {"image": [], "video": []}
    for kind, ref, part in refs:
        if not ref or ref.startswith(("http://", "https://", "data:", "s3://", "gs://")):
            raise ReasonError("remote_media", f"{kind} {ref[:80]!r} is not a local file")
        path = _locate(ref, roots)
        if not path.is_file():
            raise ReasonError("missing_media", f"{kind} file {str(path)!r} does not exist")
        ext = path.suffix.lower().lstrip(".")
        if ext not in (IMAGE_EXTS if kind == "image" else VIDEO_EXTS):
            raise ReasonError("unsupported_media", f"{kind} {path.name!r}: extension .{ext} is not a packed {kind} type")
        name = f"{'img' if kind == 'image' else 'vid'}{len(names[kind])}.{ext}"
        names[kind].append(name)
        media.append((name, path))
        if part is not None:  # the typed part now names the member, not a path on this machine
            for k in list(part):
                if k != "type":
                    part.pop(k)
            part["type"] = kind
    rec.pop("audios", None)
    if names["image"]:
        rec["images"] = names["image"]
    if names["video"]:
        rec["videos"] = names["video"]
    for k in ("image", "video"):
        rec.pop(k, None)
    return Converted(rec, media)


def convert(inputs: list[Path], out_dir: Path, media_roots: list[Path] | None = None, samples_per_shard: int = 1000,
            max_shard_bytes: int = 1 << 30, prefix: str = "shard") -> dict:
    """Convert every record; relative media paths are looked up in each media root in turn (default: the
    input file's folder). Returns counts per outcome and the shard paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rejected: list[dict] = []
    shards: list[str] = []
    state = {"tf": None, "tmp": None, "n": 0, "bytes": 0}

    def close() -> None:
        if state["tf"] is not None:
            state["tf"].close()
            final = out_dir / f"{prefix}-{len(shards):06d}.tar"
            os.replace(state["tmp"], final)
            shards.append(str(final))
            state.update(tf=None, tmp=None, n=0, bytes=0)

    index = 0
    converted = 0
    for path in inputs:
        roots = list(media_roots or []) or [path.parent]
        for rec in iter_records(path):
            key = f"{index:09d}"
            index += 1
            try:
                c = convert_record(rec, roots)
            except ReasonError as e:
                rid = rec.get("id") if isinstance(rec, dict) else None
                rejected.append({"file": str(path), "index": index - 1, "id": rid, "reason": e.reason, "detail": e.detail})
                continue
            c.record["origin"] = {"file": path.name, "index": index - 1}
            blobs = [(f"{key}.json", json.dumps(c.record, ensure_ascii=False).encode())]
            blobs += [(f"{key}.{name}", src.read_bytes()) for name, src in c.media]
            size = sum(len(b) for _, b in blobs)
            if state["tf"] is not None and (state["n"] >= samples_per_shard or state["bytes"] + size > max_shard_bytes):
                close()
            if state["tf"] is None:
                fd, tmp = mkstemp(prefix=".convert.tmp-", dir=out_dir)  # ends 0644 under umask 022, not 0600
                os.close(fd)
                state.update(tf=tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT), tmp=tmp)
            for name, data in blobs:
                add_member(state["tf"], name, data)
            state["n"] += 1
            state["bytes"] += size
            converted += 1
    close()
    (out_dir / "convert_rejected.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rejected))
    return {"records": index, "converted": converted, "rejected": len(rejected),
            "reasons": dict(Counter(r["reason"] for r in rejected)), "shards": shards,
            "rejected_file": str(out_dir / "convert_rejected.jsonl")}
