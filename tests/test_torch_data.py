"""pack_assets.torch_data: the packs of an output folder shared out to ranks and DataLoader workers, each once;
resumed at (epoch, pack) with exactly the rest; copy, index and a recipe's epoch folders; the order a function
of the seed and epoch; wids for indexed access; the HF datasets wrapper TRL needs."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest
from conftest import needs, small_dataset
from pack_helpers import packed_outputs

from pack_assets.reader import iter_encoded, iter_packs

pytestmark = needs(importlib.util.find_spec("torch") is None, "torch is not installed (extra `train`)")
needs_datasets = needs(importlib.util.find_spec("datasets") is None, "datasets is not installed (extra `train`)")
needs_wids = needs(importlib.util.find_spec("wids") is None, "wids is not installed (extra `train`)")

PROFILE = "qwen2.5-vl"
READERS = [(1, 1, 1), (2, 2, 2), (3, 1, 1), (1, 3, 2), (2, 3, 1)]  # (ranks, workers, batch size)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """17 packs in 9 shards (copy and index mode), and a two-epoch recipe of 24 packs per epoch (index mode)."""
    root = tmp_path_factory.mktemp("torch_data")
    return packed_outputs(small_dataset(root / "in", n_shards=3, per_shard=12), root, PROFILE, max_len=450)


def ids(packs) -> list[str]:
    return [p["pack_id"] for p in packs]


def read(monkeypatch, output, ranks: int, workers: int, **kw) -> dict[tuple[int, int], list[str]]:
    """Each (rank, worker)'s pack ids, the reader told who it is the way webdataset reads it (RANK / WORLD_SIZE,
    WORKER / NUM_WORKERS)."""
    from pack_assets.torch_data import PackDataset

    got = {}
    for r, w in itertools.product(range(ranks), range(workers)):
        for k, v in (("RANK", r), ("WORLD_SIZE", ranks), ("WORKER", w), ("NUM_WORKERS", workers)):
            monkeypatch.setenv(k, str(v))
        got[r, w] = ids(PackDataset(output, encode=False, **kw))
    return got


def steps(per_rank: list[list[list[str]]]) -> list[str]:
    """The packs in the order training consumes them: step n takes each rank's n-th batch, rank 0 first."""
    return [p for n in range(max(map(len, per_rank))) for batches in per_rank if n < len(batches) for p in batches[n]]


@pytest.mark.parametrize("split", ["pack", "shard"])
def test_every_pack_goes_to_exactly_one_rank_and_worker(out, monkeypatch, split):
    full = ids(iter_packs(out["copy"]))
    assert len(full) == 17 and len(list(out["copy"].glob("*.tar"))) == 9
    for ranks, workers, batch in READERS:
        got = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split=split)
        shares = [p for v in got.values() for p in v]
        assert sorted(shares) == sorted(full), (ranks, workers, batch)
        if split == "pack":  # dealt a batch at a time: no reader is more than one batch ahead
            assert max(map(len, got.values())) - min(map(len, got.values())) <= batch


def test_resampled_readers_draw_their_share_of_an_epoch_deterministically(out, monkeypatch):
    full = set(ids(iter_packs(out["copy"])))
    for ranks, workers, batch in READERS:
        got = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="resample", seed=5)
        assert sum(map(len, got.values())) == 17 and set().union(*got.values()) <= full
        assert got == read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="resample", seed=5)
    assert got != read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="resample", seed=6)


def test_dataloader_batches_reach_training_in_the_plans_order_and_resume_exactly(out, monkeypatch):
    """Real DataLoader workers (2 per rank, 2 ranks by RANK/WORLD_SIZE): step after step the packs are the
    plan's order; resumed at a step boundary they go on with the next pack, anywhere else they are the rest."""
    from torch.utils.data import DataLoader

    from pack_assets.torch_data import PackDataset

    full = ids(iter_packs(out["copy"]))

    def train(start: int) -> list[list[list[str]]]:
        per_rank = []
        for r in range(2):
            monkeypatch.setenv("RANK", str(r))
            monkeypatch.setenv("WORLD_SIZE", "2")
            ds = PackDataset(out["copy"], encode=False, batch_size=2, start=start)
            per_rank.append(list(DataLoader(ds, batch_size=2, num_workers=2, collate_fn=ids)))
        return per_rank

    assert steps(train(0)) == full
    assert steps(train(8)) == full[8:]  # 2 steps of 2 ranks x 2 packs
    assert sorted(steps(train(5))) == sorted(full[5:])


def test_locate_names_where_the_step_after_so_many_begins(out, monkeypatch):
    """Two ranks of batch 2 from pack 6 of 17: 3 steps (the last one short), then 5 per pass; after any
    number of steps, locate names the pack the next step begins with."""
    from pack_assets.torch_data import PackDataset

    begins = []
    for epoch, start in ((0, 6), (1, 0), (2, 0)):
        got = read(monkeypatch, out["copy"], 2, 1, batch_size=2, epoch=epoch, start=start)
        per_rank = [[v[i:i + 2] for i in range(0, len(v), 2)] for v in got.values()]
        begins += [(epoch, int(per_rank[0][n][0][1:])) for n in range(len(per_rank[0]))]
    assert [e for e, _ in begins] == [0] * 3 + [1] * 5 + [2] * 5
    ds = PackDataset(out["copy"], encode=False, batch_size=2, start=6)
    assert [ds.locate(n, world=2) for n in range(len(begins))] == begins
    with pytest.raises(ValueError):
        ds.locate(-1)


def test_a_resumed_pack_split_yields_exactly_the_packs_after_the_position(out, monkeypatch):
    full = ids(iter_packs(out["index"]))
    for ranks, workers, batch in READERS[1:3]:
        for start in range(len(full) + 1):
            got = read(monkeypatch, out["index"], ranks, workers, batch_size=batch, start=start)
            assert sorted(p for v in got.values() for p in v) == sorted(full[start:]), (ranks, workers, batch, start)


def test_shard_and_resampled_splits_resume_at_a_multiple_of_a_round_of_batches(out, monkeypatch):
    full = ids(iter_packs(out["copy"]))
    ranks, workers, batch = 2, 2, 2
    got = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="shard")
    # one round: each rank's batch from worker 0, then from worker 1 (the DataLoader's turn); 8 packs
    consumed = [p for w in range(workers) for r in range(ranks) for p in got[r, w][:batch]]
    rest = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="shard", start=8)
    assert sorted(consumed + [p for v in rest.values() for p in v]) == sorted(full)
    stream = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="resample")
    tail = read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="resample", start=8)
    assert tail == {k: v[batch:] for k, v in stream.items()}
    with pytest.raises(ValueError, match="resumes at a multiple of 8 packs"):
        read(monkeypatch, out["copy"], ranks, workers, batch_size=batch, split="shard", start=6)


def test_a_shard_order_is_a_function_of_seed_and_epoch_alone(out, monkeypatch):
    from pack_assets.torch_data import PackDataset

    def order(seed, epoch=0):
        return ids(PackDataset(out["copy"], encode=False, shuffle=True, seed=seed, epoch=epoch))

    first = order(7)
    assert first == order(7) and sorted(first) == sorted(ids(iter_packs(out["copy"])))
    assert first != ids(iter_packs(out["copy"])) and order(8) != first and order(7, epoch=1) != first
    # the same order on every rank: two ranks' shares, dealt batch by batch, are that order
    got = read(monkeypatch, out["copy"], 2, 1, batch_size=2, shuffle=True, seed=7)
    assert steps([[v[i:i + 2] for i in range(0, len(v), 2)] for v in got.values()]) == first


@needs_wids
def test_index_mode_and_a_recipes_epoch_folders_encode_as_the_reader_does(out):
    from pack_assets.torch_data import PackDataset, PackIndex

    epochs = [list(iter_encoded(out["blend"] / f"epoch-{k:03d}", PROFILE)) for k in range(2)]
    assert [len(e) for e in epochs] == [24, 24] and ids(epochs[0]) == ids(epochs[1])  # p00000000 up, per epoch

    def same(a: list[dict], b: list[dict]) -> bool:
        return len(a) == len(b) and all(x["pack_id"] == y["pack_id"] and np.array_equal(x["input_ids"], y["input_ids"])
                                        and x["sample_ids"] == y["sample_ids"] for x, y in zip(a, b))

    ds = PackDataset(out["blend"], epoch=1, start=5)  # the profile: the one the output was packed for
    assert ds.position() == (1, 5) and same(list(ds), epochs[1][5:])
    ds.set_epoch(1)  # the trainer's next pass: epoch 2, a recipe of two epochs' folder 0, from its first pack
    assert ds.position() == (2, 0) and same(list(ds), epochs[0])
    assert epochs[0][0]["sample_ids"] != epochs[1][0]["sample_ids"]
    index = PackIndex(out["blend"], epoch=1)
    assert len(index) == 24 and same([index[i] for i in range(24)], epochs[1])
    copy_mode = list(PackDataset(out["copy"]))
    assert same(copy_mode, list(PackDataset(out["index"])))
    assert same(copy_mode, list(iter_encoded(out["copy"], PROFILE)))


def test_pack_split_reads_the_other_ranks_packs_headers_not_their_payloads(out, monkeypatch):
    from pack_assets import torch_data

    read_bytes = []
    real = torch_data.os.pread
    monkeypatch.setattr(torch_data.os, "pread", lambda fd, n, at: read_bytes.append(n) or real(fd, n, at))
    read(monkeypatch, out["copy"], 4, 1)
    ours = sum(read_bytes)
    read_bytes.clear()
    read(monkeypatch, out["copy"], 1, 1)
    alone = sum(read_bytes)
    assert alone < ours < 1.3 * alone  # four ranks together: every payload once, some 512-byte headers more


@needs_datasets
def test_hf_dataset_walks_the_epochs_in_one_worker(out, monkeypatch):
    from pack_assets.torch_data import PackDataset, hf_dataset

    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "2")  # an HF generator is one shard: read whole by whichever worker runs it
    rows = list(hf_dataset(PackDataset(out["blend"], start=20), epochs=2))
    assert [r["pack_id"] for r in rows] == [f"p{i:08d}" for i in range(20, 24)] + [f"p{i:08d}" for i in range(24)]
    assert (
        isinstance(rows[0]["input_ids"], np.ndarray)
        and rows[0]["sample_ids"]
        == next(itertools.islice(iter_encoded(out["blend"] / "epoch-000", PROFILE), 20, None))["sample_ids"]
    )


def test_the_docs_dataset_example_runs(out, tmp_path, monkeypatch):
    from test_training_docs import _example

    (tmp_path / "packed").symlink_to(out["blend"])
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(_example("Ranks, workers and resuming"), "training.md", "exec"), ns)
    assert ns["taken"] == [(1, f"p{i:08d}") for i in range(8, 24)] + [(2, f"p{i:08d}") for i in range(24)]
    assert (ns["epoch"], ns["start"]) == (2, 6)


def test_model_inputs_keeps_the_keys_forward_takes_by_name():
    from pack_assets.torch_data import ModelInputs

    class Model:
        def forward(self, input_ids, labels=None, *, position_ids=None, **kwargs):
            pass

    batch = {"input_ids": 1, "labels": 2, "position_ids": 3, "cu_seqlens": 4, "loss_weights": 5, "kwargs": 6}
    assert ModelInputs(lambda packs: batch, Model())([]) == {"input_ids": 1, "labels": 2, "position_ids": 3}


def test_what_is_not_an_output_or_a_split_is_refused(out, tmp_path):
    from pack_assets.torch_data import PackDataset

    with pytest.raises(FileNotFoundError, match="no packed output here"):
        PackDataset(tmp_path)
    with pytest.raises(ValueError, match="split is one of pack, shard, resample"):
        PackDataset(out["copy"], split="node")
    (tmp_path / "wids-index.json").write_text("[]")
    with pytest.raises(ValueError, match="not a shard list this tool wrote"):
        PackDataset(tmp_path, encode=False).num_packs()
