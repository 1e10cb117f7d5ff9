"""The copy writer prepares an output shard a batch of packs at a time (core/write/batches.py), so its memory
follows the batch, not the output shard: each batch holds whole packs and at most BATCH_SAMPLES samples (a
larger pack alone), and the output folder is the same bytes wherever the batches break, the shard fingerprint
every pack's `_meta` carries and the Energon index included."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from conftest import small_dataset

from pack_assets.core import store
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, PlanInfo, run_plan
from pack_assets.core.scan import ScanOptions, run_manifest
from pack_assets.core.write import batches, bulk, run_write
from pack_assets.core.write.shard import write_shard
from pack_assets.core.write.shared import planned_shards, write_context

PROFILE = load_profile("qwen3-vl")


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_pack_cuts_hold_whole_packs_of_at_most_a_batch():
    firsts = batches.pack_firsts(pa.array(["a", "a", "b", "c", "c", "c", "c", "d", "e"]))
    assert firsts.tolist() == [0, 2, 3, 7, 8, 9]
    assert batches.pack_cuts(firsts, 3) == [0, 3, 7, 9]  # c (4 samples) alone
    assert batches.pack_cuts(firsts, 1) == [0, 2, 3, 7, 8, 9]
    assert batches.pack_cuts(firsts, 100) == [0, 9]
    assert batches.pack_cuts(batches.pack_firsts(pa.array([], pa.string())), 3) == [0]


def test_a_shard_written_in_batches_is_the_same_bytes_wherever_they_break(tmp_path, monkeypatch):
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=12)
    work = tmp_path / "work"
    for s in ("part-000", "part-001"):
        run_manifest(inp, work, s, ScanOptions(hash_members=s == "part-000"))  # unhashed members in one
        run_token_lengths(work, s, PROFILE)
    run_plan(work, ["part-000", "part-001"], PlanConfig(max_len=1000, max_packs_per_shard=4), PROFILE)
    seen: list[list[int]] = []  # per batch: its samples per pack
    real = batches.build_packs

    def spy(cols, context):
        seen.append(np.diff([i for i, p in enumerate(cols.pack_id) if i == 0 or p != cols.pack_id[i - 1]]
                            + [len(cols.pack_id)]).tolist())
        return real(cols, context)

    monkeypatch.setattr(batches, "build_packs", spy)
    streamed: list[str] = []  # the output shards written batch by batch (one of at most a batch: whole)

    class Streamed(batches.StreamShard):
        def __init__(self, name, *a, **k):
            streamed.append(name)
            super().__init__(name, *a, **k)

    monkeypatch.setattr(batches, "StreamShard", Streamed)
    outputs = {}
    for batch in (10**6, 1, 9):  # the whole shard at once (`bulk.build_shard`), each pack alone, a few samples
        monkeypatch.setattr(batches, "BATCH_SAMPLES", batch)
        seen.clear()
        streamed.clear()
        run_write(work, inp, tmp_path / f"b{batch}" / "out", workers=1)  # (the folder name is in wids-index)
        outputs[batch] = _files(tmp_path / f"b{batch}" / "out")
        assert all(sum(b) <= batch or len(b) == 1 for b in seen), seen
        if batch == 10**6:
            assert not streamed and not seen
        if batch == 9:  # shards broken up, and batches of several packs
            assert len(seen) > len(streamed) >= 1 and any(len(b) > 1 for b in seen)
    assert any(n.endswith(".tar") for n in outputs[1])
    assert outputs[1] == outputs[10**6] == outputs[9]


def test_gather_picks_rows_chunk_by_chunk_as_a_take_would():
    table = pa.Table.from_batches([
        pa.record_batch({"a": list(range(k, k + n)), "b": [f"t{i}" for i in range(k, k + n)]})
        for k, n in ((0, 3), (3, 1), (4, 5), (9, 2))])
    at = np.random.default_rng(3).permutation(11)[:7]
    got = batches.Gather(table).rows(at, [1, 0])
    assert [c.to_pylist() for c in got] == [[f"t{i}" for i in at], at.tolist()]
    assert [c.to_pylist() for c in batches.Gather(table).rows(np.array([10]), [0])] == [[10]]


def planned(tmp_path: Path, **config) -> tuple[Path, Path]:
    """24 samples in two source shards, planned at max_len 1,000 (one output shard unless ``config`` says more)."""
    inp = small_dataset(tmp_path / "in", n_shards=2, per_shard=12)
    work = tmp_path / "work"
    for s in ("part-000", "part-001"):
        run_manifest(inp, work, s, ScanOptions())
        run_token_lengths(work, s, PROFILE)
    run_plan(work, ["part-000", "part-001"], PlanConfig(max_len=1000, **config), PROFILE)
    return inp, work


def _docs(path: Path) -> list[dict]:
    """Each pack's JSON document in the tar, read with tarfile (not the writer's code)."""
    with tarfile.open(path) as tar:
        return [json.loads(tar.extractfile(m).read()) for m in tar.getmembers()
                if m.name.endswith(".json") and m.name.count(".") == 1]


def test_a_shard_from_its_conversations_in_many_chunks_and_any_order_is_the_bytes_of_it_built_whole(tmp_path):
    """The writer reads a shard's conversations in the staged file's order and chunks (no sort, no copy into one
    chunk: `bulk.group_table`, `batches.Gather`); in slices of a few samples (``batch``, a parameter), the shard is
    the same bytes as built whole, and each sample's messages are its own conversation."""
    inp, work = planned(tmp_path)
    with store.connect(work, read_only=True) as con:
        context = write_context(PlanInfo.load(con))
        [name] = planned_shards(con)
        (_, samples, members, conversations), = bulk.group_tables(con, [name])
        truth = dict(con.execute("SELECT sample_id, conversation FROM manifest_samples").fetchall())
    assert samples.num_rows > 9
    order = np.random.default_rng(5).permutation(conversations.num_rows)
    shuffled = conversations.take(pa.array(order))
    shuffled = pa.Table.from_batches(shuffled.to_batches(max_chunksize=2))  # a chunk per two rows
    assert shuffled.column(0).num_chunks > 4
    built = {}
    for label, job in (("whole", bulk.build_shard(name, bulk.table_columns(inp, name, samples, members,
                                                                             conversations), context)),
                       ("sliced", batches.StreamShard(name, inp, samples, members, shuffled, context, batch=3))):
        out = tmp_path / label
        out.mkdir()
        write_shard(str(out), job, context)
        built[label] = (out / name).read_bytes()
        assert built[label] and job.fingerprint
    assert built["sliced"] == built["whole"]
    docs = _docs(tmp_path / "sliced" / name)
    assert sum(len(d["samples"]) for d in docs) == samples.num_rows
    for d in docs:
        assert [s["sample_id"] for s in d["samples"]] == d["_meta"]["sample_ids"]
        for s in d["samples"]:
            assert s["messages"] == json.loads(truth[s["sample_id"]])


def test_a_stream_shard_does_not_copy_its_conversations_into_one_chunk(tmp_path):
    """What the cut guards: a shard's conversations are held once, as read (chunked), not a second time as one
    chunk in Arrow's pool beside them (~150 MiB at 10M's 313k-sample shards, docs/benchmarks.md)."""
    inp, work = planned(tmp_path)
    with store.connect(work, read_only=True) as con:
        context = write_context(PlanInfo.load(con))
        [name] = planned_shards(con)
        (_, samples, members, conversations), = bulk.group_tables(con, [name])
    text = pa.array(["x" * 200_000] * conversations.num_rows)  # conversations large beside everything else
    chunked = pa.Table.from_batches(conversations.set_column(2, conversations.schema.field(2), text)
                                    .to_batches(max_chunksize=4))
    before = pa.total_allocated_bytes()
    shard = batches.StreamShard(name, inp, samples, members, chunked, context, batch=3)
    held = pa.total_allocated_bytes() - before
    assert shard.n_packs and held < chunked.nbytes / 4, (held, chunked.nbytes)
