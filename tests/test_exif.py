"""EXIF orientation as transformers' load_image applies it (issue 36, item 4): the probe's size equals
``load_image(...).size`` for every orientation 1-8 in JPEG (EXIF, XMP, a large EXIF past the scan's header
prefix), PNG (eXIf, XMP), WebP and TIFF, and a scanned shard records that size."""

from __future__ import annotations

import io
import json

import pytest
from conftest import write_tar
from exif_images import oriented_image as image
from PIL import Image

from pack_assets.core.media import probe_image


def loaded(data: bytes) -> tuple[int, int]:
    from transformers.image_utils import load_image

    return load_image(Image.open(io.BytesIO(data))).size


CASES = [("JPEG", "jpg", "exif"), ("JPEG", "jpg", "xmp"), ("JPEG", "jpg", "big"), ("PNG", "png", "exif"),
         ("PNG", "png", "xmp"), ("WEBP", "webp", "exif"), ("TIFF", "tif", "exif")]


@pytest.mark.parametrize("fmt,ext,how", CASES)
def test_the_probe_sees_the_image_as_load_image_does(fmt, ext, how):
    for o in range(1, 9):
        data = image(fmt, o, how=how)
        assert probe_image(data, ext) == loaded(data), (fmt, how, o)
        if fmt != "TIFF":  # Pillow loses a TIFF's orientation on load: load_image does not turn it
            assert probe_image(data, ext) == ((50, 120) if o >= 5 else (120, 50))


def test_a_scanned_shard_records_the_oriented_size(tmp_path):
    """Through the scan: a header prefix that ends inside a large EXIF block is read again whole."""
    from pack_assets.core.scan import scan_shard

    members = []
    for o, how in ((6, "big"), (8, "exif"), (3, "exif"), (5, "xmp")):
        rec = {"conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "ok"}]}
        members += [(f"k{o}.json", json.dumps(rec)), (f"k{o}.jpg", image("JPEG", o, 800, 300, how))]
    members += [("kp.json", json.dumps(rec)), ("kp.png", image("PNG", 7, 800, 300))]
    shard = write_tar(tmp_path / "s.tar", members)
    rows = {s.key: s.image_sizes for s in scan_shard(shard, "s") if hasattr(s, "image_sizes")}
    assert rows == {"k6": [[300, 800]], "k8": [[300, 800]], "k3": [[800, 300]], "k5": [[300, 800]], "kp": [[300, 800]]}


def _two_readers(data: bytes) -> tuple[int, int]:
    """The probe without its one-walk JPEG path: imagesize's size, then exif.py's orientation reader."""
    from pack_assets.core import exif, media

    src = io.BytesIO(data)
    w, h = media._stored_size(src, "JPEG")
    return (h, w) if exif.swaps(exif.orientation(src, media._format(src, "jpg"))) else (w, h)


def test_the_one_walk_jpeg_path_answers_as_the_two_readers_do():
    """exif.jpeg_header (size and orientation in one walk) against the two readers it stands in for, on every
    orientation and carrier, a progressive and a grey JPEG, and damaged copies: cut short, a byte flipped in the
    header, fill bytes, a second frame header. Where it is unsure it must say so (None), never differ."""
    import random

    from pack_assets.core.exif import jpeg_header

    def outcome(fn, data):
        try:
            return fn(data)
        except Exception as e:  # the probe's error is part of its answer (a bad_image row)
            return type(e).__name__

    def plain(mode: str, **kw) -> bytes:
        buf = io.BytesIO()
        Image.new(mode, (90, 40), 128).save(buf, "JPEG", **kw)
        return buf.getvalue()

    good = [image("JPEG", o, how=how) for o in range(1, 9) for how in ("exif", "xmp", "big")]
    good += [plain("RGB", progressive=True), plain("L"), plain("CMYK")]
    rng, seen_fast = random.Random(41), 0
    for data in good:
        sos = data.index(b"\xff\xda")
        variants = [data, data[:sos + 1], data[:40], data[:2] + b"\xff" + data[2:],
                    data[:sos] + data[2:sos] + data[sos:]]  # the header's segments twice: a second frame header
        for _ in range(12):
            k = rng.randrange(2, sos + 4)
            variants.append(data[:k] + bytes([rng.randrange(256)]) + data[k + 1:])
        for v in variants:
            fast = jpeg_header(v)
            if fast is not None:
                seen_fast += 1
                w, h, turn = fast
                assert ((h, w) if turn in (5, 6, 7, 8) else (w, h)) == outcome(_two_readers, v)
            assert outcome(lambda d: probe_image(d, "jpg"), v) == outcome(_two_readers, v)
    assert seen_fast > len(good)  # the plain images (and some damaged ones) take the one walk
