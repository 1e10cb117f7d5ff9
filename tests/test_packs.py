"""The plan's packs as index arrays (core/packs.py) give what Pack objects gave: the same pack_plan.jsonl lines,
the same catalog rows, the same prune of a previous plan, and the same plan read back from the catalog."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from pack_assets.core import plan as plan_mod
from pack_assets.core import store
from pack_assets.core.packs import PackTable, from_batches
from pack_assets.core.settings import PlanConfig


def _plan(n: int = 600, seed: int = 5) -> plan_mod.PlanResult:
    rng = np.random.default_rng(seed)
    ids = [f"sh{i % 7}/é{i:05d}" for i in range(n)]  # a non-ASCII id: UTF-8 offsets, not character counts
    mts = [("text", "image")[i % 2] for i in range(n)]
    lengths = rng.integers(1, 5000, n)
    lengths[3] = 9000  # overlong: dropped
    cfg = PlanConfig(max_len=4096, max_packs_per_shard=7)
    return plan_mod.make_plan(ids, mts, lengths, rng.integers(0, 10**6, n), cfg)


def _old_line(p) -> str:
    """A pack_plan.jsonl line as it was made from a Pack object."""
    return json.dumps({"pack_id": p.pack_id, "media_type": p.media_type, "sample_ids": p.sample_ids,
                       "sample_token_lens": p.sample_token_lens, "total_token_len": p.total_token_len}) + "\n"


def test_the_table_writes_the_lines_and_catalog_rows_pack_objects_wrote(tmp_path):
    plan = _plan()
    assert isinstance(plan.packs, PackTable) and len(plan.packs) > 20 and plan.dropped
    objects = list(plan.packs)
    assert plan_mod.plan_jsonl(plan) == "".join(_old_line(p) for p in objects)
    assert plan_mod.plan_jsonl(plan, 5, 9) == "".join(_old_line(p) for p in objects[5:9])
    assert len({p.output_shard for p in objects}) == plan.stats["output_shards"] > 3
    rows = []
    for batches in (plan.packs.batches(step=4), [vars(p) for p in objects]):
        with store.connect(tmp_path) as con:
            con.execute("CREATE OR REPLACE TABLE manifest_samples (sample_id VARCHAR, shard VARCHAR, key VARCHAR, "
                        "json_member VARCHAR, media_members VARCHAR[])")
            store.save_plan(con, batches, plan.dropped, {"fingerprint": plan.fingerprint}, multiple=4)
            rows.append([con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                         for t in ("pack_plan", "pack_members", "dropped")]
                        + [con.execute("DESCRIBE pack_plan").fetchall()])
            dropped, reader = plan_mod.read_plan(con)
            back = from_batches(reader)
    assert rows[0] == rows[1]
    assert dropped == sorted(plan.dropped, key=lambda d: d["sample_id"])
    assert "".join(_old_line(p) for p in back) == plan_mod.plan_jsonl(plan)
    assert [p.output_shard for p in back] == [p.output_shard for p in objects]


def test_catalog_batches_are_bounded_in_members_and_hold_the_same_rows():
    """A batch's ids pass through Python objects: at most ``members`` of them a batch (a pack bigger than that
    alone), and the rows do not depend on where the batches break."""
    packs = _plan().packs
    whole = pa.Table.from_batches(list(packs.batches(step=len(packs), members=10**9)))
    for members in (1, 30, 100):
        got = list(packs.batches(members=members))
        firsts = np.cumsum([0] + [b.num_rows for b in got])[:-1]
        sizes = [int(packs.offsets[a + b.num_rows] - packs.offsets[a]) for a, b in zip(firsts, got)]
        assert all(s <= members or b.num_rows == 1 for s, b in zip(sizes, got)), (members, sizes)
        assert len(got) > 1 and pa.Table.from_batches(got).equals(whole)


def test_a_prune_keeps_ids_and_shards_and_counts_what_it_removed():
    plan = _plan()
    packs = list(plan.packs)
    current = {s: n for p in packs for s, n in zip(p.sample_ids, p.sample_token_lens)}
    lone = packs[2].sample_ids  # every member gone: the pack is removed
    for s in lone:
        del current[s]
    j = next(k for k, p in enumerate(packs) if k > 2 and len(p.sample_ids) > 1)
    current[packs[j].sample_ids[0]] += 1  # recounted: leaves its pack
    for d in plan.dropped:
        current[d["sample_id"]] = d["total_tokens"]
    kept, dropped, figures = plan_mod.prune_plan(plan.packs, plan.dropped, current,
                                                 changed={packs[2].pack_id, packs[j].pack_id})
    assert figures == {"samples_gone": len(lone), "samples_recounted": 1, "packs_changed": 2, "packs_emptied": 1}
    assert dropped == plan.dropped
    after = {p.pack_id: p for p in kept}
    assert packs[2].pack_id not in after and len(after) == len(packs) - 1
    assert after[packs[j].pack_id].sample_ids == packs[j].sample_ids[1:]
    assert after[packs[j].pack_id].total_token_len == sum(packs[j].sample_token_lens[1:])
    assert all(after[p.pack_id] == p for p in packs if p.pack_id not in (packs[2].pack_id, packs[j].pack_id))
