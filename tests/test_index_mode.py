"""Index-only packs (`output_mode: index`, issue 20 item 4): the same packs as copy mode without a copy of the
media, read from the sources by byte range; a changed source is caught before reading, by the reader and the
audit; reruns and switching modes keep the tool's rules on what it owns."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import image_bytes, needs, small_dataset, write_tar

from pack_assets.core import store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.indexmode import INDEX_FILE, IndexSourceChanged
from pack_assets.core.owned import ForeignFiles
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import SourceChanged, run_write, run_write_index
from pack_assets.reader import PackEncoder, iter_packs

PROFILE = load_profile("qwen3-vl")
MODE_KEYS = ("shard_fingerprint", "output_mode")  # what `_meta` says about the output itself, not the pack


def plan_all(inp: Path, work: Path, max_len: int = 1500) -> None:
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=max_len, max_packs_per_shard=2), PROFILE)


def same_pack(p: dict) -> dict:
    """A pack with the `_meta` keys that name the output mode left out."""
    return {**p, "_meta": {k: v for k, v in p["_meta"].items() if k not in MODE_KEYS}}


@pytest.fixture(autouse=True)
def no_png(monkeypatch):
    """The report's figures are drawn but not rendered to PNG: seconds each, and tested elsewhere."""
    from pack_assets.core import report

    def placeholder(fig, path: Path) -> None:
        report._plt().close(fig)
        store.atomic_write_text(path, "plot skipped in test_index_mode")

    monkeypatch.setattr(report, "_save", placeholder)


def audit(work: Path, out: Path):
    return run_audit(work, out, recount_fraction=0)  # recounting is the token stage's test, not this one's


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture
def both(tmp_path):
    dataset = small_dataset(tmp_path / "in", per_shard=6)  # text, one- and two-image samples; 12 media
    work = tmp_path / "work"
    plan_all(dataset, work, max_len=500)
    copy, index = tmp_path / "copy", tmp_path / "index"
    run_write(work, dataset, copy, workers=1)
    run_write_index(work, dataset, index, workers=1)
    return dataset, work, copy, index


def test_index_mode_yields_the_copy_modes_packs_and_token_ids(both):
    inp, work, copy, index = both
    assert not any(n.split(".", 1)[1] not in ("json", "index.json")
                   for t in index.glob("*.tar") for n in tarfile.open(t).getnames())  # no media member
    from_copy, from_index = list(iter_packs(copy)), list(iter_packs(index))
    assert len(from_copy) == len(from_index) > 3
    assert [same_pack(p) for p in from_copy] == [same_pack(p) for p in from_index]  # every media byte too
    assert sum(len(s["media"]) for p in from_index for s in p["samples"]) >= 10
    assert from_index[0]["_meta"]["output_mode"] == "index"
    enc = PackEncoder("qwen3-vl")
    for a, b in zip(from_copy, from_index):
        ea, eb = enc.encode(a), enc.encode(b)
        for k in ("input_ids", "labels", "cu_seqlens", "rope_position_ids"):
            assert np.array_equal(ea[k], eb[k])
        assert ea["images"] == eb["images"]
    # a tar path and a list of them read the same as the folder
    assert [p["pack_id"] for p in iter_packs(sorted(index.glob("*.tar")))] == [p["pack_id"] for p in from_index]
    result = audit(work, index)
    assert result.ok and result.stats["output_mode"] == "index" and result.stats["media_members_checked"] >= 10


def test_the_training_docs_index_example_runs(both, monkeypatch):
    inp, work, copy, index = both
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", text[text.index("## From an index folder"):], re.S).group(1)
    (index.parent / "packed-index").symlink_to(index)
    monkeypatch.chdir(index.parent)
    exec(compile(example, "training.md", "exec"), {})
    (inp / "part-000.tar").unlink()
    with pytest.raises(SystemExit, match="repack: .*part-000.tar"):
        exec(compile(example, "training.md", "exec"), {})
    assert json.loads((index / INDEX_FILE).read_text())["input_root"] == str(inp.resolve())


def test_index_output_is_a_small_fraction_of_media_heavy_input(tmp_path):
    rng = np.random.default_rng(0)
    members = []
    for i in range(12):  # ~200 KB of incompressible pixels per image: the media dominate the input
        members += [(f"k{i:03d}.json", json.dumps({"messages": [
                        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"What is {i}?"}]},
                        {"role": "assistant", "content": "Noise."}], "images": ["img.png"]})),
                    (f"k{i:03d}.img.png", _noise_png(rng, 260, 260))]
    inp = tmp_path / "in"
    write_tar(inp / "big-000.tar", members)
    work, out = tmp_path / "work", tmp_path / "out"
    plan_all(inp, work, max_len=4096)
    run_write_index(work, inp, out, workers=1)
    ratio = tree_bytes(out) / tree_bytes(inp)
    assert ratio < 0.05, ratio
    assert audit(work, out).ok


def _noise_png(rng, w: int, h: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_changed_sources_are_named_by_the_reader_refused_by_the_writer_and_fail_the_audit(both):
    inp, work, copy, index = both
    packs = list(iter_packs(index))
    # 1. one media byte of part-000 flipped, its size and mtime put back: only the range hashes can see it
    src = inp / "part-000.tar"
    st, data = src.stat(), bytearray(src.read_bytes())
    m = next(m for p in packs for s in p["_meta"]["sources"] if s["shard"] == "part-000" for m in s["media"])
    data[m["offset"] + m["size"] // 2] ^= 0xFF
    src.write_bytes(bytes(data))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert len(list(iter_packs(index))) == len(packs)  # the stamp alone cannot see it
    with pytest.raises(IndexSourceChanged, match="sha256"):
        list(iter_packs(index, verify=True))
    assert "media_hash_mismatch" in {v["check"] for v in audit(work, index).violations}  # the audit re-hashes
    # 2. part-001 rewritten (same size, new mtime): caught by its stamp before any byte is read
    src = inp / "part-001.tar"
    data = bytearray(src.read_bytes())
    data[-20000] ^= 0xFF
    src.write_bytes(bytes(data))
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    with pytest.raises(IndexSourceChanged, match="part-001.tar") as e:
        for _ in iter_packs(index):
            pass
    assert isinstance(e.value, SourceChanged) and e.value.path.endswith("part-001.tar")
    result = audit(work, index)  # a verdict with reasons, not a crash
    assert result.verdict == "FAIL"
    changed = [v for v in result.violations if v["check"] == "source_changed"]
    assert changed and all("part-001.tar" in v["detail"] for v in changed)
    assert audit(work, copy).ok  # the copy does not depend on its sources
    with pytest.raises(SourceChanged, match="part-001"):  # nor is a new index written over a changed source
        run_write_index(work, inp, index, workers=1)
    # 3. moved data: the reader reads from another root when told; a missing source is named
    moved = inp.parent / "moved"
    inp.rename(moved)
    (moved / "part-001.tar").unlink()
    with pytest.raises(IndexSourceChanged, match="part-001.tar.*cannot be opened"):
        list(iter_packs(index, source_root=moved))
    with pytest.raises(ValueError, match="one input root"):  # a recipe's mapping is not this index's root
        list(iter_packs(index, source_root={"in": moved}))


def test_rerun_in_index_mode_after_adding_a_shard(both):
    inp, work, copy, index = both
    write_tar(inp / "part-002.tar", [("n0.json", json.dumps({"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "New?"}]},
        {"role": "assistant", "content": "Yes."}], "images": ["a.jpg"]})), ("n0.a.jpg", image_bytes(70, 50))])
    plan_all(inp, work)
    again = run_write_index(work, inp, index, workers=1)
    assert again.written >= 1
    assert any(s["sample_id"] == "part-002/n0" for p in iter_packs(index) for s in p["samples"])
    result = audit(work, index)
    assert result.ok, result.violations
    assert "part-002.tar" in json.loads((index / INDEX_FILE).read_text())["sources"]
    assert run_write_index(work, inp, index, workers=1).written == 0  # nothing changed: all kept
    quick = run_audit(work, index, recount_fraction=0, scope="changed")  # a clean audit vouches for the index
    assert quick.ok and quick.stats["output_shards_trusted"] == quick.stats["output_shards"] > 0
    (inp / "part-002.tar").touch()  # ... while every source it names is as indexed
    assert run_audit(work, index, recount_fraction=0, scope="changed").stats["output_shards_trusted"] == 0


def test_switching_modes_on_one_folder_replaces_only_the_tools_files(dataset, tmp_path):
    work, out, fresh = tmp_path / "work", tmp_path / "out", tmp_path / "fresh"
    plan_all(dataset, work)
    run_write(work, dataset, fresh, workers=1)
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "extra.tar").write_bytes(b"not ours")
    run_write(work, dataset, out, workers=1)
    s = run_write_index(work, dataset, out, workers=1)
    assert s.written == s.shards and sorted(s.foreign_files) == ["extra.tar", "notes.txt"]
    assert s.as_metadata()["output_mode"] == "index"
    assert (out / INDEX_FILE).is_file() and audit(work, out).ok
    back = run_write(work, dataset, out, workers=1)
    assert back.written == back.shards and not (out / INDEX_FILE).exists()  # the index file was ours: gone
    assert (out / "notes.txt").read_text() == "mine" and (out / "extra.tar").read_bytes() == b"not ours"
    for t in fresh.glob("*.tar"):  # back in copy mode, byte for byte what a fresh copy-mode run writes
        assert (out / t.name).read_bytes() == t.read_bytes()
    result = audit(work, out)
    assert result.ok and result.stats["output_mode"] == "copy"
    theirs = tmp_path / "theirs"  # a pack_index.json the tool did not write is never overwritten
    theirs.mkdir()
    (theirs / INDEX_FILE).write_text("{}")
    with pytest.raises(ForeignFiles, match=INDEX_FILE):
        run_write_index(work, dataset, theirs, workers=1)
    assert (theirs / INDEX_FILE).read_text() == "{}" and not list(theirs.glob("*.tar"))


def test_cli_run_mode_index_end_to_end(tmp_path, monkeypatch, capsys):
    from pack_assets.cli import main

    inp = small_dataset(tmp_path / "in", n_shards=1, per_shard=9)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    out = tmp_path / "out"
    assert main(["run", "--input", str(inp), "--max-len", "1500", "--work", str(tmp_path / "work"), "--output",
                 str(out), "--dagster-home", str(tmp_path / "dh"), "--mode", "index", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["output_mode"] == "index" and s["verdict"] == "PASS" and s["packed"] > 0
    assert (out / INDEX_FILE).is_file()
    packs = list(iter_packs(out))
    assert len(packs) == s["packs"] and any(s_["media"] for p in packs for s_ in p["samples"])


def test_a_pack_naming_more_sources_than_the_open_file_limit_reads_them_all(tmp_path):
    from pack_assets.core.indexmode import SourceFiles

    stamps = {}
    for i in range(5):
        p = tmp_path / f"s{i}.tar"
        p.write_bytes(bytes([i]) * 100)
        stamps[p.name] = {"size": 100, "mtime_ns": p.stat().st_mtime_ns}
    index = {"root": str(tmp_path), "sources": stamps,
             "parts": {f"m{i}": {"source": f"s{i}.tar", "offset": 3, "size": 4, "sha256": None} for i in range(5)}}
    with SourceFiles(limit=2) as sources:
        for _ in range(2):  # every source of the pack stays open while it is read, however low the limit
            parts = sources.resolve({"json": b"{}", "index.json": json.dumps(index).encode()})
            assert [parts[f"m{i}"] for i in range(5)] == [bytes([i]) * 4 for i in range(5)]
        one = {**index, "sources": {"s0.tar": stamps["s0.tar"]}, "parts": {}}
        sources.resolve({"index.json": json.dumps(one)})
        (tmp_path / "s9.tar").write_bytes(b"z")
        sources.resolve({"index.json": json.dumps({**one, "sources": {"s9.tar": {
            "size": 1, "mtime_ns": (tmp_path / "s9.tar").stat().st_mtime_ns}}})})
        assert len(sources.fds) == 2  # back to the limit once a pack needs fewer


@needs(importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.energon") is None,
       "megatron-energon not installed (extra `energon`)")
def test_energon_loads_an_index_folder_and_pack_from_parts_reads_its_media(both):
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        WorkerConfig,
        basic_sample_keys,
        get_loader,
        get_train_dataset,
        stateless,
    )

    from pack_assets.reader import pack_from_parts

    inp, work, copy, index = both

    @stateless
    def cook(raw: dict) -> dict:
        return {**basic_sample_keys(raw), "pack": pack_from_parts(raw)}  # raw: "json" and "index.json"

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]
        decoder = None

        def batch(self, samples):
            return samples

    ds = get_train_dataset(index, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), task_encoder=Encoder(),
                           repeat=False)
    loaded = sorted((b[0]["pack"] for b in get_loader(ds)), key=lambda p: p["pack_id"])
    def plain(p: dict) -> dict:  # energon's batching hands tuples back as lists
        p = same_pack(p)
        return {**p, "samples": [{**s, "media": [tuple(m) for m in s["media"]], "extra": [tuple(m) for m in s["extra"]]}
                                 for s in p["samples"]]}

    assert len(loaded) > 3 and [plain(p) for p in loaded] == [plain(p) for p in iter_packs(copy)]
