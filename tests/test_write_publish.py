"""The copy writer's durability order with its metadata published as one batch: every output file's data is
fsynced before its rename, every rename into a folder is followed by an fsync of that folder before the
writer's record is put in place, and the folders are fsynced once per batch, not once per file. And the catalog
digests a first write records beside the write are the ones computed before it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import SqlSpy, appended_catalog, small_dataset

from pack_assets.core import safety, store
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import publish, run_write
from pack_assets.core.write.record import DIGEST_FORMAT, WRITTEN, load_record, shard_digests

PROFILE = load_profile("qwen3-vl")


@pytest.fixture
def prepared(tmp_path) -> tuple[Path, Path]:
    inp, work = small_dataset(tmp_path / "in", n_shards=2, per_shard=9), tmp_path / "work"
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    return inp, work


def _traced(monkeypatch) -> list[tuple[str, str]]:
    """("fsync", path) and ("rename", destination) in the order they happen (any thread)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        real_fsync(fd)
        events.append(("fsync", path))

    def replace(src, dst, *a, **k):
        events.append(("rename_from", os.path.abspath(src)))
        real_replace(src, dst, *a, **k)
        events.append(("rename", os.path.abspath(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor's file")
def test_every_rename_is_durable_before_the_record_and_each_folder_is_synced_once_per_batch(prepared, tmp_path,
                                                                                           monkeypatch):
    inp, work = prepared
    out = tmp_path / "out"
    events = _traced(monkeypatch)
    summary = run_write(work, inp, out, workers=1)
    assert summary.written >= 2
    record = next(i for i, e in enumerate(events) if e == ("rename", str(work / WRITTEN)))
    for i, (kind, path) in enumerate(events[:record]):
        if kind == "rename_from":  # the file's data synced before its name is published
            assert ("fsync", path) in events[:i], path
        if kind == "rename":  # the name made durable (its folder synced after it) before the record
            assert ("fsync", os.path.dirname(path)) in events[i + 1:record], path
    # the metadata batch: each of its folders synced once after its renames, not once per file; the shards'
    # renames made durable by the same fsync of the output folder (the other one: the owned-files record's)
    span = events[events.index(next(e for e in events if e[0] == "rename" and e[1].endswith(".tar"))):record]
    assert len([e for e in span if e[0] == "rename" and e[1].startswith(str(out / ".nv-meta") + "/")]) == 5
    assert span.count(("fsync", str(out / ".nv-meta"))) == 1
    assert len([e for e in span if e[0] == "rename" and os.path.dirname(e[1]) == str(out)]) >= 2 * summary.written + 2
    assert span.count(("fsync", str(out))) == 2


def test_a_batch_not_committed_leaves_no_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "kept").write_bytes(b"old")
    with pytest.raises(RuntimeError), publish.Publish() as batch:
        batch.write(tmp_path / "a" / "kept", b"new")
        batch.write(tmp_path / "b.json", b"{}")
        raise RuntimeError("failed before the commit")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "kept"]
    assert (tmp_path / "a" / "kept").read_bytes() == b"old"
    with publish.Publish() as batch:
        batch.write(tmp_path / "a" / "kept", b"new")
        batch.write(tmp_path / "b.json", b"{}")
        batch.commit()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.json", "kept"]
    assert (tmp_path / "a" / "kept").read_bytes() == b"new"


def test_digests_recorded_beside_a_first_write_equal_those_computed_before_it(prepared, tmp_path):
    inp, work = prepared
    out = tmp_path / "out"
    run_write(work, inp, out, workers=1)  # no record yet: the digests computed beside the write
    with store.connect(work, read_only=True) as con:
        digests, keys = shard_digests(con, None)
    record = load_record(work)
    assert record["digests"] == {n: d[0] for n, d in digests.items()} and record["digest_keys"] == keys
    # the record vouches for every shard on the rerun: nothing rewritten, and the index left byte for byte
    index = (out / ".nv-meta" / "index.sqlite").read_bytes()
    assert run_write(work, inp, out, workers=1).written == 0
    assert (out / ".nv-meta" / "index.sqlite").read_bytes() == index
    assert json.loads((work / WRITTEN).read_text())["digests"] == record["digests"]


# the digest query as DIGEST_FORMAT 2 was first written: DuckDB's md5_number_lower and md5_number_upper, each value
# hashed twice
_DIGESTS_AS_FIRST_WRITTEN = """
WITH mem AS (SELECT sample_id, bit_xor(md5_number_lower(m)) AS lo, bit_xor(md5_number_upper(m)) AS hi,
                    bool_or(unhashed) AS unhashed
             FROM (SELECT sample_id, concat_ws(',', to_json(name), "offset", size, coalesce(sha256, '-')) AS m,
                          sha256 IS NULL AS unhashed
                   FROM members WHERE sample_id IN (SELECT sample_id FROM pack_members))
             GROUP BY sample_id),
lines AS (SELECT p.output_shard, p.pack_id,
                 concat_ws('|', to_json(p.pack_id), p.media_type, p.total_token_len, pm.position, to_json(pm.sample_id),
                           t.total_tokens, s.conv, to_json(s.json_member), to_json(s.media_members),
                           to_json(s.extra_members), coalesce(mem.lo || ':' || mem.hi, ''),
                           CASE WHEN mem.unhashed THEN coalesce(sh.size || ':' || sh.mtime_ns, '') END) AS line
          FROM pack_plan p JOIN pack_members pm USING (pack_id)
          JOIN (SELECT sample_id, shard, json_member, media_members, extra_members, md5(conversation) AS conv
                FROM manifest_samples) s USING (sample_id)
          JOIN token_lengths t USING (sample_id) LEFT JOIN mem USING (sample_id)
          LEFT JOIN shards sh ON sh.shard = s.shard)
SELECT output_shard, bit_xor(md5_number_lower(line)) || ':' || bit_xor(md5_number_upper(line)),
       count(DISTINCT pack_id), count(*)
FROM lines GROUP BY 1"""


def test_the_catalog_digests_are_those_the_records_of_earlier_versions_hold(prepared, tmp_path):
    """The digest is computed with one md5 a value now; a record an earlier version wrote (the same
    DIGEST_FORMAT) must still vouch for its shards, so every digest is the one the first form gives: whole, and
    for the shards a partial record leaves to compute."""
    inp, work = prepared
    with store.connect(work, read_only=True) as con:
        first = {r[0]: (r[1], r[2], r[3]) for r in con.execute(_DIGESTS_AS_FIRST_WRITTEN).fetchall()}
        digests, keys = shard_digests(con, None)
        one = sorted(keys)[0]
        hashed_members = con.execute("SELECT count(*) FROM members WHERE sha256 IS NOT NULL").fetchall()[0][0]
        partial, _ = shard_digests(con, {"digest_format": DIGEST_FORMAT, "digests": {one: first[one][0]},
                                         "digest_keys": {one: keys[one]}})
    assert len(first) >= 2 and hashed_members  # (images among them: their members' md5s XORed per sample)
    assert digests == first and partial == first
    run_write(work, inp, tmp_path / "out", workers=1)
    assert load_record(work)["digests"] == {n: d[0] for n, d in first.items()}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor's file")
def test_a_file_that_already_holds_its_bytes_is_left_in_place_yet_synced(tmp_path, monkeypatch):
    """A name that holds exactly the new bytes (and mode) is not rewritten: no temporary file, no rename, but the
    file and its folder fsynced as a written one's; any other difference (bytes, size, mode, a link) is
    rewritten."""
    same, other, mode, link = (tmp_path / n for n in ("same", "other", "mode", "link"))
    for p in (same, other, mode):
        p.write_bytes(b"abc")
        p.chmod(0o666 & ~safety.current_umask())
    mode.chmod(0o600)
    link.symlink_to(same)
    inode = same.stat().st_ino
    events = _traced(monkeypatch)
    with publish.Publish() as batch:
        for p, data in ((same, b"abc"), (other, b"abd"), (mode, b"abc"), (link, b"abc")):
            batch.write(p, data)
        batch.commit()
    renamed = sorted(Path(p).name for kind, p in events if kind == "rename")
    assert renamed == ["link", "mode", "other"] and same.stat().st_ino == inode
    assert ("fsync", str(same)) in events and events[-1] == ("fsync", str(tmp_path))
    assert not link.is_symlink() and other.read_bytes() == b"abd" and mode.stat().st_mode & 0o777 != 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "mode", "other", "same"]


def test_a_rerun_that_keeps_its_shards_rewrites_none_of_their_unchanged_metadata(prepared, tmp_path):
    """The second write of the same plan finds every shard current: its `.tar.idx` files and the Energon and wids
    metadata whose bytes are the same stay the files they were (not renamed over), and equal a fresh write's."""
    inp, work = prepared
    out = tmp_path / "out"
    run_write(work, inp, out, workers=1)
    files = sorted(p for p in out.rglob("*") if p.is_file() and not p.name.endswith(".tar"))
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in files}
    assert run_write(work, inp, out, workers=1).written == 0
    kept = {p.relative_to(out).as_posix() for p in files if p.stat().st_ino == before[p][0]}
    assert {p.relative_to(out).as_posix() for p in files} - kept <= {".nv-meta/index.sqlite", ".pack_assets-files.json"}
    assert all(p.read_bytes() == before[p][1] for p in files if p.name.endswith(".idx") or p.suffix == ".json")


def test_a_digest_left_to_compute_reads_only_the_catalog_files_of_its_sources(tmp_path):
    """Where the writer's record holds every output shard's digest but one (one an append made), that one is
    computed from the catalog files of the source shards it draws from only, and equals the digest computed over
    the whole catalog."""
    work, shards = appended_catalog(tmp_path)
    with store.connect(work, read_only=True) as con:
        full, keys = shard_digests(con, None)
        sources = {}
        for name, src in con.execute("SELECT DISTINCT output_shard, shard FROM lineage").fetchall():
            sources.setdefault(name, set()).add(src)
        last = min(sorted(sources), key=lambda n: len(sources[n]))
        record = {"digest_format": DIGEST_FORMAT, "digests": {n: d[0] for n, d in full.items() if n != last},
                  "digest_keys": {n: k for n, k in keys.items() if n != last}}
        spy = SqlSpy(con)
        partial, _ = shard_digests(spy, record)
    assert partial == full and len(sources[last]) < len(shards)
    folders = {f.as_posix() for s in sources[last]
               for f in (store.manifest_dir(work, s), store.token_dir(work, PROFILE.name, s))}
    read = [f for sql in spy.sql if "md5_number" in sql for f in re.findall(r"'([^']*\.parquet)'", sql)]
    assert read and {os.path.dirname(f) for f in read} <= folders
