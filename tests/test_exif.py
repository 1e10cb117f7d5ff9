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
