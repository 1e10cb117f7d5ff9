"""Kill the pipeline (SIGKILL, in a subprocess) at 24 points across scan, count, plan and write; rerun;
the final DuckDB tables and output bytes equal those of a clean run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pack_assets.core import store

HARNESS = Path(__file__).with_name("fault_harness.py")
sys.path.insert(0, str(HARNESS.parent))
from fault_harness import run_pipeline as rerun  # noqa: E402
from fault_harness import snapshot  # noqa: E402

KILL_POINTS = [
    ("pack_assets.core.scan:iter_entries", 2),
    ("pack_assets.core.scan:classify", 7),
    ("pack_assets.core.scan:probe_image", 3),
    ("pack_assets.core.store:BatchedParquet.flush", 2),
    ("pack_assets.core.store:BatchedParquet.close", 3),
    ("pack_assets.core.store:write_manifest", 2),
    ("pack_assets.core.store:os.replace", 1),
    ("pack_assets.core.store:os.replace", 2),
    ("pack_assets.core.store:pq.write_table", 2),
    ("pack_assets.core.counting.token_lengths:run_token_lengths", 2),
    ("pack_assets.core.counting.tokens:TokenCounter.lengths", 1),
    ("pack_assets.core.store:write_token_lengths", 1),
    ("pack_assets.core.store:atomic_write_text", 2),
    ("pack_assets.core.plan:make_plan", 1),
    ("pack_assets.core.report:simulate", 1),
    ("pack_assets.core.plan:plan_jsonl", 1),
    ("pack_assets.core.plan:check_plan", 1),
    ("pack_assets.core.write.copy:build_shard", 1, 1),
    # a pack's document header, one per pack (the members' headers are built with the shard): killed with the
    # first output shard's first pack written, then with the first shard done and the second one's first written
    ("pack_assets.core.write.shard:member_header", 2, 1),
    ("pack_assets.core.write.shard:member_header", 4, 1),
    ("pack_assets.core.write.shard:member_header", 2, 2),  # a writer process of the pool dies
    ("pack_assets.core.write.shard:os.fsync", 1),
    ("pack_assets.core.write.shard:os.replace", 2),
    ("pack_assets.core.write.shared:write_energon_meta", 1),
    ("pack_assets.core.write.shared:write_wids_index", 1),
]


def run(inp: Path, work: Path, out: Path, *fault) -> int:
    return subprocess.run([sys.executable, str(HARNESS), str(inp), str(work), str(out), *map(str, fault)],
                          capture_output=True, timeout=300).returncode


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    from conftest import small_dataset

    root = tmp_path_factory.mktemp("rel")
    inp = small_dataset(root / "in", n_shards=3, per_shard=10)
    assert run(inp, root / "work", root / "out") == 0
    return inp, snapshot(root / "work", root / "out")


@pytest.mark.parametrize("point", KILL_POINTS, ids=[f"{p[0].split(':')[1]}#{p[1]}" + (f"-w{p[2]}" if len(p) > 2 else "")
                                                   for p in KILL_POINTS])
def test_kill_then_rerun_equals_a_clean_run(clean, tmp_path, point):
    inp, expected = clean
    work, out = tmp_path / "work", tmp_path / "out"
    target, n, *workers = point
    code = run(inp, work, out, target, n, *workers)
    # killed at that point: the process itself, or (pool worker) the run fails on the broken pool
    assert code == -9 if workers != [2] else code not in (0, 3)
    # the rerun in this process (one writer process: forking pytest is not what users do; the bytes are the same)
    assert rerun(inp, work, out, 1) == 0
    got = snapshot(work, out)
    assert got["plan"] == expected["plan"]
    assert got["tables"] == expected["tables"]
    assert got["files"] == expected["files"]
    assert not [p for p in out.rglob(".*tmp*")] and not [p for p in work.rglob(".*.tmp-*")]


# --- bad inputs beyond the manifest's own classes -------------------------------------------------------

import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tarfile  # noqa: E402

from conftest import chat, image_bytes, small_dataset, write_tar  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pack_assets.core import scan as scan_mod  # noqa: E402
from pack_assets.core.audit import run_audit  # noqa: E402
from pack_assets.core.counting.profiles import load_profile  # noqa: E402
from pack_assets.core.counting.token_lengths import run_token_lengths  # noqa: E402
from pack_assets.core.faults import NoSpace  # noqa: E402
from pack_assets.core.plan import PlanConfig, run_plan  # noqa: E402
from pack_assets.core.records import ShardInfo  # noqa: E402
from pack_assets.core.scan import ScanOptions, run_manifest, scan_shard  # noqa: E402
from pack_assets.core.tario import split_key  # noqa: E402
from pack_assets.core.write import SourceChanged, run_write  # noqa: E402
from pack_assets.core.write import shard as write_shard_mod  # noqa: E402

PROFILE = load_profile("qwen3-vl")


def _prepare(inp: Path, work: Path) -> list[str]:
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=2), PROFILE)
    return shards


def test_a_shard_changed_or_deleted_after_the_scan_is_never_copied_from(tmp_path):
    inp = small_dataset(tmp_path / "in")
    work, out = tmp_path / "work", tmp_path / "out"
    _prepare(inp, work)
    with open(inp / "part-000.tar", "ab") as f:
        f.write(b"\0" * 512)  # appended to after the scan
    with pytest.raises(SourceChanged, match="part-000: changed"):
        run_write(work, inp, out)
    (inp / "part-001.tar").unlink()
    with pytest.raises(SourceChanged, match="part-001: FileNotFoundError"):
        run_write(work, inp, out)
    assert not list(out.glob("*.tar")) if out.exists() else True


def test_a_shard_that_changes_while_it_is_scanned_is_flagged(tmp_path):
    path = write_tar(tmp_path / "x.tar", [(f"{i}.json", json.dumps(chat())) for i in range(5)])
    recs = []
    for r in scan_shard(path, "x"):
        recs.append(r)
        if len(recs) == 2:
            os.utime(path, ns=(1, 1))
    assert [r.reason for r in recs if getattr(r, "reason", None) == "shard_changed"] == ["shard_changed"]


def test_full_disk_on_output_leaves_no_partial_file_and_a_rerun_finishes(tmp_path, monkeypatch):
    inp = small_dataset(tmp_path / "in")
    work, out = tmp_path / "work", tmp_path / "out"
    _prepare(inp, work)
    real = write_shard_mod.writev_all
    calls = {"n": 0}

    def full(fd, bufs):  # the disk fills up while a shard's second pack is written (its first is on disk)
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bufs)

    monkeypatch.setattr(write_shard_mod, "writev_all", full)
    with pytest.raises(NoSpace, match=f"no space left on device for the output folder {out}: "):
        run_write(work, inp, out, workers=1)
    assert calls["n"] == 2 and not list(out.glob(".*tmp*"))
    monkeypatch.setattr(write_shard_mod, "writev_all", real)
    run_write(work, inp, out, workers=1)
    assert run_audit(work, out).ok


def test_permission_denied_is_a_reason_row(tmp_path, monkeypatch):
    path = write_tar(tmp_path / "x.tar", [("k.json", json.dumps(chat()))])

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(scan_mod, "open", denied, raising=False)
    recs = list(scan_shard(path, "x"))
    assert [(r.key, r.reason) for r in recs] == [(None, "unreadable_shard")] and "Permission" in recs[0].detail


def test_a_shard_of_100k_tiny_samples(tmp_path):
    path = tmp_path / "tiny.tar"
    body = json.dumps({"caption": "a"}).encode()
    ti, member, parts = tarfile.TarInfo(""), body + b"\0" * (-len(body) % 512), []
    for i in range(100_000):  # tarfile's own headers, without a file object per member
        ti.name, ti.size = f"{i:06d}.json", len(body)
        parts += (ti.tobuf(), member)
    path.write_bytes(b"".join(parts) + b"\0" * 1024)
    info = ShardInfo("tiny", str(path), 0, 0)
    rows = scan_shard(path, "tiny", ScanOptions(hash_members=False), info)
    counts = store.write_manifest(tmp_path / "w", "tiny", rows, info)
    assert counts == {"samples": 100_000, "members": 100_000, "rejected": 0} and info.n_ok == 100_000


def test_a_sample_with_500_images_and_the_media_limit(tmp_path):
    img = image_bytes(8, 8, "PNG")
    rec = {"conversations": [{"from": "human", "value": "count them"}, {"from": "gpt", "value": "500"}],
           "images": [f"{i}.png" for i in range(500)]}
    path = write_tar(tmp_path / "x.tar", [("k.json", json.dumps(rec))] + [(f"k.{i}.png", img) for i in range(500)])
    recs = list(scan_shard(path, "x"))
    assert recs[0].status == "ok" and recs[0].n_images == 500
    from pack_assets.core.counting.tokens import TokenCounter

    (res,) = TokenCounter(PROFILE).count_many([(json.loads(recs[0].conversation), recs[0].image_sizes, [])])
    assert res["image_tokens"] == 500 * 64  # 8x8 -> min_pixels 65536 -> 256x256 -> 8x8 patches of 32
    limited = list(scan_shard(path, "x", ScanOptions(max_media_per_sample=100)))
    assert limited[-1].reason == "too_many_media"


def test_nothing_is_extracted_by_name(tmp_path):
    evil = write_tar(tmp_path / "x.tar", [("../../escaped.json", json.dumps(chat())), ("ok.json", json.dumps(chat()))])
    before = set(tmp_path.parent.parent.iterdir())
    list(scan_shard(evil, "x"))
    assert set(tmp_path.parent.parent.iterdir()) == before and not (tmp_path.parent / "escaped.json").exists()


_names = st.lists(
    st.tuples(st.from_regex(r"[a-z0-9_]{1,6}(/[a-z0-9_.]{1,6}){0,2}", fullmatch=True),
              st.from_regex(r"[a-z0-9]{1,4}(\.[a-z0-9]{1,4}){0,2}", fullmatch=True)),
    min_size=1, max_size=12)


@given(_names)
@settings(max_examples=150, deadline=None)
def test_key_grouping_agrees_with_webdataset(pairs):
    from webdataset.tariterators import base_plus_ext

    for base, ext in pairs:
        name = f"{base}.{ext}"
        if "." in base.rsplit("/", 1)[-1]:
            continue
        assert split_key(name) == base_plus_ext(name)


@given(st.lists(st.lists(st.binary(min_size=0, max_size=3000), min_size=0, max_size=4), min_size=1, max_size=6),
       st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_writer_reader_round_trip_keeps_every_byte(sub_media, packs_per_shard):
    import tempfile

    from pack_assets.core.write.copy import write_all
    from pack_assets.core.write.jobs import PackJob, ShardJob, SubSample
    from pack_assets.reader import iter_packs

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        src = d / "src.bin"
        offset, subs = 0, []
        with open(src, "wb") as f:
            for i, media in enumerate(sub_media):
                refs = []
                for j, data in enumerate(media):
                    f.write(data)
                    refs.append({"name": f"k{i}.{j}.jpg", "offset": offset, "size": len(data), "sha256": None})
                    offset += len(data)
                subs.append(SubSample(f"s/k{i}", "s", f"k{i}", str(src), 10 + i, [{"role": "user", "content": []}],
                                      None, refs))
        packs = [PackJob(f"p{k:08d}", "image", sum(s.token_len for s in subs[k::len(subs)]), [subs[k]])
                 for k in range(len(subs))]
        jobs = [ShardJob(f"packed-{n:06d}.tar", packs[i:i + packs_per_shard])
                for n, i in enumerate(range(0, len(packs), packs_per_shard))]
        context = {"profile": "x", "profile_fingerprint": "x", "config_fingerprint": "x", "max_len": 100}
        write_all(d / "out", jobs, context, workers=1)
        got = list(iter_packs(sorted((d / "out").glob("*.tar"))))
        assert [p["pack_id"] for p in got] == [p.pack_id for p in packs]
        for pack, media in zip(got, sub_media):
            assert [data for _, data in pack["samples"][0]["media"]] == media
