"""Writer and audit: byte equality of every media member, determinism, crash then rerun, and every kind of
damage to the outputs reported by the audit."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
from pathlib import Path

import pytest
import webdataset as wds
import xxhash

from pack_assets import __version__
from pack_assets.core import audit as audit_mod
from pack_assets.core import expected, filedigest, store, tario
from pack_assets.core import recount as recount_mod
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.lookup import lookup
from pack_assets.core.plan import PlanConfig, PlanInfo, run_plan
from pack_assets.core.records import PackMeta, SourceRef
from pack_assets.core.scan import manifest_is_current, run_manifest
from pack_assets.core.settings import Settings
from pack_assets.core.write import batches as write_batches
from pack_assets.core.write import copy as write_copy
from pack_assets.core.write import energon, fingerprints, run_write, syscalls, write_context
from pack_assets.core.write import record as write_record
from pack_assets.core.write import shard as write_shard_mod
from pack_assets.core.write.bulk import BULK_ROWS, bulk_rows, catalog_columns, group_tables, table_columns
from pack_assets.core.write.fingerprints import current_shards
from pack_assets.core.write.jobs import WRITE_CONVERSATIONS, shard_job
from pack_assets.runner.procs import Helpers

PROFILE = load_profile("qwen3-vl")


def run_all(inp: Path, work: Path, out: Path, max_len: int = 1500, **plan) -> dict:
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    summary = run_plan(work, shards, PlanConfig(max_len=max_len, max_packs_per_shard=2, **plan), PROFILE)
    run_write(work, inp, out, workers=1)
    return summary


@pytest.fixture
def packed(dataset, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    summary = run_all(dataset, work, out)
    return dataset, work, out, summary


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_every_media_member_equals_its_source_bytes(packed):
    inp, work, out, _ = packed
    with store.connect(work, read_only=True) as con:
        rows = con.execute('SELECT sample_id, name, "offset", size FROM members').fetchall()
        members = {(r[0], r[1]): (r[2], r[3]) for r in rows}
    checked = 0
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tf:
            docs = {}
            for ti in tf.getmembers():
                if ti.name.endswith(".json"):
                    docs[ti.name.split(".")[0]] = json.loads(tf.extractfile(ti).read())
            for ti in tf.getmembers():
                if ti.name.endswith(".json"):
                    continue
                doc = docs[ti.name.split(".")[0]]
                src = next(m for s in doc["_meta"]["sources"] for m in s["media"] if m["output_name"] == ti.name)
                sid = next(s["sample_id"] for s in doc["_meta"]["sources"] if src in s["media"])
                offset, size = members[(sid, src["name"])]
                with open(inp / f"{sid.split('/')[0]}.tar", "rb") as f:
                    f.seek(offset)
                    assert tf.extractfile(ti).read() == f.read(size)
                checked += 1
    assert checked > 10


def test_packed_sample_holds_full_conversations_and_meta(packed):
    _, work, out, summary = packed
    first = sorted(out.glob("*.tar"))[0]
    with tarfile.open(first) as tf:
        ti = tf.getmembers()[0]
        doc = json.loads(tf.extractfile(ti).read())
    meta = doc["_meta"]
    for k in ("pack_id", "media_type", "sample_ids", "sample_token_lens", "total_token_len", "sources", "profile",
              "config_fingerprint", "tool_version"):
        assert k in meta
    with store.connect(work, read_only=True) as con:
        assert meta["config_fingerprint"] == write_context(PlanInfo.load(con))["config_fingerprint"]
    assert sum(meta["sample_token_lens"]) == meta["total_token_len"] <= 1500
    assert len(doc["samples"]) == len(meta["sample_ids"])
    for s in doc["samples"]:
        assert s["messages"] and s["source"] is not None  # normalized turns and the original record
    with open(work / "pack_plan.jsonl") as f:
        plan_rows = [json.loads(line) for line in f]
    assert plan_rows[0]["pack_id"] == meta["pack_id"]


def test_pack_meta_round_trips_the_stored_json(packed):
    _, _, out, _ = packed
    for path in sorted(out.glob("*.tar")):
        for _, parts in tario.iter_pack_parts(path):
            meta = json.loads(parts["json"])["_meta"]
            typed = PackMeta.from_dict(meta)
            assert json.dumps(typed.as_dict(), ensure_ascii=False) == json.dumps(meta, ensure_ascii=False)
            assert [s.sample_id for s in typed.sources] == typed.sample_ids
    m = {"name": "k.cls", "offset": 1536, "size": 3, "sha256": None, "output_name": "p1.s000_x00.cls"}
    with_extra = {"sample_id": "a/k", "shard": "a", "key": "k", "json_member": None, "media": [], "extra": [m]}
    assert list(SourceRef.from_dict(with_extra).as_dict().items()) == list(with_extra.items())
    without = {k: v for k, v in with_extra.items() if k != "extra"}
    assert list(SourceRef.from_dict(without).as_dict().items()) == list(without.items())


def test_output_reads_with_plain_webdataset_and_names_follow_the_key_rule(packed):
    _, _, out, summary = packed
    urls = [str(p) for p in sorted(out.glob("*.tar"))]
    ds = wds.WebDataset(urls, shardshuffle=False).decode("pil")
    n = 0
    for sample in ds:
        doc = sample["json"]
        n += 1
        images = [k for k in sample if k.endswith((".jpg", ".png", ".webp"))]
        assert len(images) == sum(len(s["media"]) for s in doc["samples"])
        for k in images:
            assert hasattr(sample[k], "size")  # decoded to a PIL image by the extension after the last dot
    assert n == summary.packs
    meta = out / ".nv-meta"
    assert "CrudeWebdataset" in (meta / "dataset.yaml").read_text()
    counts = json.loads((meta / ".info.json").read_text())["shard_counts"]
    assert sum(counts.values()) == n and set(counts) == {Path(u).name for u in urls}
    assert all(f"- {Path(u).name}" in (meta / "split.yaml").read_text() for u in urls)


def test_same_inputs_give_byte_identical_shards(dataset, tmp_path):
    run_all(dataset, tmp_path / "w1", tmp_path / "o1")
    run_all(dataset, tmp_path / "w2", tmp_path / "o2")
    a = {p.name: sha(p) for p in (tmp_path / "o1").glob("*.tar")}
    b = {p.name: sha(p) for p in (tmp_path / "o2").glob("*.tar")}
    assert a == b and len(a) > 1
    assert (tmp_path / "w1" / "pack_plan.jsonl").read_bytes() == (tmp_path / "w2" / "pack_plan.jsonl").read_bytes()


def test_packs_larger_than_the_writers_read_buffer_are_written_byte_identical(packed, tmp_path, monkeypatch):
    """The writer reads a pack's members into one reused buffer; reads past its end get buffers of their own
    and the next pack a larger one. It also starts the disk's writeback as it goes (here after every pack):
    the shards are the same bytes either way."""
    inp, work, out, _ = packed
    sizes, advised = [], []
    real = syscalls.Arena.__init__
    real_writeback = write_shard_mod.start_writeback

    def tiny(self, size=1 << 20):
        real(self, 700)  # smaller than one member here
        sizes.append(self)

    monkeypatch.setattr(syscalls.Arena, "__init__", tiny)
    monkeypatch.setattr(write_shard_mod, "WRITEBACK_EVERY", 1)
    monkeypatch.setattr(write_shard_mod, "start_writeback", lambda *a: (advised.append(a), real_writeback(*a)))
    run_write(work, inp, tmp_path / "small_buffer", workers=1)
    assert sizes and all(len(a.buf) > 700 for a in sizes)  # each grew to the largest pack it met
    assert len(advised) > len(sizes)  # (one arena per shard, writeback after each of its packs)
    assert {p.name: sha(p) for p in (tmp_path / "small_buffer").glob("*.tar")} == {p.name: sha(p)
                                                                                  for p in out.glob("*.tar")}


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no copy_file_range on this platform")
@pytest.mark.parametrize("how", ["all read", "some copied in kernel", "all copied in kernel", "no kernel copy"])
def test_media_read_or_copied_in_kernel_give_the_same_shards(packed, tmp_path, monkeypatch, how):
    """Media of write._SMALL or more go by copy_file_range, smaller ones with their record through the read
    buffer (packs mix both); where the kernel cannot copy from a source into the output shard (EXDEV: another
    filesystem type, Linux 5.12 on) the writer reads and writes that source's members, learned once per output
    shard and source. The bytes are the same every way."""
    inp, work, out, _ = packed
    media, pairs = [], set()  # pairs: the sources each output shard copies media from (where a refusal is learned)
    for p in out.glob("*.tar"):
        for _, parts in tario.iter_pack_parts(p):
            media += [len(data) for part, data in parts.items() if part != "json"]
            pairs |= {(p.name, src["shard"]) for src in json.loads(parts["json"])["_meta"]["sources"] if src["media"]}
    media.sort()
    cut = {"all read": 1 << 40, "some copied in kernel": media[len(media) // 2]}.get(how, 1)
    calls = []
    real_cfr = os.copy_file_range

    def cfr(*a):
        calls.append(a)
        if how == "no kernel copy":
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_cfr(*a)

    copies = []
    real_copy = write_shard_mod.copy_range
    monkeypatch.setattr(write_shard_mod, "copy_range", lambda *a: (copies.append(a), real_copy(*a))[1])
    monkeypatch.setattr(write_shard_mod.os, "copy_file_range", cfr)
    monkeypatch.setattr(syscalls, "SMALL", cut)
    res = run_write(work, inp, tmp_path / "o", workers=1)
    assert {p.name: sha(p) for p in (tmp_path / "o").glob("*.tar")} == {p.name: sha(p) for p in out.glob("*.tar")}
    assert res.written == res.shards > 0 and media[0] < media[-1]
    copied = sum(size >= cut for size in media)
    if how == "no kernel copy":  # one refusal per output shard and source, then that source's members are read
        assert len(calls) == len(pairs) > res.shards
        assert len(pairs) <= len(copies) < copied  # (the rest of the pack it was refused in is copied by reads)
    else:  # one call per member copied (a member is copied whole unless the kernel copies it short)
        assert len(calls) == copied
        if how == "all read":
            assert copied == 0
        elif how == "all copied in kernel":
            assert copied == len(media)
        else:
            assert 0 < copied < len(media)


def test_crash_mid_write_then_rerun_finishes_without_partial_files(packed, monkeypatch):
    inp, work, out, _ = packed
    clean = {p.name: sha(p) for p in out.glob("*.tar")}
    first = min(clean)
    with tarfile.open(out / first) as tf:  # one document header per pack: killed in the second shard's second pack
        kill_at = sum(m.name.endswith(".json") for m in tf.getmembers()) + 2
    for p in out.glob("*.tar"):
        p.unlink()
    calls = {"n": 0}
    real = write_shard_mod.member_header

    def dying_header(*a):
        calls["n"] += 1
        if calls["n"] == kill_at:
            raise KeyboardInterrupt("simulated kill")
        return real(*a)

    monkeypatch.setattr(write_shard_mod, "member_header", dying_header)
    with pytest.raises(KeyboardInterrupt):
        run_write(work, inp, out, workers=1)
    partial = {p.name for p in out.glob("*.tar")}
    assert first in partial and partial < set(clean)  # some shards done, never a partial file under a final name
    assert all(sha(out / n) == clean[n] for n in partial)
    monkeypatch.setattr(write_shard_mod, "member_header", real)
    res = run_write(work, inp, out, workers=1)
    assert res.skipped == len(partial) and res.written == len(clean) - len(partial)
    assert {p.name: sha(p) for p in out.glob("*.tar")} == clean
    assert not list(out.glob(".*tmp*"))


@pytest.mark.parametrize("hashed", [True, False])
def test_unchanged_output_shards_are_found_without_loading_each_shard(dataset, tmp_path, monkeypatch, hashed):
    from pack_assets.core.scan import ScanOptions

    work, out = tmp_path / "work", tmp_path / "out"
    shards = list(store.find_shards(dataset))
    for s in shards:
        run_manifest(dataset, work, s, ScanOptions(hash_members=hashed))
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    run_write(work, dataset, out, workers=1)
    names = sorted(p.name for p in out.glob("*.tar"))
    with store.connect(work, read_only=True) as con:
        context = write_context(PlanInfo.load(con))
        found = current_shards(con, out, context)
        # one query over all shards gives each shard's fingerprint exactly as the writer computed it
        for r in found:
            job = shard_job(con, dataset, r.shard)
            on_disk = tario.first_pack_meta(out / r.shard)["shard_fingerprint"]
            assert fingerprints.shard_fingerprint(job, context) == on_disk
            assert (r.packs, r.samples) == (len(job.packs), sum(len(p.subs) for p in job.packs))
    assert sorted(r.shard for r in found) == names and len(names) >= 2
    before = {n: sha(out / n) for n in names}
    (out / names[1]).unlink()
    loaded = []
    real = write_copy.build_shard  # (a shard of one batch is prepared whole)
    monkeypatch.setattr(write_copy, "build_shard", lambda *a: loaded.append(a[0]) or real(*a))
    res = run_write(work, dataset, out, workers=1)
    assert loaded == [names[1]] and (res.written, res.skipped) == (1, len(names) - 1)
    assert {n: sha(out / n) for n in names} == before
    assert run_audit(work, out).ok


def _group_columns(con, inp, group, rows=None) -> list[tuple]:
    """A writer job's shards with their columns, from one read of the catalog for all of them (as `copy._load`)."""
    return [(name, table_columns(inp, name, *tables)) for name, *tables in group_tables(con, group, rows)]


def test_rows_gathered_once_for_all_output_shards_equal_each_shards_own_query_and_are_removed(packed, monkeypatch):
    import socket

    from pack_assets.core import audit as audit_stage

    inp, work, out, _ = packed
    host = socket.gethostname().replace("-", "_")
    stale = work / f"{store.STAGED_PREFIX}{host}-999999999-left"  # a killed run's on this host (no such process)
    live = work / f"{store.STAGED_PREFIX}{host}-{os.getppid()}-running"  # a running process's
    # another machine's: its pids mean nothing here
    elsewhere = work / f"{store.STAGED_PREFIX}otherhost-999999999-running"
    for d in (stale, live, elsewhere):
        (d / "subs").mkdir(parents=True)
    monkeypatch.setattr(store, "_STAGED_GROUP", 1)  # one output shard per pass: the groups add up
    with store.connect(work, read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
        assert len(names) >= 2
        with store.staged(work, BULK_ROWS, names) as rows:
            assert not stale.exists() and live.exists() and elsewhere.exists()
            for n in names:
                assert catalog_columns(con, inp, n, rows) == catalog_columns(con, inp, n)
        with store.staged(work, audit_stage.AUDIT_ROWS, names[1:], con) as rows:
            gathered = expected.shard_expectations(con, names[1], rows)
            assert gathered == expected.shard_expectations(con, names[1])
        with pytest.raises(FileNotFoundError):  # gone from under a reader: an error, never "no rows"
            catalog_columns(con, inp, names[0], rows)
        groups = [names[:1], names[1:]]  # a writer job's shards from one staged file, or from one query
        with store.staged(work, BULK_ROWS, names, groups=groups) as rows:
            for g in groups:
                each = [(n, catalog_columns(con, inp, n)) for n in g]
                assert _group_columns(con, inp, g, rows) == each == _group_columns(con, inp, g)
    leftovers = sorted(p.name for p in work.glob(f"{store.STAGED_PREFIX}*"))
    assert leftovers == sorted([live.name, elsewhere.name])

    used = []  # the stages read the gathered rows, not a query per shard (the writer as Arrow tables)
    real, real_table = store.Staged.rows, store.Staged.table
    monkeypatch.setattr(store.Staged, "rows", lambda self, *a, **k: used.append(a[1]) or real(self, *a, **k))
    monkeypatch.setattr(store.Staged, "table", lambda self, *a, **k: used.append(a[1]) or real_table(self, *a, **k))
    shutil.rmtree(out)
    monkeypatch.setattr(write_copy, "GROUP_SAMPLES", 1)  # a job per output shard: more than one, so staged
    run_write(work, inp, out, workers=1)
    assert set(used) == set(BULK_ROWS)  # (no piece of a split sample here: the bulk path alone)
    used.clear()
    assert run_audit(work, out, workers=1).ok and set(used) == set(audit_stage.AUDIT_ROWS)

    def broken(*a, **kw):
        raise OSError("disk full")
    monkeypatch.setattr(write_copy, "write_all", broken)
    shutil.rmtree(out)
    with pytest.raises(OSError, match="disk full"):
        run_write(work, inp, out, workers=1)
    assert sorted(p.name for p in work.glob(f"{store.STAGED_PREFIX}*")) == leftovers  # removed on a failure too


class _SqlSpy:
    """A connection that records the SQL run on it."""

    def __init__(self, con, log: list[str]):
        self._con, self._log = con, log

    def sql(self, query, *a, **k):
        self._log.append(query)
        return self._con.sql(query, *a, **k)

    def execute(self, query, *a, **k):
        self._log.append(query)
        return self._con.execute(query, *a, **k)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_writer_jobs_read_their_conversations_staged_and_a_missing_one_is_an_error(packed, monkeypatch):
    """The writer stages the conversations with its other rows: a job with staged rows queries no manifest row
    (the conversations' join, once per job, scanned every manifest file), its shards are byte for byte those of
    one unstaged job, and a sample the staged conversations lack is an error, never a shard without it."""
    inp, work, out, _ = packed  # (written by one job: unstaged)
    before = {p.name: sha(p) for p in out.iterdir() if p.is_file()}
    sql: list[str] = []
    real = write_copy.group_tables
    monkeypatch.setattr(write_copy, "group_tables", lambda con, *a: real(_SqlSpy(con, sql), *a))
    monkeypatch.setattr(write_copy, "GROUP_SAMPLES", 1)  # a job per output shard: more than one, so staged
    shutil.rmtree(out)
    run_write(work, inp, out, workers=1)
    assert {p.name: sha(p) for p in out.iterdir() if p.is_file()} == before and len(before) > 2
    assert sql and not [q for q in sql if "manifest_samples" in q and "LIMIT 0" not in q]  # (bulk_rows' columns)

    with store.connect(work, read_only=True) as con:
        name = con.execute("SELECT min(output_shard) FROM pack_plan").fetchall()[0][0]
        sid = con.execute("SELECT min(sample_id) FROM pack_plan JOIN pack_members USING (pack_id) "
                          "WHERE output_shard = ?", [name]).fetchall()[0][0]
        lacking = WRITE_CONVERSATIONS["conversations"].replace(
            "{shards}", "{shards} AND s.sample_id <> '" + sid.replace("'", "''") + "'")
        context = write_context(PlanInfo.load(con))
        with store.staged(work, {**bulk_rows(con), "conversations": lacking}, [name], groups=[[name]]) as rows:
            (_, *tables), = group_tables(con, [name], rows)
            with pytest.raises(KeyError):
                table_columns(inp, name, *tables)
            with pytest.raises(KeyError, match="no conversation"):
                write_batches.StreamShard(name, inp, *tables, context, batch=1)


def test_audit_passes_on_clean_output_and_counts_add_up(packed):
    _, work, out, _ = packed
    result = run_audit(work, out)
    assert result.ok, result.violations
    st = result.stats
    assert st["samples_read"] == 26 and st["rejected"] == 2
    assert st["samples_read"] == st["packed"] + st["dropped"] + st["rejected"]
    assert result.report.read_text().startswith("# pack_assets audit report")
    assert all(Path(p).stat().st_size > 0 for p in result.plots.values())


def _rewrite(shard: Path, edit) -> None:
    """Rebuild a tar with `edit(list[(name, bytes)])` applied."""
    with tarfile.open(shard) as tf:
        items = [(ti.name, tf.extractfile(ti).read()) for ti in tf.getmembers()]
    items = edit(items)
    with tarfile.open(shard, "w") as tf:
        for name, data in items:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def _flip_media(items):
    i = next(i for i, (n, _) in enumerate(items) if not n.endswith(".json"))
    name, data = items[i]
    items[i] = (name, data[:-1] + bytes([data[-1] ^ 1]))
    return items


def _drop_media(items):
    i = next(i for i, (n, _) in enumerate(items) if not n.endswith(".json"))
    return items[:i] + items[i + 1:]


def _edit_meta(items):
    name, data = items[0]
    doc = json.loads(data)
    doc["_meta"]["sample_token_lens"][0] += 1
    items[0] = (name, json.dumps(doc).encode())
    return items


@pytest.mark.parametrize(
    "damage, check",
    [(_flip_media, "media_hash_mismatch"), (_drop_media, "missing_media"), (_edit_meta, "meta_mismatch")],
)
def test_audit_reports_each_kind_of_damage(packed, damage, check):
    _, work, out, _ = packed
    shard = next(p for p in sorted(out.glob("*.tar"))
                 if any(not n.endswith(".json") for n in tarfile.open(p).getnames()))
    _rewrite(shard, damage)
    result = run_audit(work, out)
    assert check in {v["check"] for v in result.violations}
    assert run_audit(work, out, workers=1).violations == result.violations  # members hashed ahead by a thread


def test_audit_reports_a_duplicated_pack_and_a_deleted_shard(packed):
    _, work, out, _ = packed
    shards = sorted(out.glob("*.tar"))
    _rewrite(shards[0], lambda items: items + [(n, d) for n, d in items if n.startswith(items[0][0].split(".")[0])])
    shards[1].unlink()
    checks = {v["check"] for v in run_audit(work, out).violations}
    assert {"duplicate_pack", "duplicate_sample", "missing_shard", "missing_pack", "lost_sample"} <= checks


def test_an_output_shard_cut_short_is_unreadable_and_only_the_packs_after_the_cut_are_missing(packed, monkeypatch):
    """The audit reads a shard pack by pack (in one worker, each pack's members hashed by a second thread
    while the pack before is checked): the packs before a break are checked and counted, the one it cuts
    through and those after are missing; as when the shards are shared by threads."""
    _, work, out, _ = packed
    shard = next(p for p in sorted(out.glob("*.tar"))
                 if len({n.split(".")[0] for n in tarfile.open(p).getnames()}) == 2)
    with tarfile.open(shard) as tf:
        members = tf.getmembers()
    first, second = members[0].name.split(".")[0], members[-1].name.split(".")[0]
    cut = members[-1]  # the second pack's last member: its first ones are read before the break
    assert cut.name.split(".")[0] == second and members[-2].name.split(".")[0] == second
    with open(shard, "r+b") as f:
        f.truncate(cut.offset_data + cut.size // 2)
    hashed_ahead, digests = [], audit_mod._digests
    monkeypatch.setattr(audit_mod, "_digests", lambda parts: hashed_ahead.append(1) or digests(parts))
    result = run_audit(work, out, workers=1)
    assert bool(hashed_ahead) == ((os.cpu_count() or 1) > 1)
    assert [v["shard"] for v in result.violations if v["check"] == "unreadable_shard"] == [shard.name]
    assert {v["pack_id"] for v in result.violations if v["check"] == "missing_pack"} == {second}
    assert not [v for v in result.violations if v.get("pack_id") == first]
    shared = run_audit(work, out, workers=2)  # two threads, each hashing in line
    assert (shared.violations, shared.stats) == (result.violations, result.stats)


def test_audit_in_two_processes_or_threads_reports_what_one_process_reports(packed):
    _, work, out, _ = packed
    shards = sorted(out.glob("*.tar"))
    _rewrite(shards[0], lambda items: _flip_media(items) + items[:1])
    shards[1].unlink()
    one = run_audit(work, out, workers=1)
    two = run_audit(work, out, workers=2, parallel_min_bytes=0)
    assert {"media_hash_mismatch", "duplicate_pack", "missing_shard", "lost_sample"} <= {
        v["check"] for v in one.violations}
    threads = run_audit(work, out, workers=2)  # below PARALLEL_MIN_BYTES: two threads
    assert two.violations == one.violations == threads.violations
    assert two.stats == one.stats == threads.stats


def test_audit_scope_changed_rereads_only_what_changed_since_a_clean_audit(packed):
    inp, work, out, _ = packed
    shards = sorted(out.glob("*.tar"))
    full = run_audit(work, out, digests=False)
    assert full.ok and full.stats["output_shards_trusted"] == 0
    # the default scope re-reads every shard, an unchanged one only to hash it against the digest recorded
    hashed = run_audit(work, out)
    assert hashed.ok and hashed.stats["output_shards_hashed"] == hashed.stats["output_shards_trusted"] == len(shards)
    assert hashed.stats["media_members_checked"] == 0
    quick = run_audit(work, out, scope="changed")
    assert quick.ok and quick.stats["output_shards_trusted"] == len(shards)
    assert quick.stats["media_members_checked"] == 0
    same = ("samples_read", "packed", "dropped", "rejected", "packs_read", "per_shard")
    assert {k: quick.stats[k] for k in same} == {k: full.stats[k] for k in same}
    # a rewritten shard (new mtime) is read again and its damage reported; the failed audit vouches for nothing
    _rewrite(shards[0], _flip_media)
    damaged = run_audit(work, out, scope="changed")
    assert "media_hash_mismatch" in {v["check"] for v in damaged.violations}
    assert damaged.stats["output_shards_trusted"] == len(shards) - 1
    assert run_audit(work, out, scope="changed").stats["output_shards_trusted"] == 0
    # the limit of the quick check: a same-size edit with the mtime put back is trusted; scope "all" finds it
    shards[0].unlink()
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).ok
    with tarfile.open(shards[1]) as tf:
        media = next(ti for ti in tf.getmembers() if not ti.name.endswith(".json"))
    st = shards[1].stat()
    with open(shards[1], "r+b") as f:
        f.seek(media.offset_data)
        byte = f.read(1)
        f.seek(media.offset_data)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run_audit(work, out, scope="changed").ok
    # the default audit hashes that untouched-looking shard, finds other bytes than it passed, and reads it in full
    caught = run_audit(work, out)
    assert caught.verdict == "FAIL" and "media_hash_mismatch" in {v["check"] for v in caught.violations}
    assert caught.stats["output_shards_hashed"] == len(shards) - 1
    with pytest.raises(ValueError, match="audit scope"):
        run_audit(work, out, scope="some")


def _flip_first_media_in_place(shard: Path) -> None:
    """One byte of the first media member flipped, the file's size and mtime put back."""
    with tarfile.open(shard) as tf:
        media = next(ti for ti in tf.getmembers() if not ti.name.endswith(".json"))
    st = shard.stat()
    with open(shard, "r+b") as f:
        byte = os.pread(f.fileno(), 1, media.offset_data)
        os.pwrite(f.fileno(), bytes([byte[0] ^ 1]), media.offset_data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_digests_taken_early_vouch_only_for_files_nobody_wrote_since(packed):
    """The digests an incremental run takes while it plans and writes (filedigest.EarlyDigests): an unchanged
    shard's is the digest the audit would compute; a shard edited after it was hashed (same size, mtime put
    back) is hashed again by the audit, which then reads it in full and reports the damage; a shard whose
    mtime is not the recorded one is not hashed early at all."""
    _, work, out, _ = packed
    first, second = sorted(out.glob("*.tar"))[:2]
    assert run_audit(work, out, digests=False).ok  # records each shard's digest
    early = filedigest.EarlyDigests()
    early.start(out, work / audit_mod.AUDITED, __version__)
    assert early.digest(first) == early.digest(first) == filedigest.file_digest(first) is not None
    assert early.digest(second) == filedigest.file_digest(second)
    _flip_first_media_in_place(first)
    assert early.digest(first) is None and early.digest(second) is not None
    caught = run_audit(work, out, early=early)
    assert caught.verdict == "FAIL" and "media_hash_mismatch" in {v["check"] for v in caught.violations}
    assert {v["shard"] for v in caught.violations if v.get("shard")} == {first.name}
    assert caught.stats["output_shards_hashed"] == caught.stats["output_shards_trusted"] == 1
    early.close()
    assert early.digest(second) is None  # closed: nothing kept
    assert run_audit(work, out, digests=False).verdict == "FAIL"
    first.unlink()  # (the damaged shard rewritten, a clean audit again)
    run_write(work, packed[0], out, workers=1)
    assert run_audit(work, out, digests=False).ok
    os.utime(second, ns=(second.stat().st_atime_ns, second.stat().st_mtime_ns + 10**9))
    late = filedigest.EarlyDigests()
    late.start(out, work / audit_mod.AUDITED, __version__)
    assert late.digest(second) is None and late.digest(first) is not None  # a new mtime: not hashed early
    late.close()
    with filedigest.EarlyDigests() as other:  # another version's record: its digests are not taken
        other.start(out, work / audit_mod.AUDITED, __version__ + "+other")
        assert other.digest(first) is None
    stopped = threading.Event()
    stopped.set()  # closed while a file is being read: the read stops, no digest
    assert filedigest.identified_digest(first, stopped) is None and filedigest.identified_digest(first)


def test_early_digests_started_before_dagster_go_on_with_more_readers(packed, monkeypatch):
    """`pack-assets run` starts one reader of small requests before Dagster's import and the plan asks again
    with four: the reads under way go on (each shard read once, by whichever reader takes it), and every
    digest is the file's; closing cancels what no reader took."""
    _, work, out, _ = packed
    shards = sorted(out.glob("*.tar"))
    assert len(shards) >= 2 and run_audit(work, out, digests=False).ok
    expected = [filedigest.file_digest(p) for p in shards]
    gate, reads = threading.Event(), []
    plain = filedigest.identified_digest

    def held(path, stop=None, direct=False, chunk=filedigest.DIRECT_CHUNK):
        reads.append((path.name, chunk))
        gate.wait(10)
        return plain(path, stop, direct, chunk)

    monkeypatch.setattr(filedigest, "identified_digest", held)
    with filedigest.EarlyDigests() as early:
        early.start(out, work / audit_mod.AUDITED, __version__, *filedigest.BESIDE_IMPORT)
        futures = dict(early._started)
        early.start(out, work / audit_mod.AUDITED, __version__)  # the plan's call: more readers, same reads
        assert early._started == futures
        gate.set()
        assert [early.digest(p) for p in shards] == expected
        assert sorted(n for n, _ in reads) == [p.name for p in shards]  # each read once
        assert reads[0] == (shards[0].name, filedigest.BESIDE_IMPORT[1])
    gate.clear()
    reads.clear()
    early = filedigest.EarlyDigests()
    early.start(out, work / audit_mod.AUDITED, __version__, readers=1)
    early.close()  # the one reader holds the first shard: the others are cancelled, never read
    gate.set()
    assert all(early.digest(p) is None for p in shards) and len(reads) <= 1


def test_an_early_digest_read_past_the_page_cache_is_the_files_digest(tmp_path, monkeypatch):
    """EarlyDigests reads with O_DIRECT (no copy out of the page cache, no cache filled): the digest is the
    buffered read's for a file of several chunks ending off a block boundary, and where the file system
    refuses O_DIRECT (EINVAL) the file is read through the cache instead, with the same digest."""
    f = tmp_path / "shard.tar"
    f.write_bytes(os.urandom(2 * filedigest.DIRECT_CHUNK + 4097))
    buffered = filedigest.identified_digest(f)
    assert buffered is not None and buffered[0] == xxhash.xxh3_128(f.read_bytes()).hexdigest()
    assert filedigest.identified_digest(f, direct=True) == buffered
    opened = []
    real_open = os.open

    def no_direct(path, flags, *args):
        opened.append(bool(flags & getattr(os, "O_DIRECT", 0)))
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "no direct I/O here")
        return real_open(path, flags, *args)

    monkeypatch.setattr(filedigest.os, "open", no_direct)
    assert filedigest.identified_digest(f, direct=True) == buffered
    assert opened == [True, False] if hasattr(os, "O_DIRECT") else [False]


def test_a_run_hashes_early_only_when_its_audit_takes_the_digests(packed):
    """`EarlyDigests.start_for`, which `pack-assets run` calls as it starts and its plan again: an incremental
    plan with the default audit scope hashes the kept output shards; a full replan (it rewrites them), the quick
    audit (it hashes nothing) and a blend (audited folder by folder) start no reading at all."""
    inp, work, out, _ = packed
    assert run_audit(work, out, digests=False).ok
    shard = sorted(out.glob("*.tar"))[0].resolve()
    base = {"input_dir": str(inp), "work_dir": str(work), "output_dir": str(out)}
    with filedigest.EarlyDigests().start_for(Settings(**base, plan=PlanConfig(incremental=True))) as early:
        assert early.digest(shard) == filedigest.file_digest(shard) is not None
    for options in ({}, {"audit_scope": "changed", "plan": PlanConfig(incremental=True)},
                    {"recipe": "r.yaml", "plan": PlanConfig(incremental=True)}):
        with filedigest.EarlyDigests().start_for(Settings(**base, **options)) as early:
            assert early.digest(shard) is None, options


def test_lookup_round_trips_sample_to_pack_and_back(packed):
    _, work, out, _ = packed
    with store.connect(work, read_only=True) as con:
        sample = lookup(con, "part-000/s0_002")
        assert sample["outcome"] == "packed"
        pack = lookup(con, sample["pack_id"])
        src = pack["sources"][sample["position"]]
        assert src["sample_id"] == "part-000/s0_002" and src["key"] == "s0_002"
        assert {m["name"] for m in src["members"]} == {"s0_002.json", "s0_002.a.png", "s0_002.b.webp"}
        with tarfile.open(out / pack["output_shard"]) as tf:
            names = set(tf.getnames())
        assert set(sample["output_members"]) <= names
        bad = lookup(con, "part-000/bad0")
        assert bad["outcome"] == "rejected" and bad["reasons"][0]["reason"] == "invalid_json"
        with pytest.raises(KeyError):
            lookup(con, "nope")


def test_overlong_samples_are_dropped_with_their_length(dataset, tmp_path):
    work = tmp_path / "w"
    run_all(dataset, work, tmp_path / "o", max_len=200)
    with store.connect(work, read_only=True) as con:
        dropped = con.execute("SELECT d.total_tokens, t.total_tokens, d.reason FROM dropped d "
                              "JOIN token_lengths t USING (sample_id)").fetchall()
        assert dropped and all(a == b > 200 and r == "overlong" for a, b, r in dropped)
        assert con.execute("SELECT max(total_token_len) FROM pack_plan").fetchone()[0] <= 200
    assert run_audit(work, tmp_path / "o").ok


@pytest.mark.parametrize("where", ["here", "helper"])
def test_sampled_recount_catches_a_tampered_token_length(packed, monkeypatch, where):
    """`pack-assets run` hands the recount to its helper processes (the audit's pool): it must find what the
    recount in the audit's own process finds, and this process then counts nothing itself."""
    _, work, out, _ = packed
    with contextlib.ExitStack() as stack:
        pool = None
        if where == "helper":
            pool = stack.enter_context(Helpers(1)).pool  # started (and forked) before the patch below

            def refuse(*a, **k):
                raise AssertionError("the audit's process counted: the recount was not handed to the helper")

            monkeypatch.setattr(recount_mod, "counter_for", refuse)
        _tampered_recount(work, out, pool)


def test_the_audit_record_names_the_counting_versions_a_helper_looked_up(packed, monkeypatch):
    """Under `pack-assets run` a helper looks up the packages' versions that the clean audit's record names
    (a recount under other versions is not trusted); the audit's process does not, and the record is the same."""
    import importlib.metadata

    _, work, out, _ = packed
    expected = audit_mod._counting_versions()
    with Helpers(1) as helpers:
        audit_mod._counting_versions.cache_clear()

        def refuse(name):
            raise AssertionError(f"the audit's process looked up {name}'s version")

        monkeypatch.setattr(importlib.metadata, "version", refuse)
        assert run_audit(work, out, pool=helpers.pool).ok
    assert json.loads((work / "audited_shards.json").read_text())["versions"] == expected


def _tampered_recount(work: Path, out: Path, pool=None) -> None:
    result = run_audit(work, out, recount_fraction=1.0, pool=pool)
    assert result.ok and result.stats["recounted"] == 24
    # tamper with one shard's stored counts (as a stale or buggy count would look)
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = store.token_dir(work, PROFILE.name, "part-000") / "token_lengths.parquet"
    t = pq.read_table(path)
    col = t.column("total_tokens").to_pylist()
    col[1] += 1
    column = t.schema.get_field_index("total_tokens")
    pq.write_table(t.set_column(column, "total_tokens", pa.array(col, pa.int64())), path)
    checks = {v["check"] for v in run_audit(work, out, recount_fraction=1.0, pool=pool).violations}
    assert "recount_mismatch" in checks and "length_mismatch" in checks


def test_the_quick_audit_recounts_only_the_samples_it_reads_back(packed):
    """Under scope "changed" the recount skips the samples of trusted shards (recounted by the clean audit
    that vouched for them: same content, same profile), unless this audit asks for a larger fraction; a
    tampered count changes its shard's planned content, so that shard is read and its samples recounted."""
    _, work, out, _ = packed
    assert run_audit(work, out, recount_fraction=0.5).ok
    wider = run_audit(work, out, recount_fraction=1.0, scope="changed")  # more than the record covered
    assert wider.ok and wider.stats["output_shards_trusted"] == wider.stats["output_shards"]
    assert wider.stats["recounted"] == 24
    quick = run_audit(work, out, recount_fraction=1.0, scope="changed")
    assert quick.ok and quick.stats["recounted"] == 0
    assert quick.stats["recount_skipped_shards"] == quick.stats["output_shards"]
    record = json.loads((work / "audited_shards.json").read_text())
    record["versions"]["transformers"] = "0.0.1"  # counted under other packages: an upgrade may count otherwise
    (work / "audited_shards.json").write_text(json.dumps(record))
    assert run_audit(work, out, recount_fraction=1.0, scope="changed").stats["recounted"] == 24
    (work / "audited_shards.json").write_text(json.dumps({"shards": None, "recount_fraction": "x"}))  # hand-edited
    assert run_audit(work, out, recount_fraction=1.0, scope="changed").stats["output_shards_trusted"] == 0
    assert run_audit(work, out, recount_fraction=1.0, scope="changed").stats["recounted"] == 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = store.token_dir(work, PROFILE.name, "part-000") / "token_lengths.parquet"
    t = pq.read_table(path)
    col = t.column("total_tokens").to_pylist()
    col[1] += 1
    column = t.schema.get_field_index("total_tokens")
    pq.write_table(t.set_column(column, "total_tokens", pa.array(col, pa.int64())), path)
    tampered = run_audit(work, out, recount_fraction=1.0, scope="changed")
    assert 0 < tampered.stats["recounted"] < 24
    assert tampered.stats["output_shards_trusted"] < tampered.stats["output_shards"]
    assert "recount_mismatch" in {v["check"] for v in tampered.violations}


@pytest.mark.parametrize("name, size", [("p00000001.json", 0), ("p00000001.s000_00.jpg", 123_456),
                                        ("x" * 99, 8**11 - 1), ("ü.json", 5), ("y" * 150, 7), ("big.mp4", 8**11 + 1)])
def test_fast_tar_header_is_byte_identical_to_tarfile(name, size):
    assert tario.member_header(name, size) == tario._tarfile_header(name, size)


def test_plan_check_catches_a_lost_and_a_duplicated_sample(packed):
    from pack_assets.core.audit import check_plan

    _, work, _, summary = packed
    assert summary.violations == []
    with store.connect(work) as con:
        cfg = PlanInfo.load(con).config
        first = con.execute("SELECT pack_id, sample_id FROM pack_members ORDER BY pack_id, position LIMIT 1").fetchone()
        con.execute("DELETE FROM pack_members WHERE pack_id = ? AND sample_id = ?", list(first))
        con.execute("INSERT INTO pack_members (pack_id, position, sample_id) "
                    "SELECT pack_id, 99, sample_id FROM pack_members LIMIT 1")
        checks = {v["check"] for v in check_plan(con, cfg)}
    assert {"lost_sample", "duplicate_sample"} <= checks


def test_incremental_run_keeps_existing_output_shards_and_adds_new_ones(tmp_path):
    from conftest import small_dataset

    inp = small_dataset(tmp_path / "in", n_shards=3)
    work, out = tmp_path / "work", tmp_path / "out"
    first = ["part-000", "part-001"]
    for s in first:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    cfg = PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True)
    assert run_plan(work, first, cfg, PROFILE).planning == "full plan: no previous plan"
    run_write(work, inp, out, workers=1)
    before = {p.name: (sha(p), p.stat().st_mtime_ns) for p in out.glob("*.tar")}
    run_manifest(inp, work, "part-002")
    run_token_lengths(work, "part-002", PROFILE)
    s = run_plan(work, first + ["part-002"], cfg, PROFILE)
    assert s.planning.startswith("incremental") and s.new_packs > 0
    res = run_write(work, inp, out, workers=1)
    assert res.skipped == len(before)
    after = {p.name: (sha(p), p.stat().st_mtime_ns) for p in out.glob("*.tar")}
    assert all(after[k] == v for k, v in before.items()) and len(after) > len(before)
    assert run_audit(work, out).ok
    # a changed packing setting falls back to a full replan
    s = run_plan(work, first + ["part-002"], PlanConfig(max_len=1400, incremental=True), PROFILE)
    assert s.planning.startswith("full plan: packing settings changed")


def _dict_document(job, context, records) -> bytes:
    """The pack document as the writer built it before conversations were spliced in: a dict, json.dumps."""
    samples, refs = [], []
    for i, (sub, raw) in enumerate(zip(job.subs, records)):
        media = [{**m, "output_name": tario.media_name(job.pack_id, i, j, m["name"])} for j, m in enumerate(sub.media)]
        extra = [{**m, "output_name": tario.extra_name(job.pack_id, i, j, m["name"])} for j, m in enumerate(sub.extra)]
        source = None
        if sub.json_member is not None:
            text = bytes(raw).decode("utf-8")
            source = json.loads(text) if sub.json_member["name"].endswith(".json") else text
        entry = {"sample_id": sub.sample_id, "token_len": sub.token_len,
                 "messages": sub.messages if sub.messages is not None else json.loads(sub.messages_json),
                 "media": [m["output_name"].split(".", 1)[1] for m in media], "source": source}
        if sub.extra:
            entry["extra"] = [m["output_name"].split(".", 1)[1] for m in extra]
        samples.append(entry)
        refs.append(SourceRef(sub.sample_id, sub.shard, sub.key, sub.json_member, media, extra, sub.split))
    meta = PackMeta(job.pack_id, job.media_type, [s.sample_id for s in job.subs], [s.token_len for s in job.subs],
                    job.total_token_len, refs, context)
    doc = {"pack_id": job.pack_id, "media_type": job.media_type, "samples": samples, "_meta": meta.as_dict()}
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def test_spliced_pack_document_is_byte_identical_to_dumping_the_dict():
    from pack_assets.core.write.fingerprints import member_key
    from pack_assets.core.write.jobs import PackJob, SubSample, pack_document

    messages = [{"role": "system", "content": [{"type": "text", "text": 'quote " back\\slash \u2028 ü 😀 \x01'}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x", "w": 1.5e-7}]}]
    member = lambda name, off, sha: {"name": name, "offset": off, "size": 7, "sha256": sha}  # noqa: E731
    subs = [
        SubSample('a/"k"', "s", 'a/"k"', "/x", 12, None, member("k.json", 0, "ab"), [member("k.jpg", 512, None)],
                  extra=[member('k.ü"x', 1024, "cd")], conversation_sha256="c",
                  messages_json=json.dumps(messages, ensure_ascii=False)),
        SubSample("b", "s", "b", "/x", 3, messages, member("b.txt", 2048, "ef"), [], messages_json=None),
        SubSample("c", "s", "c", "/x", 0, [], None, [member("c.png", 4096, "01")],
                  split={"source": "c0", "piece": 1, "pieces": 2, "turns": [3, 5], "context": [1, 3]}),  # a piece
        # members not shaped as the catalog gives them: dumped as dicts, same bytes
        SubSample("d", "s", "d", "/x", 1, [], {"size": 3, "name": "d.json", "offset": 0, "sha256": None},
                  [{**member("d.png", 8192, "02"), "frames": [1, 2.5]}, {"name": "d.jpg", "offset": 1.0, "size": 2,
                                                                         "sha256": None, "output_name": "kept"}]),
    ]
    records = [json.dumps({"conversations": [{"from": "human", "value": "é\n"}], "n": [1, 2.5]}).encode(),
               "plain caption ü".encode(), None, b'{"x": 1}']
    job = PackJob("p0001", "image", 16, subs)
    context = {"profile": "qwen3-vl", "max_len": 100, "tool": "pack_assets", "shard_fingerprint": "ff"}
    body, media = pack_document(job, context, records)
    assert body == _dict_document(job, context, records)
    for other in ({}, {**context, "sources": "replaced in place"}):
        assert pack_document(job, other, records)[0] == _dict_document(job, other, records)
    assert [name for name, _, _ in media] == ["p0001.s000_00.jpg", "p0001.s000_x00.ü\"x", "p0001.s002_00.png",
                                              "p0001.s003_00.png", "p0001.s003_01.jpg"]
    for m in [subs[0].json_member, *subs[0].media, *subs[0].extra, {"name": 5, "offset": 1.0, "size": 2, "sha256": 3}]:
        assert member_key(m) == json.dumps([m["name"], m["offset"], m["size"], m["sha256"]], ensure_ascii=False)


def test_writer_jobs_keep_the_shards_order_and_bound_the_rows_a_job_holds():
    from pack_assets.core.write.copy import GROUP_SAMPLES, writer_groups

    names = [f"s{i}" for i in range(9)]
    samples = dict(zip(names, [3000, 3000, 3000, 20000, 100, 100, 9000, 9000, 1]))
    for workers in (1, 2, 3):
        groups = writer_groups(names, workers, samples)
        assert sum(groups, []) == names  # every shard once, in order
        cap = GROUP_SAMPLES if workers == 1 else min(GROUP_SAMPLES, -(-sum(samples.values()) // (2 * workers)))
        assert all(len(g) == 1 or sum(samples[n] for n in g) <= cap for g in groups)
        assert len(groups) >= (2 * workers if workers > 1 else 1)
    assert writer_groups(names, 1, samples)[0] == ["s0", "s1", "s2"]  # small shards share a job
    assert writer_groups(names, 2) == [[n] for n in names] and writer_groups([], 2, {}) == []


def test_the_writers_json_text_is_json_dumps_text():
    from pack_assets.core.write.jobs import dumps

    values = [{"a": [1, 2.5, -0.0, 1e300, 1e-7, True, None], "é 😀": {"q": 'quote " \\ \u2028 \x01'}},
              [float("nan"), float("inf"), -float("inf"), 10**30], "plain ü", 3, None, [], {}]
    for v in values:
        assert dumps(v) == json.dumps(v, ensure_ascii=False)
    with pytest.raises(TypeError):  # what is not JSON is refused as json.dumps refuses it
        dumps({"x": object()})


def test_bulk_built_documents_and_fingerprint_equal_the_dict_and_the_job_path():
    """The copy-mode writer builds a shard's documents column by column (write/bulk.py): with each record's
    text spliced in, every pack's bytes are json.dumps of its dict, and the fingerprint is ShardFingerprint's."""
    from pack_assets.core.write import bulk, places
    from pack_assets.core.write.jobs import PackJob, ShardJob, SubSample, pack_document
    from pack_assets.core.write.shard import _source

    messages = [{"role": "user", "content": [{"type": "text", "text": 'quote " back\\slash \u2028 ü 😀 \x01'}]}]
    member = lambda name, off, sha: {"name": name, "offset": off, "size": 7, "sha256": sha}  # noqa: E731
    subs = [SubSample('a/"k"', "s", 'a/"k"', "/x", 12, None, member("k.json", 0, "ab"), [member("k.JPG", 512, None)],
                      extra=[member('k.ü"x', 1024, "cd"), member("k", 1536, "ce")], conversation_sha256="c",
                      source_stamp="9:9", messages_json=json.dumps(messages, ensure_ascii=False)),
            SubSample("b", "t", "b", "/y", 3, messages, member("b.txt", 2048, "ef"), [], messages_json=None),
            SubSample("c", "s", "c", "/x", 0, [], None, [member("c.png", 4096, "01"), member("d.x/C", 4608, "02")],
                      extra=[member("d.x/c", 5120, "03"), member("c.", 5632, "04"), member("c.tar.GZ", 6144, None)],
                      split={"source": "c0", "piece": 1, "pieces": 2, "turns": [3, 5], "context": [1, 3]})]  # a piece
    records = [json.dumps({"conversations": [{"from": "human", "value": "é\n"}], "n": [1, 2.5]}).encode(),
               "plain caption ü".encode(), None]
    # the second pack's key holds a dot (its members' parts are then not their names after the first dot)
    job = ShardJob("x.tar", [PackJob("p0001", "image", 16, subs[:2]), PackJob("p.0002", "text", 5, subs[1:])])
    for context in ({"profile": "qwen3-vl", "max_len": 100}, {"sources": "replaced in place"}):
        built = bulk.build_shard(job.name, bulk.job_columns(job), context)
        assert built.fingerprint == fingerprints.shard_fingerprint(job, context)
        meta = {**context, "shard_fingerprint": built.fingerprint}
        for pack, got, recs in zip(job.packs, built.packs, (records[:2], records[1:])):
            texts = [b"null" if r is None else _source(r, places.JSON if sub.json_member["name"].endswith(".json")
                                                         else places.CAPTION) for r, sub in zip(recs, pack.subs)]
            doc = b"".join([x for pair in zip(got.heads, texts) for x in pair] + [got.tail])
            assert doc == _dict_document(pack, meta, recs)
            assert got.names == [n for n, _, _ in pack_document(pack, meta, recs)[1]]


@pytest.mark.parametrize("pack_ids", [["p00000001", "p00000002"], ["p.1", "dir/p2", "__p3__"]])
def test_energon_index_kept_while_writing_equals_reading_the_shard_back(tmp_path, pack_ids):
    from pack_assets.core.write.energon import sample_index
    from pack_assets.core.write.jobs import PackJob, ShardJob, SubSample
    from pack_assets.core.write.shard import write_shard

    src = tmp_path / "src.bin"
    blobs = [os.urandom(n) for n in (10, 700, 5000, 1 << 20)]  # the last one is copied in kernel
    src.write_bytes(b"".join(blobs))
    refs, off = [], 0
    for i, b in enumerate(blobs):
        refs.append({"name": f"k.{i}.jpg", "offset": off, "size": len(b), "sha256": None})
        off += len(b)
    record = json.dumps({"caption": "x" * (1 << 20)}).encode()  # a record of over 1 MiB is read, not copied
    with open(src, "ab") as f:
        f.write(record)
    rec = {"name": "k.json", "offset": off, "size": len(record), "sha256": None}
    packs = [PackJob(pid, "image", 5, [SubSample(f"s{i}", "s", f"k{i}", str(src), 5, [], rec if i == 0 else None,
                                                 refs[i::2])])
             for i, pid in enumerate(pack_ids)]
    result = write_shard(str(tmp_path), ShardJob("out.tar", packs), {"profile": "x"})
    assert result.index == sample_index(tmp_path / "out.tar")
    with tarfile.open(tmp_path / "out.tar") as tf:
        got = [tf.extractfile(m).read() for m in tf.getmembers() if m.name.endswith(".jpg")]
    assert got == [blobs[j] for i in range(len(pack_ids)) for j in range(len(blobs))[i::2]]
    first = json.loads(tarfile.open(tmp_path / "out.tar").extractfile(f"{pack_ids[0]}.json").read())
    assert first["samples"][0]["source"] == {"caption": "x" * (1 << 20)}


def test_the_audit_uses_the_writers_fingerprints_only_while_they_hold(packed):
    """The writer records each output shard's fingerprint so the audit skips the query over every sample:
    the audit vouches for the same stamps either way, and an edited source voids the record even when the
    plan (ids and lengths) stays the same."""
    inp, work, out, _ = packed
    assert run_audit(work, out).ok
    from_record = json.loads((work / "audited_shards.json").read_text())
    (work / write_record.WRITTEN).unlink()
    assert run_audit(work, out).ok
    assert json.loads((work / "audited_shards.json").read_text()) == from_record and from_record
    run_write(work, inp, out, workers=1)  # all current: the record is written again, nothing rewritten
    assert (work / write_record.WRITTEN).exists()
    # flip one byte inside an image of a source shard: same size, same header, so same token count and plan
    with store.connect(work, read_only=True) as con:
        sid, offset, size = con.execute(
            """SELECT m.sample_id, m."offset", m.size FROM members m JOIN pack_members USING (sample_id)
               WHERE m.name LIKE '%.jpg' ORDER BY 1 LIMIT 1""").fetchone()
        plan_before = PlanInfo.load(con).fingerprint
    src = inp / f"{sid.split('/')[0]}.tar"
    with open(src, "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    with store.connect(work, read_only=True) as con:
        assert PlanInfo.load(con).fingerprint == plan_before
    # the writer did not run since: the quick audit must not trust the shard that now differs from its source
    quick = run_audit(work, out, scope="changed")
    assert "media_hash_mismatch" in {v["check"] for v in quick.violations}
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out, scope="changed").ok


def test_a_bad_duckdb_memory_limit_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(store.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="PACK_ASSETS_DUCKDB_MEMORY='lots'"):
        store.connect(tmp_path)
    monkeypatch.setenv(store.MEMORY_ENV, "300MB")
    with store.connect(tmp_path) as con:
        settings = con.execute("SELECT current_setting('memory_limit'), current_setting('enable_progress_bar')")
        assert settings.fetchone() == ("286.1 MiB", False)


def _energon_rows(out: Path) -> tuple[list, list]:
    import sqlite3

    with sqlite3.connect(out / ".nv-meta" / "index.sqlite") as db:
        return (db.execute("SELECT * FROM samples ORDER BY tar_file_id, sample_index").fetchall(),
                db.execute("SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset"
                           ).fetchall())


def test_a_rerun_keeps_the_energon_index_rows_of_untouched_shards_only_while_the_record_vouches(packed, monkeypatch):
    inp, work, out, _ = packed
    fresh = _energon_rows(out)
    read_back = []
    real = energon.sample_index
    monkeypatch.setattr(energon, "sample_index", lambda p: read_back.append(p.name) or real(p))
    run_write(work, inp, out, workers=1)  # every shard current: their rows come from the last index
    assert read_back == [] and _energon_rows(out) == fresh
    # a shard touched since (new mtime) and an index not the one the record hashed are read back instead
    shards = sorted(out.glob("*.tar"))
    os.utime(shards[0], ns=(shards[0].stat().st_atime_ns, shards[0].stat().st_mtime_ns + 1000))
    run_write(work, inp, out, workers=1)
    assert read_back == [shards[0].name] and _energon_rows(out) == fresh
    read_back.clear()
    with open(out / ".nv-meta" / "index.sqlite", "ab") as f:
        f.write(b"\0")
    run_write(work, inp, out, workers=1)
    assert sorted(read_back) == [s.name for s in shards] and _energon_rows(out) == fresh


def test_after_an_incremental_plan_the_energon_index_grows_from_the_last_one(packed, monkeypatch):
    """An incremental plan's new output shards come after the kept ones: the index starts as the file the
    last write left and gains only their rows (no kept shard's parts read, no tar read back); it holds the
    rows an index built by reading every shard back holds."""
    inp, work, out, _ = packed
    shutil.copy(inp / "part-000.tar", inp / "part-zzz.tar")
    run_manifest(inp, work, "part-zzz")
    run_token_lengths(work, "part-zzz", PROFILE)
    run_plan(work, list(store.find_shards(inp)), PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True),
             PROFILE)
    before = {p.name for p in out.glob("*.tar")}
    read_back, rows_read = [], []
    real_index, real_rows = energon.sample_index, energon.LastIndex.rows
    monkeypatch.setattr(energon, "sample_index", lambda p: read_back.append(p.name) or real_index(p))
    monkeypatch.setattr(energon.LastIndex, "rows",
                        staticmethod(lambda db, tar_id, parts=True: rows_read.append(parts)
                                     or real_rows(db, tar_id, parts)))
    res = run_write(work, inp, out, workers=1)
    assert res.written >= 1 and res.skipped == len(before) and {p.name for p in out.glob("*.tar")} > before
    assert read_back == [] and rows_read == [False] * len(before)
    grown = _energon_rows(out)
    assert {r[0] for r in grown[0]} == set(range(res.shards))
    (work / write_record.WRITTEN).unlink()  # no record: every shard's rows come from its tar headers
    run_write(work, inp, out, workers=1)
    assert sorted(read_back) == sorted(p.name for p in out.glob("*.tar")) and _energon_rows(out) == grown
    assert not list((out / ".nv-meta").glob(".index.sqlite.tmp-*"))


def test_the_writers_record_is_keyed_by_every_catalog_file(packed):
    """A forced rescan or a recount rewrites a catalog file without changing the plan's fingerprint: the
    record must then no longer hold."""
    _, work, out, _ = packed
    with store.connect(work, read_only=True) as con:
        files = store.catalog_files(con)
        info = PlanInfo.load(con)
        key = write_record.written_key(con, info, write_context(info))
    assert any("/manifest/" in f and f.endswith("samples.parquet") for f in files)
    assert any("/token_lengths/" in f for f in files) and all(Path(f).exists() for f in files)
    token_file = next(Path(f) for f in files if "/token_lengths/" in f)
    st = token_file.stat()
    os.utime(token_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    with store.connect(work, read_only=True) as con:
        assert write_record.written_key(con, info, write_context(info)) != key


def test_a_rerun_vouches_for_its_own_shards_by_content_digest_and_for_nothing_it_did_not_check(packed, monkeypatch):
    """The writer's record keeps a DuckDB digest of each shard's planned content: a rerun with the same
    content finds every shard current without the fingerprint query; an image byte edited in place (size and
    mtime kept, a forced rescan) changes only the digest of the shard holding that image, so the record
    refutes that shard alone (no fingerprint query either), and only it is rewritten. A shard that is not as
    the writer left it, or a record of another digest format, goes to the fingerprint query."""
    inp, work, out, _ = packed
    run_write(work, inp, out, workers=1)  # the record now holds digests
    asked: list = []
    real = write_copy.current_shards
    monkeypatch.setattr(write_copy, "current_shards", lambda *a, **k: asked.append(k.get("only")) or real(*a, **k))
    names = sorted(p.name for p in out.glob("*.tar"))
    res = run_write(work, inp, out, workers=1)
    assert asked == [set()] and (res.written, res.skipped) == (0, len(names)) and len(names) >= 2
    record = json.loads((work / write_record.WRITTEN).read_text())
    assert {n: s[2] for n, s in record["shards"].items()} == \
        {n: tario.first_pack_meta(out / n)["shard_fingerprint"] for n in names}
    with store.connect(work, read_only=True) as con:
        sid, offset, size, shard = con.execute(
            """SELECT m.sample_id, m."offset", m.size, p.output_shard FROM members m
               JOIN pack_members pm USING (sample_id) JOIN pack_plan p USING (pack_id)
               WHERE m.name LIKE '%.jpg' ORDER BY 1 LIMIT 1""").fetchone()
        plan_before = PlanInfo.load(con).fingerprint
    src = inp / f"{sid.split('/')[0]}.tar"
    st = src.stat()
    with open(src, "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    shards = list(store.find_shards(inp))
    run_manifest(inp, work, sid.split("/")[0], force=True)
    for s in shards:
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    with store.connect(work, read_only=True) as con:
        assert PlanInfo.load(con).fingerprint == plan_before
    before = {n: sha(out / n) for n in names}
    asked.clear()
    res = run_write(work, inp, out, workers=1)
    assert asked == [set()] and res.written == 1
    assert {n for n in names if sha(out / n) != before[n]} == {shard}
    assert run_audit(work, out).ok
    # a shard touched since the writer left it, and then every shard under a record of another format: the
    # fingerprint query decides, and finds them current
    other = next(n for n in names if n != shard)
    os.utime(out / other)
    asked.clear()
    res = run_write(work, inp, out, workers=1)
    assert asked == [{other}] and res.written == 0
    record = json.loads((work / write_record.WRITTEN).read_text())
    (work / write_record.WRITTEN).write_text(json.dumps({**record, "digest_format": 1}))
    asked.clear()
    res = run_write(work, inp, out, workers=1)
    assert asked == [set(names)] and res.written == 0


class _Asked:
    """A catalog connection that notes each query it runs."""

    def __init__(self, con):
        self.con, self.queries = con, []

    def execute(self, query, *args):
        self.queries.append((query, *args))
        return self.con.execute(query, *args)


def test_the_writer_takes_each_digest_from_its_record_until_its_sources_catalog_files_change(packed):
    """A shard's digest is keyed by its plan lines and the catalog files of the source shards its samples
    come from. With nothing changed none is computed; after a shard is added and planned incrementally, only
    the new output shards' digests are; after that source is rescanned (its files rewritten), only those of
    the output shards holding its samples. Each time they equal the digests computed from scratch."""
    inp, work, out, _ = packed
    run_write(work, inp, out, workers=1)

    def digests() -> tuple[dict, dict, list]:
        record = json.loads((work / write_record.WRITTEN).read_text())
        with store.connect(work, read_only=True) as con:
            asked = _Asked(con)
            got = write_record.shard_digests(asked, record)
            assert got[0] == write_record.shard_digests(con)[0]
        return *got, [q[1:] for q in asked.queries if "md5(conversation)" in q[0]]

    old, keys, computed = digests()
    assert computed == [] and len(old) >= 2
    shutil.copy(inp / "part-000.tar", inp / "part-zzz.tar")  # same bytes, new sample ids
    run_manifest(inp, work, "part-zzz")
    run_token_lengths(work, "part-zzz", PROFILE)
    shards = list(store.find_shards(inp))
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True), PROFILE)
    new, keys, computed = digests()
    added = sorted(set(new) - set(old))
    assert added and {n: new[n] for n in old} == old and computed == [([added] * 4,)]
    run_write(work, inp, out, workers=1)
    run_manifest(inp, work, "part-zzz", force=True)
    run_token_lengths(work, "part-zzz", PROFILE)
    again, rekeyed, computed = digests()
    assert again == new and {n for n in keys if rekeyed[n] != keys[n]} == set(added)
    assert computed == [([added] * 4,)]
    record = json.loads((work / write_record.WRITTEN).read_text())
    (work / write_record.WRITTEN).write_text(json.dumps({**record, "digest_keys": {}}))  # as written before the keys
    assert digests()[2] == [()]  # every digest computed, in one query over every shard


def test_a_touched_source_is_rescanned_and_its_output_shards_are_kept_a_new_plan_refutes_every_shard(packed,
                                                                                                     monkeypatch):
    """A source shard copied or touched (new mtime, same bytes) is rescanned; its members are hashed, so the
    digest, like the fingerprint, leaves its mtime out: every output shard is vouched for, none rewritten.
    A replan after a source is removed moves samples between packs under the same settings: the record
    refutes the shards by their digest (no fingerprint query) and each is rewritten, byte for byte what a
    write into an empty folder gives."""
    inp, work, out, _ = packed
    run_write(work, inp, out, workers=1)
    names = sorted(p.name for p in out.glob("*.tar"))
    asked: list = []
    real = write_copy.current_shards
    monkeypatch.setattr(write_copy, "current_shards", lambda *a, **k: asked.append(k.get("only")) or real(*a, **k))
    shards = list(store.find_shards(inp))
    src = inp / f"{shards[0]}.tar"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert manifest_is_current(inp, work, shards[0]) is None
    run_manifest(inp, work, shards[0])
    for s in shards:
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    with store.connect(work, read_only=True) as con:
        vouched, refuted = write_record.vouched_shards(work, out, write_context(PlanInfo.load(con)),
                                                      write_record.shard_digests(con)[0])
    assert sorted(r.shard for r in vouched) == names and not refuted
    res = run_write(work, inp, out, workers=1)
    assert asked == [set()] and (res.written, res.skipped) == (0, len(names))
    (inp / f"{shards[-1]}.tar").unlink()  # a source removed: the same settings (context), other packs
    shards = list(store.find_shards(inp))
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    with store.connect(work, read_only=True) as con:
        vouched, refuted = write_record.vouched_shards(work, out, write_context(PlanInfo.load(con)),
                                                      write_record.shard_digests(con)[0])
    assert refuted and not vouched  # refuted by digest alone: the context is the one recorded
    asked.clear()
    res = run_write(work, inp, out, workers=1)
    new_names = sorted(p.name for p in out.glob("*.tar"))
    assert len(asked) == 1 and not asked[0] & set(names)  # nothing on disk needed the fingerprint query
    assert res.written == len(new_names) and res.skipped == 0
    fresh = out.parent / "fresh"
    run_write(work, inp, fresh, workers=1)
    assert {n: sha(out / n) for n in new_names} == {n: sha(fresh / n) for n in new_names}
    assert run_audit(work, out).ok


def test_a_plan_that_mixes_media_types_by_setting_passes_its_checks_and_audit(dataset, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    summary = run_all(dataset, work, out, max_len=4000, pack_per_media_type=False)
    with store.connect(work, read_only=True) as con:
        mixed = con.execute("""SELECT count(*) FROM (SELECT pm.pack_id FROM pack_members pm JOIN samples s
                               USING (sample_id) GROUP BY pm.pack_id HAVING count(DISTINCT s.media_type) > 1)""")
        assert mixed.fetchone()[0] > 0  # the setting did mix them
    assert summary.violations == []
    result = run_audit(work, out)
    assert result.ok, result.verdict
