"""The copy writer prepares an output shard a batch of packs at a time (core/write/batches.py), so its memory
follows the batch, not the output shard: each batch holds whole packs and at most BATCH_SAMPLES samples (a
larger pack alone), and the output folder is the same bytes wherever the batches break, the shard fingerprint
every pack's `_meta` carries and the Energon index included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from conftest import small_dataset

from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import ScanOptions, run_manifest
from pack_assets.core.write import batches, run_write

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
