"""A helper scans and counts a shard with Python's cyclic collector off (runner/shardwork.py): that is only safe
while the work makes no reference cycle, so nothing waits for the collector until the shard ends."""

import gc

from conftest import small_dataset

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
