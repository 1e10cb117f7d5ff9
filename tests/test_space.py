"""The write's refusal up front (core/write/space.py) looks at the output shards it is to write, never at the
whole catalog: a rerun that adds one shard asks nothing of the others' rows, and still refuses when its own new
shards do not fit."""

from __future__ import annotations

import pytest
from conftest import small_dataset

from pack_assets.core import faults, store
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import space

PROFILE = load_profile("qwen3-vl")
CONFIG = PlanConfig(max_len=1500, max_packs_per_shard=2, incremental=True)
SHARDS = ["part-000", "part-001", "part-002"]


@pytest.fixture(scope="module")
def appended(tmp_path_factory):
    """Two shards planned, then the third added (an append): the work folder and the new output shards."""
    root = tmp_path_factory.mktemp("space")
    inp, work = small_dataset(root / "in", n_shards=3), root / "work"
    for s in SHARDS:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, SHARDS[:2], CONFIG, PROFILE)
    with store.connect(work, read_only=True) as con:
        before = {r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan").fetchall()}
    assert run_plan(work, SHARDS, CONFIG, PROFILE).violations == []
    with store.connect(work, read_only=True) as con:
        names = sorted(r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan").fetchall())
    new = [n for n in names if n not in before]
    assert new and len(new) < len(names)
    return work, new, names, root / "out"


def test_the_bytes_of_the_shards_to_write_are_theirs_alone(appended):
    work, new, names, _ = appended
    with store.connect(work, read_only=True) as con:
        rest = [n for n in names if n not in new]
        # the rows bounded by the new shards' ids lose none of theirs: the parts add up to the whole
        assert space.planned_bytes(con, new) + space.planned_bytes(con, rest) == space.planned_bytes(con, names)
        # the generous bound counts the input shard the new samples came from, not the catalog's every shard
        size = con.execute("SELECT size FROM shards WHERE shard = ?", [SHARDS[2]]).fetchone()[0]
        span = space.Span.of(con, new)
        assert space.roomy_bytes(con, span) == size * 2 + span.members * 8192
        assert space.roomy_bytes(con, span) < space.roomy_bytes(con, space.Span.of(con, names))


def test_room_for_the_new_shards_is_enough_and_too_little_is_refused(appended, monkeypatch):
    work, new, names, out = appended
    out.mkdir(exist_ok=True)
    with store.connect(work, read_only=True) as con:
        roomy, needed = space.roomy_bytes(con, space.Span.of(con, new)), space.planned_bytes(con, new)
        whole = space.planned_bytes(con, names)
    assert needed < roomy and needed < whole
    # room for the new shards' generous bound (below the whole plan's): no bytes query at all
    monkeypatch.setattr(faults, "free_bytes", lambda _: int(roomy) + 1)
    with monkeypatch.context() as m:
        m.setattr(space, "planned_bytes", None)  # called, it would fail
        space.refuse_if_full(work, out, new)
    monkeypatch.setattr(faults, "free_bytes", lambda _: needed)  # exactly what they need: it fits
    space.refuse_if_full(work, out, new)
    monkeypatch.setattr(faults, "free_bytes", lambda _: needed - 1)  # a byte less: refused, before any write
    with pytest.raises(faults.NoSpace, match=f"needs at least {needed:,} bytes"):
        space.refuse_if_full(work, out, new)
    assert not list(out.iterdir())
