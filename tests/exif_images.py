"""Images with an EXIF (or XMP) orientation, made deterministically with Pillow: shared by tests/test_exif.py,
the families' rotated-image tests and scripts/make_oracle.py (whose oracle records each image by its stored
size, format and orientation, which alone decide a count)."""

from __future__ import annotations

import io

from PIL import Image

# stored (width, height): non-square sizes where orientation changes the count of some family (LLaVA-OneVision's
# anyres grid and unpadding, InternVL's tile grid near a boundary, Qwen's rounding), and a square one
ROTATED_SIZES = ((800, 300), (1000, 448), (1344, 900), (641, 1333), (512, 512))
# other containers of an orientation: (format, extension, how)
OTHER_CARRIERS = (("PNG", "png", "exif"), ("PNG", "png", "xmp"), ("WEBP", "webp", "exif"), ("JPEG", "jpg", "xmp"))


def _exif(orientation: int, pad: int = 0) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = orientation
    if pad:
        ex[0x010E] = "x" * pad  # ImageDescription: makes the APP1 segment as long as a phone's thumbnail
    return ex.tobytes()


def _xmp(orientation: int) -> bytes:
    return (f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            f'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="{orientation}"/>'
            f'</rdf:RDF></x:xmpmeta>').encode()


def oriented_image(fmt: str, orientation: int, w: int = 120, h: int = 50, how: str = "exif") -> bytes:
    """An image stored as ``w`` x ``h`` whose metadata says ``orientation`` (``how``: "exif", "xmp", or "big":
    EXIF padded to ~40 KB, past the scan's header prefix)."""
    im = Image.new("RGB", (w, h), (200, 30, 30))
    buf = io.BytesIO()
    if how == "xmp" and fmt == "PNG":
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        info.add_itxt("XML:com.adobe.xmp", _xmp(orientation).decode())
        im.save(buf, fmt, pnginfo=info)
    elif how == "xmp":
        im.save(buf, fmt, xmp=_xmp(orientation))
    else:
        im.save(buf, fmt, exif=_exif(orientation, 40_000 if how == "big" else 0))
    return buf.getvalue()


def rotated_cases() -> list[dict]:
    """Every stored size in every orientation 1-8 as JPEG, then the other carriers at orientation 6."""
    cases = [{"format": "JPEG", "ext": "jpg", "how": "exif", "stored": list(s), "orientation": o}
             for s in ROTATED_SIZES for o in range(1, 9)]
    cases += [{"format": f, "ext": e, "how": how, "stored": [800, 300], "orientation": 6}
              for f, e, how in OTHER_CARRIERS]
    return cases
