"""Records outside shards (ShareGPT / LLaVA / messages JSON or JSONL with a media folder): read, their media
found and probed, their messages normalized. `convert` writes them into shards; `pack-assets count` counts
them (core/counting/count.py); the drift guard recounts them with the real processor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .conversation import media_refs, normalize, place_media
from .media import probe_image, probe_video
from .reasons import ReasonError


def iter_records(path: Path) -> Iterator[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)
        return
    data = json.loads(text)
    yield from (data if isinstance(data, list) else [data])


def _resolve(media_root: Path | None, base: Path, ref: str) -> Path:
    if ref.startswith("file://"):  # a local file given as a URL (inline parts' "url" / "image_url")
        ref = ref[len("file://"):]
    elif ref.startswith(("http://", "https://", "data:", "s3://", "gs://")):
        raise ReasonError("remote_media", f"{ref[:80]!r} is not a local file; nothing is downloaded")
    p = Path(ref)
    if p.is_absolute():
        return p
    return (media_root or base) / p


@dataclass(frozen=True)
class RecordItem:
    """One record read from a JSON(L) file: its messages with the media placed, the media files it names
    (resolved) and their probed sizes and video metadata; or why it cannot be counted (``error``, ``detail``)."""

    id: object
    messages: list[dict] | None = None
    image_paths: tuple[Path, ...] = ()
    video_paths: tuple[Path, ...] = ()
    sizes: list | None = None
    videos: list | None = None
    error: str = ""
    detail: str = ""


def record_items(path: Path, media_root: Path | None) -> Iterator[RecordItem]:
    """Each record of the file as a RecordItem, in order."""
    for n, rec in enumerate(iter_records(path)):
        rid = rec.get("id", n) if isinstance(rec, dict) else n
        try:
            if not isinstance(rec, dict):
                raise ReasonError("json_not_object", f"record {n} is a {type(rec).__name__}")
            refs = media_refs(rec)
            images = tuple(_resolve(media_root, path.parent, r) for r in refs.images)
            videos = tuple(_resolve(media_root, path.parent, r) for r in refs.videos)
            sizes = [list(probe_image(p.read_bytes())) for p in images]
            metas = [probe_video(str(p)) for p in videos]
            messages = place_media(normalize(rec), len(sizes), len(metas))
        except ReasonError as e:
            yield RecordItem(rid, error=e.reason, detail=e.detail)
            continue
        except OSError as e:
            yield RecordItem(rid, error="missing_media", detail=str(e))
            continue
        except Exception as e:  # Pillow/PyAV decode errors
            yield RecordItem(rid, error="bad_media", detail=f"{type(e).__name__}: {e}")
            continue
        yield RecordItem(rid, messages, images, videos, sizes, metas)
