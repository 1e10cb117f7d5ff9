"""Manifest stage: WebDataset key grouping, offsets/sizes/sha256 against tarfile, and a reason for every reject."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import add, chat, image_bytes, write_tar

from pack_assets.core import store
from pack_assets.core.demo import video_bytes
from pack_assets.core.reasons import ReasonError
from pack_assets.core.records import Rejection, Sample
from pack_assets.core.scan import ScanOptions, run_manifest, scan_shard
from pack_assets.core.tario import header_sum, iter_entries, split_key


def scan(path: Path, **opts) -> tuple[list[Sample], list[Rejection]]:
    recs = list(scan_shard(path, "shard", ScanOptions(**opts)))
    return [r for r in recs if isinstance(r, Sample)], [r for r in recs if isinstance(r, Rejection)]


def reasons(rejections) -> dict[str | None, str]:
    return {r.key: r.reason for r in rejections}


@pytest.mark.parametrize(
    "name, key, part",
    [
        ("000123.jpg", "000123", "jpg"),
        ("a/b/000123.img1.jpg", "a/b/000123", "img1.jpg"),
        ("dir.v2/x.y.z.json", "dir.v2/x", "y.z.json"),
        ("noext", "noext", ""),
    ],
)
def test_key_is_path_up_to_first_dot_of_basename(name, key, part):
    assert split_key(name) == (key, part)


def test_offsets_sizes_and_hashes_match_an_independent_tarfile_reading(dataset):
    path = dataset / "part-000.tar"
    samples, _ = scan(path)
    ours = {m.name: m for s in samples for m in s.members}
    with tarfile.open(path) as tf:
        for ti in tf.getmembers():
            if ti.name.startswith("bad"):
                continue
            data = tf.extractfile(ti).read()
            m = ours.pop(ti.name)
            assert (m.offset, m.size, m.sha256) == (ti.offset_data, ti.size, hashlib.sha256(data).hexdigest())
            with open(path, "rb") as f:
                f.seek(m.offset)
                assert f.read(m.size) == data
    # the bad sample's member is recorded too
    assert set(ours) == {"bad0.json"}


def test_samples_group_by_key_and_classify_media(dataset):
    samples, rejections = scan(dataset / "part-000.tar")
    by_key = {s.key: s for s in samples}
    assert len(samples) == 13
    assert by_key["s0_000"].media_type == "text" and by_key["s0_000"].n_images == 0
    assert by_key["s0_001"].media_type == "image" and by_key["s0_001"].image_sizes == [[52, 47]]
    two = by_key["s0_002"]
    assert two.n_images == 2 and two.media_members == ["s0_002.a.png", "s0_002.b.webp"]
    msgs = json.loads(two.conversation)
    assert [p["type"] for p in msgs[0]["content"]] == ["image", "image", "text"]
    assert reasons(rejections) == {"bad0": "invalid_json"}


def test_missing_placeholders_put_media_first_in_the_first_user_turn(tmp_path):
    rec = {"conversations": [{"from": "human", "value": "Describe."}, {"from": "gpt", "value": "A dog."}]}
    path = write_tar(tmp_path / "x.tar", [("k.json", json.dumps(rec)), ("k.jpg", image_bytes())])
    samples, rejections = scan(path)
    assert not rejections
    content = json.loads(samples[0].conversation)[0]["content"]
    assert [p["type"] for p in content] == ["image", "text"]


def test_video_metadata_from_the_container(tmp_path):
    path = write_tar(tmp_path / "v.tar", [("k.json", json.dumps(chat("What happens?"))),
                                          ("k.mp4", video_bytes(10, 64, 48, 5))])
    samples, rejections = scan(path)
    assert not rejections
    v = json.loads(samples[0].videos)[0]
    assert (v["frames"], v["width"], v["height"]) == (10, 64, 48)
    assert abs(v["fps"] - 5) < 1e-6
    assert samples[0].media_type == "video"


def test_image_and_video_sample_counts_as_video(tmp_path):
    rec = {"messages": [{"role": "user", "content": "<image><video>both"}, {"role": "assistant", "content": "ok"}]}
    path = write_tar(tmp_path / "v.tar", [("k.json", json.dumps(rec)), ("k.jpg", image_bytes()),
                                          ("k.mp4", video_bytes(4, 32, 32, 2))])
    samples, _ = scan(path)
    assert samples[0].media_type == "video" and (samples[0].n_images, samples[0].n_videos) == (1, 1)


def _bad_sample_cases(tmp_path: Path):
    big = b"x" * 2048
    return {
        "missing_json": [("k.jpg", image_bytes())],
        "invalid_json": [("k.json", "{")],
        "json_not_object": [("k.json", "[1, 2]")],
        "no_conversation": [("k.json", json.dumps({"id": 3}))],
        "missing_media": [("k.json", json.dumps({**chat(images=1), "image": "other.jpg"}))],
        "placeholder_mismatch": [("k.json", json.dumps(chat(images=2))), ("k.jpg", image_bytes())],
        "bad_image": [("k.json", json.dumps(chat(images=1))), ("k.jpg", b"not an image")],
        "invalid_utf8": [("k.json", b'{"caption": "\xff\xfe"}')],
        "member_too_large": [("k.json", json.dumps(chat())), ("k.bin", big)],
        "bad_video": [("k.json", json.dumps(chat())), ("k.mp4", b"\x00" * 100)],
    }


@pytest.mark.parametrize("reason", list(_bad_sample_cases(Path("."))))
def test_each_bad_sample_class_is_rejected_with_its_reason_and_neighbours_survive(tmp_path, reason):
    members = [("a.json", json.dumps(chat()))] + _bad_sample_cases(tmp_path)[reason] + [("z.json", json.dumps(chat()))]
    samples, rejections = scan(write_tar(tmp_path / "x.tar", members), max_member_bytes=1024)
    assert reasons(rejections) == {"k": reason}
    assert {s.key: s.status for s in samples} == {"a": "ok", "k": "rejected", "z": "ok"}


def test_zero_byte_image_is_rejected(tmp_path):
    samples, rejections = scan(write_tar(tmp_path / "x.tar", [("k.json", json.dumps(chat(images=1))), ("k.jpg", b"")]))
    assert reasons(rejections) == {"k": "bad_image"}


def test_duplicate_key_within_a_shard(tmp_path):
    path = write_tar(tmp_path / "x.tar", [("k.json", json.dumps(chat())), ("m.json", json.dumps(chat())),
                                          ("k.json", json.dumps(chat("again")))])
    samples, rejections = scan(path)
    assert [r.reason for r in rejections] == ["duplicate_key"]
    assert len(samples) == 3 and len({s.sample_id for s in samples}) == 3


def test_unsafe_names_links_and_devices_are_rejected_never_followed(tmp_path):
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        add(tf, "ok.json", json.dumps(chat()))
        add(tf, "../evil.json", json.dumps(chat()))
        add(tf, "/abs.json", json.dumps(chat()))
        link = tarfile.TarInfo("lnk.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
        dev = tarfile.TarInfo("dev.json")
        dev.type = tarfile.CHRTYPE
        tf.addfile(dev)
    samples, rejections = scan(path)
    assert reasons(rejections) == {"../evil": "unsafe_member_name", "/abs": "unsafe_member_name",
                                   "lnk": "unsupported_member_type", "dev": "unsupported_member_type"}
    assert [s.key for s in samples if s.status == "ok"] == ["ok"]


def test_truncated_tar_keeps_the_samples_before_the_break(tmp_path):
    path = write_tar(tmp_path / "x.tar", [(f"{i:03d}.json", json.dumps(chat("q" * 3000))) for i in range(6)])
    data = path.read_bytes()
    cut = tmp_path / "cut.tar"
    with tarfile.open(path) as tf:
        fourth = tf.getmembers()[3]
    cut.write_bytes(data[: fourth.offset_data + 100])  # inside the 4th sample's payload
    samples, rejections = scan(cut)
    assert [s.key for s in samples if s.status == "ok"] == ["000", "001", "002"]
    assert reasons(rejections) == {"003": "truncated_tar"}


def test_a_header_claiming_more_bytes_than_the_file_holds(tmp_path):
    path = tmp_path / "x.tar"
    ti = tarfile.TarInfo("k.json")
    ti.size = 4 << 30
    path.write_bytes(ti.tobuf(tarfile.GNU_FORMAT) + b"{}" + b"\0" * 510)
    samples, rejections = scan(path)
    assert reasons(rejections) == {"k": "truncated_tar"}


@pytest.mark.parametrize(
    "content, reason",
    [(b"", "empty_shard"), (b"\0" * 10240, "empty_shard"), (b"\x1f\x8b\x08\x00" + b"\0" * 600, "compressed_tar"),
     (b"\x28\xb5\x2f\xfd" + b"\0" * 600, "compressed_tar"), (b"hello world, not a tar at all" * 40, "not_a_tar")],
)
def test_shard_level_problems_give_one_reason_row(tmp_path, content, reason):
    path = tmp_path / "x.tar"
    path.write_bytes(content)
    samples, rejections = scan(path)
    assert samples == [] and [(r.key, r.reason) for r in rejections] == [(None, reason)]


def test_unreadable_shard(tmp_path):
    samples, rejections = scan(tmp_path / "does-not-exist.tar")
    assert [(r.key, r.reason) for r in rejections] == [(None, "unreadable_shard")]


def test_directories_and_meta_members_are_not_samples(tmp_path):
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w") as tf:
        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        add(tf, "__index__.json", "{}")
        add(tf, "sub/k.json", json.dumps(chat()))
    samples, rejections = scan(path)
    assert [s.key for s in samples] == ["sub/k"] and not rejections


def test_without_hashing_offsets_still_recorded(dataset):
    samples, _ = scan(dataset / "part-000.tar", hash_members=False)
    assert all(m.size > 0 for s in samples for m in s.members)
    # media are not hashed; the record is read anyway, so it is always hashed (an in-place edit must show)
    assert all(m.sha256 is None for s in samples if s.status == "ok" for m in s.members if m.name != s.json_member)
    records = [m for s in samples for m in s.members if m.name == s.json_member]
    with tarfile.open(dataset / "part-000.tar") as tf:
        assert records and all(m.sha256 == hashlib.sha256(tf.extractfile(m.name).read()).hexdigest() for m in records)


def test_manifest_files_and_rerun_skips_unchanged_shard(dataset, tmp_path):
    work = tmp_path / "work"
    first = run_manifest(dataset, work, "part-000")
    assert first.cached is False and first.samples == 13 and first.rejected == 1
    d = store.manifest_dir(work, "part-000")
    assert pq.read_table(d / "samples.parquet").num_rows == 13
    assert pq.read_table(d / "rejected.parquet").to_pylist()[0]["reason"] == "invalid_json"
    assert run_manifest(dataset, work, "part-000").cached is True
    os.utime(dataset / "part-000.tar", ns=(1, 1))  # a changed shard is rescanned
    assert run_manifest(dataset, work, "part-000").cached is False


def test_every_reason_code_is_documented():
    from pack_assets.core.reasons import REASONS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text()
    codes = set(REASONS)
    assert all(f"`{c}`" in doc for c in codes), sorted(c for c in codes if f"`{c}`" not in doc)


def test_the_reason_table_is_the_registry_and_an_unregistered_code_is_refused():
    import re

    from pack_assets.core.reasons import REASONS, ReasonError

    doc = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text()
    table = doc.split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(REASONS)
    e = ReasonError("bad_image", "x.jpg is zero bytes")
    assert (e.reason, e.detail, str(e)) == ("bad_image", "x.jpg is zero bytes", "x.jpg is zero bytes")
    with pytest.raises(LookupError, match="not_a_code"):
        ReasonError("not_a_code", "a typo in a raise")


def _tarfile_view(path: Path) -> list[tuple[str, int, int, int]]:
    with tarfile.open(path) as tf:
        return [(ti.name, ti.offset, ti.offset_data, ti.size) for ti in tf.getmembers() if ti.isfile()]


def _our_view(path: Path) -> list[tuple[str, int, int, int]]:
    from pack_assets.core.tario import iter_entries

    with open(path, "rb") as f:
        return [(e.name, e.header, e.offset, e.size) for e in iter_entries(f, path.stat().st_size) if e.kind == "file"]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_header_reader_agrees_with_tarfile_on_long_and_unicode_names(tmp_path, fmt):
    names = ["k.json", "d" * 60 + "/" + "e" * 60 + ".json", "ünï/cødé.json"]
    if fmt != tarfile.USTAR_FORMAT:
        names.append("x" * 150 + "/" + "y" * 120 + ".json")
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tf:
        for i, n in enumerate(names):
            add(tf, n, "z" * (i * 700))
    assert _our_view(path) == _tarfile_view(path)


def test_a_header_summed_as_signed_chars_is_read_as_tarfile_reads_it(tmp_path):
    """Old tar writers summed the header as signed chars; a non-ASCII name makes the two sums differ."""
    path = tmp_path / "signed.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="utf-8") as tf:
        add(tf, "ünï/k.json", "{}")
        add(tf, "plain/k.json", "[]")
    data = bytearray(path.read_bytes())
    header = bytes(data[:512])
    signed = sum(struct.unpack("148b8x356b", header)) + 256
    assert signed != sum(header[:148]) + sum(header[156:]) + 256
    data[148:156] = b"%06o\0 " % signed
    path.write_bytes(bytes(data))
    assert [n for n, *_ in _tarfile_view(path)] == ["ünï/k.json", "plain/k.json"]
    assert _our_view(path) == _tarfile_view(path)
    data[148:156] = b"%06o\0 " % (signed + 1)  # neither sum: the archive ends at its first header
    path.write_bytes(bytes(data))
    with pytest.raises(tarfile.ReadError):
        _tarfile_view(path)
    with open(path, "rb") as f:
        with pytest.raises(ReasonError) as e:
            list(iter_entries(f, path.stat().st_size))
    assert e.value.reason == "not_a_tar"


def _respelled(header: bytes, size: bytes | None, checksum: str, off: int = 0) -> bytes:
    """The header with its size field replaced (None: kept) and its checksum (plus ``off``) in another spelling."""
    h = bytearray(header)
    if size is not None:
        h[124:136] = size
    h[148:156] = b" " * 8
    h[148:156] = (checksum % (sum(h) + off)).encode("ascii")
    assert len(h) == 512
    return bytes(h)


# (size field, checksum field): the usual spellings take the header reader's direct reads, the others its general
# one (tarfile's rule: up to the first NUL, stripped, octal; base-256 when the high bit is set)
_SPELLINGS = [
    (None, "%06o\0 "),  # the usual ones (tarfile writes them)
    (b"%011o " % 700, "%06o\0 "),  # a size ending in a space, not a NUL
    (b"  %09o\0" % 700, "%07o\0"),  # leading spaces; a seven-digit checksum
    (b"%o\0" % 700 + bytes(12 - len(b"%o\0" % 700)), " %05o\0 "),  # a short size field; a space-led checksum
    (b"\x80" + (700).to_bytes(11, "big"), "%06o  "),  # GNU base-256 size; a checksum without a NUL
    (b"%011o\0" % 700, "%08o"),  # eight digits, no terminator at all
]


@pytest.mark.parametrize("size, checksum", _SPELLINGS)
def test_header_fields_in_any_spelling_tarfile_reads(tmp_path, size, checksum):
    """The size and checksum fields are read as tarfile reads them, whichever of their spellings a writer used."""
    path = tmp_path / "spelled.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        add(tf, "a/k.json", "x" * 700)
        add(tf, "a/k.jpg", "y" * 10)
    data = bytearray(path.read_bytes())
    data[:512] = _respelled(bytes(data[:512]), size, checksum)
    path.write_bytes(bytes(data))
    assert _our_view(path) == _tarfile_view(path) == [("a/k.json", 0, 512, 700), ("a/k.jpg", 1536, 2048, 10)]
    data[:512] = _respelled(bytes(data[:512]), size, checksum, 1)  # a wrong sum: no archive
    path.write_bytes(bytes(data))
    with open(path, "rb") as f:
        with pytest.raises(ReasonError) as e:
            list(iter_entries(f, path.stat().st_size))
    assert e.value.reason == "not_a_tar"


def test_an_all_zero_block_ends_the_archive_and_zero_bytes_with_a_sum_do_not(tmp_path):
    """The end-of-archive blocks are told from a member header by their checksum: an all-zero block never
    matches one (stored 0 against 256), so the walk stops there, and members after it are not read."""
    path = tmp_path / "z.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        add(tf, "a/k.json", "{}")
    data = path.read_bytes()
    trailer: list[int] = []
    with open(path, "rb") as f:
        assert [e.name for e in iter_entries(f, len(data), trailer)] == ["a/k.json"]
    assert trailer == [1024]
    path.write_bytes(data[:1024] + bytes(512) + data[:1024] + bytes(1024))  # a member after one zero block
    trailer = []
    with open(path, "rb") as f:
        assert [e.name for e in iter_entries(f, path.stat().st_size, trailer)] == ["a/k.json"]
    assert trailer == [1024] and [n for n, *_ in _tarfile_view(path)] == ["a/k.json"]


def test_header_reader_agrees_with_tarfile_on_real_fixture_archives():
    tars = sorted((Path(__file__).resolve().parent / "fixtures" / "datasets").glob("**/*.tar"))
    assert len(tars) >= 4
    for path in tars:
        if path.read_bytes()[:2] == b"\x1f\x8b":
            continue
        assert _our_view(path) == _tarfile_view(path), path


def _image_variants():
    """Encodings a crawl yields: baseline/progressive/grayscale/CMYK/EXIF-rotated JPEG, PNG (palette, 16-bit,
    alpha), WebP lossy/lossless/alpha (VP8, VP8L, VP8X), GIF (animated), at odd and extreme sizes."""
    import io

    from PIL import Image

    def enc(im, fmt, **kw):
        buf = io.BytesIO()
        im.save(buf, format=fmt, **kw)
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°: the stored size is what the processor sees (no exif_transpose)
    out = []
    for w, h in [(1, 1), (7, 3), (640, 480), (333, 2001), (4000, 20), (16383, 2)]:
        rgb = Image.new("RGB", (w, h), (w % 255, h % 255, 7))
        out += [(f"{w}x{h}.jpg", enc(rgb, "JPEG")), (f"{w}x{h}p.jpg", enc(rgb, "JPEG", progressive=True)),
                (f"{w}x{h}l.jpg", enc(rgb.convert("L"), "JPEG")), (f"{w}x{h}c.jpg", enc(rgb.convert("CMYK"), "JPEG")),
                (f"{w}x{h}e.jpg", enc(rgb, "JPEG", exif=exif)),
                (f"{w}x{h}.png", enc(rgb, "PNG")), (f"{w}x{h}p.png", enc(rgb.convert("P"), "PNG")),
                (f"{w}x{h}i.png", enc(Image.new("I;16", (w, h)), "PNG")),
                (f"{w}x{h}a.png", enc(rgb.convert("RGBA"), "PNG")), (f"{w}x{h}.gif", enc(rgb, "GIF")),
                (f"{w}x{h}.webp", enc(rgb, "WEBP")), (f"{w}x{h}ll.webp", enc(rgb, "WEBP", lossless=True)),
                (f"{w}x{h}a.webp", enc(rgb.convert("RGBA"), "WEBP")), (f"{w}x{h}.bmp", enc(rgb, "BMP"))]
    frames = [Image.new("RGB", (90, 60), c) for c in ((255, 0, 0), (0, 255, 0))]
    out.append(("anim.gif", enc(frames[0], "GIF", save_all=True, append_images=frames[1:])))
    out.append(("anim.webp", enc(frames[0], "WEBP", save_all=True, append_images=frames[1:])))
    out.append(("png_named.jpg", enc(Image.new("RGB", (31, 17)), "PNG")))  # the extension lies
    return out


def test_header_sizes_equal_pillows_for_every_encoding():
    """The stored size as Pillow reads it; the probe's, as transformers' load_image gives the image (an EXIF
    orientation of 5-8 swaps them: tests/test_exif.py)."""
    import io

    from PIL import Image
    from transformers.image_utils import load_image

    from pack_assets.core.media import _header_size, probe_image

    for name, data in _image_variants():
        with Image.open(io.BytesIO(data)) as im:
            stored = im.size
        loaded = load_image(Image.open(io.BytesIO(data))).size
        if not name.endswith(".bmp"):  # the formats read by imagesize, not Pillow
            assert _header_size(io.BytesIO(data)) == stored, name
        assert probe_image(data, name.rsplit(".", 1)[1]) == loaded, name
        assert probe_image(io.BytesIO(data), name.rsplit(".", 1)[1]) == loaded, name


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff\xd8\xff\xe0garbage", "Truncated File Read"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 8, "cannot identify image file"),
    (b"RIFF\0\0\0\0WEBPVP8 ", "could not create decoder object"),
    (b"GIF89a", "cannot identify image file"),
    (b"\xff\xd8" + b"\xff\xe1\xff\xff" + b"\0" * 100, "Truncated File Read")])
def test_broken_headers_get_pillows_error(data, message):
    """Pillow's own OSError (the scan turns it into a `bad_image` reason row), not some other crash."""
    from pack_assets.core.media import probe_image

    with pytest.raises(OSError, match=message):
        probe_image(data, "jpg")


def test_the_header_checksum_sums_every_byte_of_a_block():
    """header_sum (two Adler-32 halves) is sum() of the 512 bytes, at the extremes and on random blocks."""
    import random

    rng = random.Random(41)
    blocks = [bytes(512), b"\xff" * 512, b"\xff" * 256 + bytes(256)]
    blocks += [bytes(rng.randrange(256) for _ in range(512)) for _ in range(300)]
    assert [header_sum(b) for b in blocks] == [sum(b) for b in blocks]


_RECORD_TEXTS = [
    '{"conversations": [{"from": "human", "value": "Hi"}]}',  # json.dumps' form: the scanner's direct read
    '{"a":1}',  # no whitespace at all: direct as well
    ' {"a": 1}', '{"a": 1}\n', '\ufeff{"a": 1}', '\t[1]\r\n',  # whitespace around it, a BOM: json.loads
    '{"a": 1} {"b": 2}', '{"a": 1}x', '{"a": ', '{"a": "\x01"}', '', ' ', 'nul', '"s"', '{"a": NaN}', '[1, 2]',
    '{"a": 18446744073709551616}', '{"a":18446744073709551616}', '{"a": 1e400}', '{"a": "\\ud800"}', "1.5",
]


@pytest.mark.parametrize("text", _RECORD_TEXTS)
def test_a_record_is_decoded_as_json_loads_decodes_it(tmp_path, text):
    """The scan's record is json.loads' value, and a document json.loads refuses gets its error as the detail,
    whether the decoder's scanner read it directly or json.loads did."""
    from pack_assets.core.scan import _loads

    try:
        want = ("ok", json.loads(text))
    except json.JSONDecodeError as e:
        want = ("invalid_json", f"k.json: {e}")
    try:
        value, exact = _loads(text, text.encode("utf-8"), len(text) > 20, "k.json")
        got = ("ok", value)
        assert exact == (isinstance(value, dict) and json.dumps(value, ensure_ascii=False) == text)
    except ReasonError as e:
        got = (e.reason, e.detail)
    assert got == want
    samples, rejections = scan(write_tar(tmp_path / "r.tar", [("k.json", text)]))
    if want[0] == "invalid_json":
        assert [(r.reason, r.detail) for r in rejections] == [want]


@pytest.mark.parametrize("fail_after", [5, 2 * 300 - 1, 2 * 300])
def test_the_scans_read_ahead_yields_what_the_walk_sample_by_sample_yields(tmp_path, monkeypatch, fail_after):
    """The scan walks the headers of the next samples before classifying them (`scan._read_ahead`): its records
    are those, in the order, of the walk one sample at a time; a shard-level error of the walk (here after
    ``fail_after`` headers, inside or past a run of 256 samples) still comes after every sample walked before it."""
    from pack_assets.core import scan as scan_module

    path = write_tar(tmp_path / "x.tar", [m for i in range(300) for m in
                                          ((f"{i:04d}.json", json.dumps(chat(f"q{i}"))), (f"{i:04d}.cls", str(i)))])
    real = scan_module.iter_entries

    def failing(f, size):
        for n, e in enumerate(real(f, size)):
            if n == fail_after:
                raise ReasonError("not_a_tar", "stand-in for a walk's shard-level error")
            yield e

    def records(read_ahead):
        monkeypatch.setattr(scan_module, "_read_ahead", read_ahead)
        return [(type(r).__name__, r.key, getattr(r, "status", None) or r.reason)
                for r in scan_module.scan_shard(path, "x")]

    monkeypatch.setattr(scan_module, "iter_entries", failing)
    one_by_one = records(lambda groups: ([g] for g in groups))
    ahead = scan_module._read_ahead
    assert records(ahead) == one_by_one
    walked = (fail_after - 1) // 2 if fail_after < 600 else 300  # (the sample in progress at the error: none)
    assert [k for kind, k, _ in one_by_one if kind == "Sample"] == [f"{i:04d}" for i in range(walked)]
    assert one_by_one[-1] == (("Rejection", None, "not_a_tar") if fail_after < 600 else ("Sample", "0299", "ok"))
