"""Day two, content side (issue 16 items 3-5): an in-place edit of a record reaches the output (and a stale
output fails the audit), a malformed tar header is a reason row instead of a crash, and members the record
does not name travel with their sample."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from conftest import chat, image_bytes, write_tar
from test_packed_shards_and_audit import PROFILE, run_all

from pack_assets.core import scan as scan_mod
from pack_assets.core import store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.faults import FileFault
from pack_assets.core.plan import PlanConfig, PlanInfo, run_plan
from pack_assets.core.reasons import REASONS
from pack_assets.core.records import Rejection, Sample
from pack_assets.core.scan import ScanOptions, run_manifest, scan_shard
from pack_assets.core.write import fingerprints, run_write, write_context
from pack_assets.core.write import shared as write_shared
from pack_assets.core.write.fingerprints import current_shards
from pack_assets.core.write.jobs import shard_job
from pack_assets.reader import PackEncoder, iter_packs

ANSWER = "The code is 12345, noted."


def _records(n: int, edited: int | None = None) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        answer = ANSWER.replace("12345", "54321") if i == edited else ANSWER
        out.append((f"k{i:03d}.json", json.dumps(chat(f"Question {i}: " + "word " * (20 + 9 * i), answer))))
    return out


def _rewrite_in_place(path: Path, members) -> None:
    """Rewrite a shard as a user's tool would, with an mtime the scan cannot mistake for the old one."""
    old = path.stat()
    write_tar(path, members)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns + 10**9))


def _packed_text(out: Path) -> dict[str, str]:
    return {s["sample_id"]: s["messages"][-1]["content"] if isinstance(s["messages"][-1]["content"], str)
            else json.dumps(s["messages"][-1]["content"])
            for p in iter_packs(sorted(out.glob("*.tar"))) for s in p["samples"]}


def _tokens(work: Path) -> dict[str, int]:
    with store.connect(work, read_only=True) as con:
        return dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths").fetchall())


def _run(inp: Path, work: Path, out: Path, options: ScanOptions = ScanOptions()) -> None:
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s, options)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    run_write(work, inp, out, workers=1)


@pytest.mark.parametrize("hashed", [True, False])  # the record is hashed even when members are not
def test_a_record_edited_in_place_with_the_same_token_count_reaches_the_output(tmp_path, hashed):
    options = ScanOptions(hash_members=hashed)
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    write_tar(inp / "a.tar", _records(6))
    write_tar(inp / "b.tar", _records(4))
    _run(inp, work, out, options)
    assert run_audit(work, out).ok
    before_tokens = _tokens(work)
    old_outputs = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    _rewrite_in_place(inp / "a.tar", _records(6, edited=2))

    _run(inp, work, out, options)
    assert _tokens(work) == before_tokens  # the edit keeps every token count: only the text tells
    texts = _packed_text(out)
    assert "54321" in texts["a/k002"] and "12345" not in texts["a/k002"]
    assert all("12345" in t for sid, t in texts.items() if sid != "a/k002")
    result = run_audit(work, out)
    assert result.ok, result.violations

    # the output left stale: the shard of before put back
    for name, data in old_outputs.items():
        if b"a/k002" in data:
            (out / name).write_bytes(data)
    result = run_audit(work, out)
    stale = [v for v in result.violations if v["check"] == "stale_conversation"]
    assert [v["sample_id"] for v in stale] == ["a/k002"], result.violations
    # and a rerun repairs it
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).ok


def test_stale_messages_with_a_current_record_hash_fail_the_audit(tmp_path):
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    write_tar(inp / "a.tar", _records(3))
    run_all(inp, work, out)
    shard = sorted(out.glob("*.tar"))[0]
    with tarfile.open(shard) as tf:
        items = [(ti.name, tf.extractfile(ti).read()) for ti in tf.getmembers()]
    doc = json.loads(items[0][1])
    doc["samples"][0]["messages"][-1]["content"] = "The code is 99999, noted."
    items[0] = (items[0][0], json.dumps(doc).encode())
    write_tar(shard, items)
    checks = [(v["check"], v.get("sample_id")) for v in run_audit(work, out).violations]
    assert ("stale_conversation", doc["samples"][0]["sample_id"]) in checks


def test_a_new_tool_version_rewrites_every_output_shard(tmp_path, monkeypatch):
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    write_tar(inp / "a.tar", _records(6))
    run_all(inp, work, out)
    again = run_write(work, inp, out, workers=1)
    assert again.written == 0 and again.skipped > 0
    monkeypatch.setattr(write_shared, "__version__", "999.0")
    res = run_write(work, inp, out, workers=1)
    assert res.skipped == 0 and res.written == again.skipped
    assert {p["_meta"]["tool_version"] for p in iter_packs(sorted(out.glob("*.tar")))} == {"999.0"}


# --- malformed tar headers -------------------------------------------------------------------------------

def _good_then_bad(path: Path, how: str) -> Path:
    """Three good samples, then a member whose header is malformed in the given way, then two more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".src")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(6):
            data = json.dumps(chat(f"q{i}")).encode()
            ti = tarfile.TarInfo(f"k{i:03d}.json")
            ti.size, ti.mtime = len(data), 0
            if i == 3 and how in ("pax_record", "pax_length"):
                ti.pax_headers = {"a": "bcdef"}  # one record, "11 a=bcdef\n"
            elif i == 3 and how == "pax_size":
                ti.pax_headers = {"size": "12x"}
            tf.addfile(ti, io.BytesIO(data))
    raw = bytearray(tmp.read_bytes())
    tmp.unlink()
    if how == "pax_record":
        at = raw.index(b"11 a=bcdef\n")
        raw[at:at + 11] = b"abc path=x\n"
    elif how == "pax_length":
        at = raw.index(b"11 a=bcdef\n")
        raw[at:at + 2] = b"99"
    elif how == "ustar_size":
        at = raw.index(b"k003.json")  # the member's own header: garbage in its size field, checksum kept valid
        raw[at + 124:at + 136] = b"abcdefghij \0"
        raw[at + 148:at + 156] = b" " * 8
        raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("how", ["pax_record", "pax_length", "pax_size", "ustar_size"])
def test_a_malformed_tar_header_is_a_reason_row_and_the_samples_before_it_are_kept(tmp_path, how):
    path = _good_then_bad(tmp_path / "x.tar", how)
    recs = list(scan_shard(path, "x"))
    samples = [r for r in recs if isinstance(r, Sample)]
    rejections = [r for r in recs if isinstance(r, Rejection)]
    assert [s.key for s in samples if s.status == "ok"] == ["k000", "k001", "k002"]
    assert [(r.key, r.reason) for r in rejections] == [("k003", "bad_tar_header")], rejections
    assert "bad_tar_header" in REASONS


def test_a_shard_with_a_malformed_pax_header_does_not_stop_the_run(tmp_path):
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    _good_then_bad(inp / "bad.tar", "pax_record")
    write_tar(inp / "good.tar", _records(5))
    run_all(inp, work, out)
    result = run_audit(work, out)
    assert result.ok, result.violations
    assert result.stats["packed"] == 3 + 5 and result.stats["rejected"] == 1
    with store.connect(work, read_only=True) as con:
        assert con.execute("SELECT shard, key, reason FROM rejected").fetchall() == [("bad", "k003", "bad_tar_header")]
    packed = {sid for p in iter_packs(sorted(out.glob("*.tar"))) for sid in p["_meta"]["sample_ids"]}
    assert packed == {"bad/k000", "bad/k001", "bad/k002"} | {f"good/k{i:03d}" for i in range(5)}


def test_an_unexpected_error_is_a_reason_row_for_its_sample_or_shard(tmp_path, monkeypatch):
    path = write_tar(tmp_path / "x.tar", _records(5))
    real_classify = scan_mod.classify

    def classify(shard, key, *a):
        if key == "k001":
            raise TypeError("unforeseen")
        return real_classify(shard, key, *a)

    monkeypatch.setattr(scan_mod, "classify", classify)
    recs = list(scan_shard(path, "x"))
    assert [(r.key, r.reason) for r in recs if isinstance(r, Rejection)] == [("k001", "scan_error")]
    assert [s.key for s in recs if isinstance(s, Sample) and s.status == "ok"] == ["k000", "k002", "k003", "k004"]

    real_entries = scan_mod.iter_entries
    error = RuntimeError("a bug in the reader")

    def entries(f, size, *a):
        for i, e in enumerate(real_entries(f, size, *a)):
            if i == 3:
                raise error
            yield e

    monkeypatch.setattr(scan_mod, "classify", real_classify)
    monkeypatch.setattr(scan_mod, "iter_entries", entries)
    recs = list(scan_shard(path, "x"))
    rows = [r for r in recs if isinstance(r, Rejection)]
    # the sample in progress may have lost members: it gets the row, the ones before it are kept
    assert [(r.key, r.reason) for r in rows] == [("k002", "scan_error")] and "a bug in the reader" in rows[0].detail
    assert [s.key for s in recs if isinstance(s, Sample) and s.status == "ok"] == ["k000", "k001"]
    # the device's error there is no row a rerun would keep: the scan stops naming the shard (core/faults.py)
    error = OSError(5, "Input/output error")
    with pytest.raises(FileFault, match=f"I/O error reading {path}: Input/output error"):
        list(scan_shard(path, "x"))

    real_groups = scan_mod.group_by_key

    def groups(entries):
        for i, g in enumerate(real_groups(entries)):
            if i == 2:
                raise RuntimeError("a bug")
            yield g

    monkeypatch.setattr(scan_mod, "iter_entries", real_entries)
    monkeypatch.setattr(scan_mod, "group_by_key", groups)
    recs = list(scan_shard(path, "x"))
    assert [(r.key, r.reason) for r in recs if isinstance(r, Rejection)] == [(None, "scan_error")]
    assert [s.key for s in recs if isinstance(s, Sample) and s.status == "ok"] == ["k000", "k001"]


# --- members the record does not name ---------------------------------------------------------------------

def _with_extras(root: Path) -> tuple[Path, dict[str, bytes]]:
    rec = {**chat("Which one?", "The left one.", images=1), "image": "a.jpg"}
    extras = {"k000.b.jpg": image_bytes(40, 30, color=(1, 2, 3)), "k000.cls": b"7\n",
              "k000.meta.json": json.dumps({"source": "crawl", "license": "cc-by"}).encode(),
              "k000.txt": b"a caption the record does not use"}
    members = [("k000.json", json.dumps(rec)), ("k000.a.jpg", image_bytes(64, 48)), *extras.items(),
               # the same sample without extras: its token count must be the same
               ("k001.json", json.dumps({**rec})), ("k001.a.jpg", image_bytes(64, 48)),
               ("k002.json", json.dumps(chat("Plain text.", "Yes."))), ("k002.cls", b"3\n")]
    extras["k002.cls"] = b"3\n"
    write_tar(root / "x.tar", members)
    return root, extras


def test_members_the_record_does_not_name_travel_with_their_sample(tmp_path):
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    _, extras = _with_extras(inp)
    run_all(inp, work, out)
    with store.connect(work, read_only=True) as con:
        listed = dict(con.execute("SELECT key, extra_members FROM samples").fetchall())
    assert listed == {"k000": ["k000.b.jpg", "k000.cls", "k000.meta.json", "k000.txt"], "k001": [],
                      "k002": ["k002.cls"]}
    tokens = _tokens(work)
    assert tokens["x/k000"] == tokens["x/k001"]  # extras add no tokens

    carried = {}
    packs = list(iter_packs(sorted(out.glob("*.tar"))))
    for pack in packs:
        for s, src in zip(pack["samples"], pack["_meta"]["sources"]):
            assert [n for n, _ in s["media"]] == [m["output_name"].split(".", 1)[1] for m in src["media"]]
            for (part, data), m in zip(s.get("extra", []), src.get("extra", [])):
                assert m["output_name"] == f"{pack['pack_id']}.{part}"
                assert m["output_name"].split(".")[0] == pack["pack_id"]
                assert m["sha256"] == hashlib.sha256(data).hexdigest()
                carried[m["name"]] = data
    assert carried == extras  # every extra, byte-equal to its source
    # the encoder takes media only: lengths still equal the plan's
    enc = PackEncoder("qwen3-vl")
    for pack in packs:
        enc.encode(pack)

    result = run_audit(work, out)
    assert result.ok, result.violations
    assert result.stats["extra_members_checked"] == len(extras) and result.stats["media_members_checked"] == 2

    # the catalog query and the writer agree on fingerprints that include extras: a rerun rewrites nothing
    with store.connect(work, read_only=True) as con:
        context = write_context(PlanInfo.load(con))
        found = current_shards(con, out, context)
        assert sorted(r.shard for r in found) == sorted(p.name for p in out.glob("*.tar"))
        for r in found:
            job = shard_job(con, inp, r.shard)
            assert fingerprints.shard_fingerprint(job, context) == r.fingerprint
    assert run_write(work, inp, out, workers=1).written == 0

    # an extra damaged in the output, or dropped from it, fails the audit
    shard = next(p for p in out.glob("*.tar") if b".s000_x01.cls" in p.read_bytes())
    with tarfile.open(shard) as tf:
        items = [(ti.name, tf.extractfile(ti).read()) for ti in tf.getmembers()]
    damaged = [(n, d + b"!" if n.endswith("_x01.cls") else d) for n, d in items]
    write_tar(shard, damaged)
    assert "media_hash_mismatch" in {v["check"] for v in run_audit(work, out).violations}
    write_tar(shard, [(n, d) for n, d in items if not n.endswith("_x01.cls")])
    assert "missing_media" in {v["check"] for v in run_audit(work, out).violations}


def test_an_extra_added_to_a_sample_is_not_served_stale(tmp_path):
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    members = _records(3)
    write_tar(inp / "a.tar", members)
    run_all(inp, work, out)
    old = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    _rewrite_in_place(inp / "a.tar", members[:2] + [("k001.cls", b"1\n")] + members[2:])
    run_all(inp, work, out)
    assert run_audit(work, out).ok
    for name, data in old.items():
        (out / name).write_bytes(data)
    checks = {(v["check"], v.get("sample_id")) for v in run_audit(work, out).violations}
    assert ("stale_extra", "a/k001") in checks


def test_without_hashing_a_same_size_member_replaced_in_place_is_rewritten(tmp_path):
    # not hashed, a member is known by its place only: the source shard's size and mtime stand in for it
    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    members = _records(3)
    write_tar(inp / "a.tar", members + [("k002.cls", b"7\n")])
    _run(inp, work, out, ScanOptions(hash_members=False))
    _rewrite_in_place(inp / "a.tar", members + [("k002.cls", b"8\n")])
    _run(inp, work, out, ScanOptions(hash_members=False))
    got = [data for p in iter_packs(sorted(out.glob("*.tar"))) for s in p["samples"] for _, data in s.get("extra", [])]
    assert got == [b"8\n"]
    assert run_audit(work, out).ok
    assert run_write(work, inp, out, workers=1).written == 0  # and unchanged, it is kept
