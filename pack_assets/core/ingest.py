"""Records outside shards (ShareGPT / LLaVA / messages JSON or JSONL with a media folder)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from .conversation import media_refs, normalize, place_media
from .media import probe_image, probe_video
from .profiles import resolve_profile
from .reasons import ReasonError
from .tokens import TokenCounter


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


def count_records(path: Path, media_root: Path | None, profile: str | None, model_dir: str | None,
                  trust_remote_code: bool = False, chat_template_kwargs: str | dict = "") -> list[dict]:
    """One result per record: counts (``counted_by`` names the rule), or an ``error`` reason with detail."""
    counter = TokenCounter(resolve_profile(profile, model_dir, trust_remote_code, chat_template_kwargs))
    out: list[dict] = []
    items: list[tuple] = []
    ids: list = []
    for n, rec in enumerate(iter_records(path)):
        rid = rec.get("id", n) if isinstance(rec, dict) else n
        try:
            if not isinstance(rec, dict):
                raise ReasonError("json_not_object", f"record {n} is a {type(rec).__name__}")
            refs = media_refs(rec)
            sizes, videos = [], []
            for r in refs.images:
                sizes.append(list(probe_image(_resolve(media_root, path.parent, r).read_bytes())))
            for r in refs.videos:
                videos.append(probe_video(str(_resolve(media_root, path.parent, r))))
            messages = place_media(normalize(rec), len(sizes), len(videos))
        except ReasonError as e:
            out.append({"id": rid, "error": e.reason, "detail": e.detail})
            continue
        except OSError as e:
            out.append({"id": rid, "error": "missing_media", "detail": str(e)})
            continue
        except Exception as e:  # Pillow/PyAV decode errors
            out.append({"id": rid, "error": "bad_media", "detail": f"{type(e).__name__}: {e}"})
            continue
        out.append({"id": rid})
        items.append((messages, sizes, videos))
        ids.append(len(out) - 1)
    for i, res in zip(ids, counter.count_many(items)):
        if isinstance(res, ReasonError):
            out[i].update(error=res.reason, detail=res.detail)
        else:
            out[i].update(res)
    return out
