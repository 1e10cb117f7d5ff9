"""An image's EXIF orientation as transformers' ``load_image`` applies it, read from the header.

``load_image`` calls Pillow's ``ImageOps.exif_transpose``: after a full load, ``getexif()`` gives the
orientation (the EXIF IFD0 tag, else an XMP ``tiff:Orientation``), and 5-8 turn the image by a quarter, so
its width and height swap (2-4 flip or turn it half way: same size). Decoding every image to learn that would
cost a scan its speed, so each format is read as Pillow reads it, without the pixels:

- JPEG: the marker segments up to the start of scan, walked with Pillow's own marker table (its handlers all
  read a length and skip it), keeping what its ``APP`` handler keeps: every ``Exif`` APP1 (concatenated, as
  Pillow does) and the last XMP APP1. Any marker Pillow would refuse: Pillow itself decides.
- PNG: ``getexif()`` loads the image unless an ``eXIf`` came before the pixels, because chunks after them may
  hold the orientation. It can only come from an ``eXIf`` chunk or a text chunk keyed ``Raw profile type
  exif`` / ``XML:com.adobe.xmp``: a PNG with none of them anywhere has orientation 1; one with them is loaded
  by Pillow (rare, exact).
- WebP: the orientation comes from an ``EXIF`` or ``XMP `` chunk (libwebp's demuxer finds them whatever the
  ``VP8X`` flags say): a file with neither has orientation 1; one with them is loaded by Pillow.
- anything else (TIFF, GIF, BMP, ...): Pillow's own load and ``getexif()``, as
  ``exif_transpose`` calls them (a TIFF, once loaded, reports no orientation: transformers does not turn it).
"""

from __future__ import annotations

import functools
import io
import re
import struct

from PIL import Image

ORIENTATION = 0x0112
_XMP = re.compile(rb'tiff:Orientation(="|>)([0-9])')  # Pillow's pattern (Image.getexif)
_PNG_KEYS = (b"Raw profile type exif", b"XML:com.adobe.xmp")


class _Unsure(Exception):
    """The header is not what the fast reader expects: let Pillow decide."""


class Truncated(ValueError):
    """The bytes end before the header does (a prefix of the file): read the whole file."""


def swaps(orientation: int) -> bool:
    """Whether exif_transpose turns the image by a quarter (width and height swap)."""
    return orientation in (5, 6, 7, 8)


def orientation(src, fmt: str) -> int:
    """``src``: a seekable binary file at any position; ``fmt``: Pillow's format name if known ("" if not).
    Raises ``Truncated`` when ``src`` ends inside the header."""
    try:
        if fmt == "JPEG":
            return _jpeg(src)
        if fmt == "PNG":
            return _png(src)
        if fmt == "WEBP":
            return _webp(src)
    except Truncated:
        raise
    except Exception:  # _Unsure, or a header the fast reader cannot parse: Pillow decides (or refuses)
        pass
    return _pillow(src)


def _pillow(src) -> int:
    """Exactly what exif_transpose does: load, then getexif (loading changes what some formats report: a
    PNG's chunks after the pixels are read; a TIFF's orientation is no longer found)."""
    src.seek(0)
    with Image.open(src) as im:
        im.load()
        return int(im.getexif().get(ORIENTATION, 1) or 1)


def _from(exif: bytes, xmp: bytes | None) -> int:
    ex = Image.Exif()
    if exif:
        ex.load(exif)
    value = ex.get(ORIENTATION)
    if value is None and xmp and (m := _XMP.search(xmp)):
        value = int(m[2])
    return int(value or 1)


@functools.cache
def _markers() -> dict:
    """Pillow's JPEG marker table, its plugin imported on first use (not by an import statement per image)."""
    from PIL.JpegImagePlugin import MARKER

    return MARKER


def _jpeg(f) -> int:
    MARKER = _markers()  # noqa: N806 (Pillow's name)
    f.seek(0)
    if f.read(3)[:2] != b"\xff\xd8":
        raise _Unsure
    exif, xmp, s = b"", None, b"\xff"
    while s:
        if s[0] != 0xFF:
            s = f.read(1)
            continue
        s += f.read(1)
        if len(s) < 2:
            break
        i = (s[0] << 8) | s[1]
        if i in MARKER:
            if MARKER[i][2] is not None:  # every handler reads a 16-bit length, then that many bytes
                head = f.read(2)
                if len(head) < 2:
                    raise Truncated("the JPEG header ends inside a segment")
                n = struct.unpack(">H", head)[0] - 2
                if i == 0xFFE1:
                    payload = f.read(n)
                    if len(payload) < n:
                        raise Truncated("the JPEG header ends inside an APP1 segment")
                    if payload.startswith(b"Exif\0\0"):
                        exif = exif + payload[6:] if exif else payload
                    elif payload.startswith(b"http://ns.adobe.com/xap/1.0/\x00"):
                        xmp = payload.split(b"\x00", 1)[1]
                else:
                    f.seek(n, io.SEEK_CUR)
            if i == 0xFFDA:
                return _from(exif, xmp)
            s = f.read(1)
        elif i in (0, 0xFFFF):
            s = b"\xff"
        elif i == 0xFF00:
            s = f.read(1)
        else:
            raise _Unsure
    raise Truncated("the JPEG header ends before its start of scan")


_NO_SOF = (0xC4, 0xC8, 0xCC)  # in 0xC0-0xCF but not a frame header (imagesize's _JPEG_NO_SOF_MARKERS)


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """A whole JPEG's stored width, height and EXIF orientation in one walk over its bytes, or None when the
    header is anything but plain (a marker without a length, fill bytes, a short segment, the bytes end
    before the start of scan): then ``media.probe_image``'s two readers decide, as before. On a plain header
    both of them visit exactly these segments: imagesize takes the first frame header's size, ``_jpeg`` the
    Exif/XMP APP1s before the start of scan; this gives the same, without a file object or a read per byte."""
    MARKER = _markers()  # noqa: N806 (Pillow's name)
    end, pos, size, exif, xmp = len(data), 3, None, b"", None
    if data[:3] != b"\xff\xd8\xff" or end < 5 or data[3] == 0xFF:
        return None
    marker = data[3]
    while True:
        handler = MARKER.get(0xFF00 | marker)
        if handler is None or handler[2] is None or pos + 3 > end:
            return None
        n = ((data[pos + 1] << 8) | data[pos + 2]) - 2
        start, pos = pos + 3, pos + 3 + n
        if n < 0 or pos > end:
            return None
        if marker == 0xDA:
            break
        if 0xC0 <= marker <= 0xCF and marker not in _NO_SOF and size is None:
            if n < 6:
                return None
            size = ((data[start + 3] << 8) | data[start + 4], (data[start + 1] << 8) | data[start + 2])
        elif marker == 0xE1:
            payload = data[start:pos]
            if payload.startswith(b"Exif\0\0"):
                exif = exif + payload[6:] if exif else payload
            elif payload.startswith(b"http://ns.adobe.com/xap/1.0/\x00"):
                xmp = payload.split(b"\x00", 1)[1]
        if pos + 1 >= end or data[pos] != 0xFF or data[pos + 1] == 0xFF:
            return None
        pos += 1
        marker = data[pos]
    if size is None:
        return None
    if not exif and xmp is None:  # what _from gives for no metadata, without building an empty Exif
        return size[0], size[1], 1
    try:
        return size[0], size[1], _from(exif, xmp)
    except Exception:  # EXIF that Pillow's parser refuses: orientation() hands the image to Pillow itself
        return None


def _png(f) -> int:
    f.seek(8)
    while True:
        head = f.read(8)
        if len(head) < 8:
            raise Truncated("the PNG ends before its IEND chunk")
        n, kind = struct.unpack(">I4s", head)
        if kind == b"eXIf":
            raise _Unsure
        if kind in (b"tEXt", b"zTXt", b"iTXt"):
            key = f.read(min(n, 80)).split(b"\0", 1)[0]
            if key in _PNG_KEYS:
                raise _Unsure
            f.seek(n - min(n, 80) + 4, io.SEEK_CUR)
            continue
        if kind == b"IEND":
            return 1
        f.seek(n + 4, io.SEEK_CUR)


def _webp(f) -> int:
    f.seek(0)
    head = f.read(12)
    if head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        raise _Unsure
    end = 8 + struct.unpack("<I", head[4:8])[0]
    pos = 12
    while pos + 8 <= end:
        f.seek(pos)
        chunk = f.read(8)
        if len(chunk) < 8:
            raise Truncated("the WebP ends inside its chunk list")
        kind, n = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if kind in (b"EXIF", b"XMP "):
            raise _Unsure
        pos += 8 + n + (n & 1)
    return 1
