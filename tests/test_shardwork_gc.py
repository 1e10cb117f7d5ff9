"""A helper scans and counts a shard with Python's cyclic collector off (runner/shardwork.py): that is only safe
while the work makes no reference cycle, so nothing waits for the collector until the shard ends."""

import gc

from conftest import small_dataset

from pack_assets.core.records import Sample
from pack_assets.core.settings import Settings
from pack_assets.runner.shardwork import work_shard


def test_a_shards_work_leaves_nothing_for_the_cycle_collector(tmp_path):
    inp = small_dataset(tmp_path / "in", n_shards=1, per_shard=9)  # text, one and two images, a bad record
    flat = Settings.from_flat({"input_dir": str(inp), "work_dir": str(tmp_path / "work"),
                               "output_dir": str(tmp_path / "out")}).flat()
    assert work_shard(flat, "part-000", force=True) == 10  # first: loads the tokenizer and the template
    gc.collect()
    was = gc.get_threshold()
    gc.set_threshold(0)  # nothing collects during the call: all it leaves unreachable is counted below
    try:
        assert work_shard(flat, "part-000", force=True) == 10
        assert gc.collect() == 0
    finally:
        gc.set_threshold(*was)
    assert gc.isenabled()  # the collector is back on after the shard


def test_the_collectors_first_pass_after_a_shard_finds_no_sample_of_it(tmp_path):
    """The scan keeps the shard's samples for the count; they are freed before the collector comes back on, or its
    first pass walks them all (each one still in the youngest generation)."""
    inp = small_dataset(tmp_path / "in", n_shards=1, per_shard=9)
    flat = Settings.from_flat({"input_dir": str(inp), "work_dir": str(tmp_path / "work"),
                               "output_dir": str(tmp_path / "out")}).flat()
    work_shard(flat, "part-000", force=True)
    seen: list[int] = []

    def on_pass(phase, info):
        if phase == "start":
            seen.append(sum(isinstance(o, Sample) for o in gc.get_objects(info["generation"])))

    was = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a pass at the first allocation once the collector is back on
    gc.callbacks.append(on_pass)
    try:
        assert work_shard(flat, "part-000", force=True) == 10
    finally:
        gc.callbacks.remove(on_pass)
        gc.set_threshold(*was)
    assert seen and max(seen) == 0
