"""Image and video probes: size, frames and fps from headers and containers, no pixel decoded.

Used by scan (manifest rows), jsonrecords (records outside shards) and the training reader.
"""

from __future__ import annotations

import io

import imagesize
from PIL import Image

from . import exif

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
VIDEO_EXTS = frozenset({"mp4", "avi", "mov", "mkv", "webm", "m4v"})

_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP",
                "tif": "TIFF", "tiff": "TIFF"}

# formats whose size imagesize reads exactly as Pillow does (tests/test_manifest.py compares them); it reads
# less than Pillow's lazy open, which parses every marker table before the frame header
_FAST_FORMATS = {"JPEG", "PNG", "WEBP", "GIF"}
_JPEG_EXTS = frozenset({"jpg", "jpeg"})
_MAX_PIXELS = 2 * (Image.MAX_IMAGE_PIXELS or 0) or None  # Pillow refuses more (DecompressionBombError)

try:  # imagesize.get() first checks its argument against a typing.Protocol, which on Python 3.11 costs as
    # much as the header parse; the reader beneath it takes our file object as is (version pinned < 3)
    from imagesize.imagesize import _read_image_metadata

    def _header_size(src) -> tuple[int, int]:
        try:
            m = _read_image_metadata(src, size=True, dpi=False, colors=False, rotation=False, channels=False)
        except Exception:  # imagesize's own contract: unreadable means (-1, -1)
            return -1, -1
        return m.width, m.height
except ImportError:  # pragma: no cover - a later imagesize without the helper

    def _header_size(src) -> tuple[int, int]:
        return imagesize.get(src, exif_rotation=False)


def probe_image(data_or_file, ext: str = "") -> tuple[int, int]:
    """Width and height as transformers' ``load_image`` gives the image (its EXIF orientation applied, so 5-8
    swap them; core/exif.py), no pixel decoded: the stored size from imagesize for the common formats, Pillow's
    lazy open for the rest and for anything imagesize cannot read (so a bad image gets Pillow's own error).
    Raises ``exif.Truncated`` when given a prefix of the file that ends inside the header."""
    if ext in _JPEG_EXTS and isinstance(data_or_file, bytes) and (plain := exif.jpeg_header(data_or_file)):
        w, h, turn = plain  # the common case in one walk; the same answer as the readers below (exif.py)
        if w > 0 and h > 0 and (_MAX_PIXELS is None or w * h <= _MAX_PIXELS):
            return (h, w) if exif.swaps(turn) else (w, h)
    src = io.BytesIO(data_or_file) if isinstance(data_or_file, bytes) else data_or_file
    w, h = _stored_size(src, _PIL_FORMATS.get(ext))
    return (h, w) if exif.swaps(exif.orientation(src, _format(src, ext))) else (w, h)


def _format(src, ext: str) -> str:
    """Pillow's name of the format by the file's signature (the extension may lie), else by the extension."""
    src.seek(0)
    head = src.read(16)
    if head.startswith(b"\xff\xd8"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return _PIL_FORMATS.get(ext, "") if head else ""


def _stored_size(src, fmt: str | None) -> tuple[int, int]:
    """Width and height as stored (before any EXIF orientation)."""
    if fmt in _FAST_FORMATS:
        w, h = _header_size(src)  # (-1, -1) when it cannot tell
        if w > 0 and h > 0 and (_MAX_PIXELS is None or w * h <= _MAX_PIXELS):
            return w, h
        src.seek(0)
    try:  # trying the extension's plugin first saves the probe of every other format
        im = Image.open(src, formats=[fmt]) if fmt else Image.open(src)
    except Exception:
        if not fmt:
            raise
        src.seek(0)
        im = Image.open(src)  # the extension lied (a PNG named .jpg): let Pillow find the format
    with im:
        w, h = im.size
    if w <= 0 or h <= 0:
        raise ValueError(f"image size {w}x{h}")
    return w, h


def probe_video(fileobj) -> dict:
    """Frames, fps, size and duration from the container; count packets where the header says 0 frames."""
    import av  # PyAV bundles FFmpeg; imported lazily because text-only runs never need it

    with av.open(fileobj, mode="r") as c:
        if not c.streams.video:
            raise ValueError("no video stream")
        s = c.streams.video[0]
        fps = float(s.average_rate or s.guessed_rate or 0) or None
        frames = int(s.frames or 0)
        duration = float(s.duration * s.time_base) if s.duration and s.time_base else None
        if duration is None and c.duration:
            duration = c.duration / 1_000_000
        if frames <= 0:
            frames = sum(1 for p in c.demux(s) if p.size)
        width, height = s.codec_context.width, s.codec_context.height
    if frames <= 0 or not width or not height:
        raise ValueError(f"video stream reports {frames} frames of {width}x{height}")
    if fps is None:
        fps = frames / duration if duration else 24.0
    return {"frames": frames, "fps": fps, "width": width, "height": height, "duration": duration}
