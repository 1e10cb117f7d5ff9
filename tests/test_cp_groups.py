"""Context parallelism (THD padding, issue 39 item 1) and media groups across ranks (item 5).

The oracles are the trainers' own rules, transliterated from their source: Megatron-LM's ``get_padding``
(megatron/core/models/multimodal/context_parallel.py) for the multiple, and Transformer Engine's
``thd_partition_indices_kernel`` (transformer_engine/common/fused_attn/context_parallel.cu, what
``thd_get_partitioned_indices`` launches and Megatron's ``get_batch_on_this_cp_rank`` calls) for which tokens
each CP rank takes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_tar
from pack_helpers import tiny_media_samples

from pack_assets.core import store
from pack_assets.core.blend import make_blend_plan
from pack_assets.core.cpad import check_padded, cu_seqlens, padded, sample_multiple
from pack_assets.core.groups import check_groups, pack_key
from pack_assets.core.plan import PlanConfig, config_fingerprint, make_plan
from pack_assets.core.settings import Settings


def megatron_padding_factor(cp: int, tp: int, has_sp: bool) -> int:
    """get_padding's factor: 1 when neither SP nor CP."""
    if has_sp and cp > 1:
        return tp * cp * 2
    if cp > 1:
        return cp * 2
    if has_sp:
        return tp
    return 1


def te_partitioned_indices(cu_padded: list[int], total_tokens: int, world_size: int, rank: int) -> list[int]:
    """thd_partition_indices_kernel, token by token (with thd_get_partitioned_indices' checks)."""
    assert total_tokens > 0 and total_tokens % (world_size * 2) == 0
    for seqlen in cu_padded:
        assert seqlen % (world_size * 2) == 0
    cu_s = [s // world_size for s in cu_padded]
    out = []
    for token_id in range(total_tokens // world_size):
        seq_id = int(np.searchsorted(cu_s, token_id, side="right")) - 1  # binary_search
        seq_len = cu_s[seq_id + 1] - cu_s[seq_id]
        index = token_id - cu_s[seq_id]
        offset = rank if index < seq_len // 2 else (world_size - 1) * 2 - rank
        out.append(index + cu_s[seq_id] * world_size + seq_len // 2 * offset)
    return out


def test_the_multiple_is_megatrons_padding_factor_and_a_bad_combination_is_refused():
    for cp in (1, 2, 3, 4):
        for tp, sp in ((1, False), (1, True), (2, True), (4, True)):
            assert sample_multiple(cp, tp, sp) == megatron_padding_factor(cp, tp, sp)
    assert sample_multiple(2, explicit=16) == 16  # FP8's lcm(16, 2cp)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        sample_multiple(2, explicit=6)
    with pytest.raises(ValueError, match="sequence parallelism"):
        sample_multiple(2, 2, False)
    assert PlanConfig(max_len=8190, cp_size=2).capacity == 8188  # a sum of padded sub-samples is a multiple of 4
    assert te_partitioned_indices([0, 8], 8, 2, 0) == [0, 1, 6, 7]  # TE PR #2129's example (1-based there)


def _encoded(lens: list[int], m: int, first: int = 1000) -> dict:
    n = sum(lens)
    return {"input_ids": np.arange(first, first + n), "labels": np.arange(first, first + n),
            "loss_weights": np.ones(n, np.float32), "mm_token_type_ids": np.zeros(n, np.int64),
            "cu_seqlens": cu_seqlens(lens), "cu_seqlens_padded": cu_seqlens(lens, m),
            "position_ids": np.concatenate([np.arange(k) for k in lens]), "visual_order": [[] for _ in lens],
            "images": [[] for _ in lens], "videos": [[] for _ in lens]}


@pytest.mark.parametrize("cp, tp, sp", [(2, 1, False), (4, 1, False), (2, 2, True)])
def test_the_collated_thd_layout_splits_into_balanced_cp_shares_by_te_rule(cp, tp, sp):
    from pack_assets.reader import PackCollator

    m = sample_multiple(cp, tp, sp)
    rng = np.random.default_rng(cp * 10 + tp)
    lens = rng.integers(1, 60, size=7).tolist()
    batch = PackCollator(pad_id=0, flatten=True)([_encoded(lens, m)])
    cu_p = batch["cu_seqlens_padded"].tolist()
    assert cu_p == cu_seqlens(lens, m).tolist() and batch["cu_seqlens"].tolist() == cu_seqlens(lens).tolist()
    ids, real = batch["input_ids"][0].numpy(), batch["padding_mask"][0].numpy()
    total = len(ids)
    assert total == cu_p[-1] == padded(lens, m).sum()
    # each sub-sample at its padded offset, its real tokens first and in order; the padding trains nothing
    for i, n in enumerate(lens):
        assert ids[cu_p[i]:cu_p[i] + n].tolist() == list(range(1000 + sum(lens[:i]), 1000 + sum(lens[:i]) + n))
        assert real[cu_p[i]:cu_p[i] + n].all() and not real[cu_p[i] + n:cu_p[i + 1]].any()
        assert batch["position_ids"][0, cu_p[i]:cu_p[i + 1]].tolist() == list(range(cu_p[i + 1] - cu_p[i]))
    assert (batch["labels"][0].numpy()[~real] == -100).all() and (batch["loss_weights"][0].numpy()[~real] == 0).all()
    shares = [te_partitioned_indices(cu_p, total, cp, r) for r in range(cp)]
    assert sorted(i for s in shares for i in s) == list(range(total))  # every token on exactly one rank
    for s in shares:
        s = np.asarray(s)
        for i in range(len(lens)):
            mine = s[(s >= cu_p[i]) & (s < cu_p[i + 1])] - cu_p[i]
            assert len(mine) == (cu_p[i + 1] - cu_p[i]) // cp  # the same share of every sub-sample
            # and the same causal attention work: Σ (position + 1) over the rank's queries of the sub-sample
            assert (mine + 1).sum() == (cu_p[i + 1] - cu_p[i] + 1) * (cu_p[i + 1] - cu_p[i]) // 2 // cp


def test_padded_rows_keep_every_segment_divisible_and_unpadded_packs_keep_their_layout():
    from pack_assets.reader import PackCollator

    batch = PackCollator(pad_id=0)([_encoded([5, 11, 3], 4), _encoded([2], 4)])
    assert batch["cu_seqlens_padded"].tolist() == [0, 8, 20, 24, 28, 48]  # row 2: its 4, then 20 of row padding
    assert batch["cu_seqlens"].tolist() == [0, 5, 16, 19, 21, 21]  # the row padding: real length 0
    assert all(d % 4 == 0 for d in np.diff(batch["cu_seqlens_padded"].tolist()))
    plain = PackCollator(pad_id=0)([_encoded([5, 11, 3], 1)])
    assert plain["cu_seqlens_padded"].tolist() == plain["cu_seqlens"].tolist() == [0, 5, 16, 19]


def _lengths(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.0, 1.0, n).astype(np.int64), 3, 9000)
    kinds = rng.choice(["text", "image", "video"], n, p=[0.5, 0.4, 0.1])
    return [f"s{i:06d}" for i in range(n)], kinds, lengths


def test_a_cp_plan_fits_max_len_padded_where_a_plain_plan_overflows():
    ids, kinds, lengths = _lengths(4000)
    plain = make_plan(ids, kinds, lengths, np.zeros(len(ids)), PlanConfig(max_len=8190))
    assert max(padded(p.sample_token_lens, 4).sum() for p in plain.packs) > 8190  # what a CP trainer would get
    cfg = PlanConfig(max_len=8190, cp_size=2)
    plan = make_plan(ids, kinds, lengths, np.zeros(len(ids)), cfg)
    assert max(padded(p.sample_token_lens, 4).sum() for p in plan.packs) <= 8190
    assert plan.stats["sample_multiple"] == 4 and plan.stats["fill_padded"] > plan.stats["fill"]
    assert plan.packs[0].sample_token_lens == lengths[[ids.index(s) for s in plan.packs[0].sample_ids]].tolist()
    assert plan.stats["packs"] - plan.stats["lower_bound"] <= 2  # the bound on padded lengths (bench: ≤ 0.1 %)
    over = [d for d in plan.dropped if d["total_tokens"] > 8188]
    assert over and all(d["reason"] == "overlong" for d in over)  # dropped with the real length
    assert config_fingerprint(cfg, "p") != config_fingerprint(PlanConfig(max_len=8190), "p")


def _catalog(con) -> None:
    """What the lineage view reads (the catalog's, in a real work folder)."""
    con.execute("CREATE TABLE manifest_samples (sample_id VARCHAR, shard VARCHAR, key VARCHAR, "
                "json_member VARCHAR, media_members VARCHAR[])")


def test_the_catalog_records_padded_lengths_and_the_check_refuses_a_pack_over_max_len_padded(tmp_path):
    pack = {"pack_id": "p0", "media_type": "text", "sample_ids": ["a", "b"], "sample_token_lens": [5, 6],
            "total_token_len": 11, "output_shard": "packed-000000.tar", "overlong": False}
    with store.connect(tmp_path) as con:
        _catalog(con)
        store.save_plan(con, [pack], [], {"fingerprint": "x"}, multiple=4)
        assert con.execute("SELECT padded_len FROM pack_members ORDER BY position").fetchall() == [(8,), (8,)]
        assert check_padded(con, PlanConfig(max_len=12, cp_size=2))[0][1] == 1  # 11 real tokens fit, 16 do not
        assert check_padded(con, PlanConfig(max_len=16, cp_size=2))[0][1] == 0


def test_cp_settings_reach_the_cli_config_and_resource(tmp_path):
    from pack_assets.cli import _settings, build_parser
    from pack_assets.defs.resources import PackSettings

    args = build_parser().parse_args(["run", "--input", str(tmp_path), "--max-len", "4096", "--cp-size", "2",
                                      "--tp-size", "2", "--sequence-parallel"])
    s = _settings(args)
    assert (s.plan.cp_size, s.plan.tp_size, s.plan.sequence_parallel, s.plan.multiple) == (2, 2, True, 8)
    assert PackSettings.of(s).to_settings() == s
    assert Settings.from_flat({"sample_multiple": 16, "cp_size": 2, "world_size": 2,
                               "micro_batch_size": 3}).plan.group_size == 6
    with pytest.raises(ValueError, match="sequence parallelism"):
        _settings(build_parser().parse_args(["run", "--input", str(tmp_path), "--max-len", "64", "--tp-size", "2"]))
    (tmp_path / "a").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("datasets: [{name: a, input: a}]\ncp_size: 4\nworld_size: 2\nmicro_batch_size: 2\n")
    from_recipe = _settings(build_parser().parse_args(["run", "--recipe", str(recipe)]))
    assert (from_recipe.plan.multiple, from_recipe.plan.group_size) == (8, 4)
    over = _settings(build_parser().parse_args(["run", "--recipe", str(recipe), "--cp-size", "2"]))
    assert over.plan.multiple == 4  # a flag given wins over the recipe


def _blocks_share_a_key(packs, g: int, kind_of: dict) -> bool:
    keys = [pack_key(kind_of[s] for s in p.sample_ids) for p in packs]
    return len(keys) % g == 0 and all(len(set(keys[a:a + g])) == 1 for a in range(0, len(keys), g))


@pytest.mark.parametrize("per_type", [True, False])
def test_every_group_of_world_size_x_batch_packs_shares_one_media_key(per_type):
    ids, kinds, lengths = _lengths(3000, seed=1)
    cfg = PlanConfig(max_len=8192, world_size=2, micro_batch_size=2, pack_per_media_type=per_type)
    plan = make_plan(ids, kinds, lengths, np.zeros(len(ids)), cfg)
    assert _blocks_share_a_key(plan.packs, 4, dict(zip(ids, kinds)))
    assert plan.stats["balance"]["incomplete_groups"] == 0
    packed = [s for p in plan.packs for s in p.sample_ids] + [d["sample_id"] for d in plan.dropped]
    assert sorted(packed) == ids  # nothing lost by the splits


def test_a_recipe_plans_with_a_world_size_in_groups():
    ids, kinds, lengths = _lengths(1500, seed=2)
    ids = [("a/" if i % 3 else "b/") + s for i, s in enumerate(ids)]
    rows = {"sample_ids": np.asarray(ids, dtype=object), "media_types": kinds, "lengths": lengths,
            "media_bytes": np.zeros(len(ids), np.int64), "n_media": (kinds != "text").astype(np.int64),
            "vision_tokens": np.zeros(len(ids), np.int64)}
    plan = make_blend_plan(rows, {"a": 1.0, "b": 2.0}, PlanConfig(max_len=8192, world_size=4, seed=5), epoch=0)
    assert _blocks_share_a_key(plan.packs, 4, dict(zip(ids, kinds)))
    assert plan.stats["blend"]["share_ok"]


def test_check_groups_finds_a_step_whose_ranks_differ(tmp_path):
    packs = [{"pack_id": f"p{k}", "media_type": mt, "sample_ids": [f"s{k}"], "sample_token_lens": [4],
              "total_token_len": 4, "output_shard": "packed-000000.tar", "overlong": False}
             for k, mt in enumerate(["image", "image", "text", "image"])]
    with store.connect(tmp_path) as con:
        _catalog(con)
        store.save_plan(con, packs, [], {"fingerprint": "x"})
        con.execute("CREATE TEMP TABLE kinds AS SELECT * FROM (VALUES ('s0', 'image'), ('s1', 'image'), "
                    "('s2', 'text'), ('s3', 'image')) t(sample_id, media_type)")
        assert check_groups(con, 2, "kinds")[0][1] == 1  # p2 (text) and p3 (image) are one step
        assert check_groups(con, 1, "kinds") == []
        assert [n for _, n, _ in check_groups(con, 3, "kinds")] == [1, 1]  # and 4 packs do not fill groups of 3


def test_a_cp_run_writes_padded_packs_the_reader_lays_out_and_the_audit_passes(tmp_path):
    from pack_assets.core.audit import run_audit
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import run_plan
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.write import run_write
    from pack_assets.reader import iter_encoded

    shards, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    write_tar(shards / "tiny.tar", tiny_media_samples(n=40))
    prof = load_profile("qwen2-vl")
    run_manifest(shards, work, "tiny")
    run_token_lengths(work, "tiny", prof)
    summary = run_plan(work, ["tiny"], PlanConfig(max_len=1024, cp_size=2, world_size=2), prof)
    assert summary.violations == []
    run_write(work, shards, out, workers=1)
    assert run_audit(work, out, recount_fraction=0.0).verdict == "PASS"
    assert "each sub-sample padded to a multiple of 4" in (work / "audit_report.md").read_text()
    assert summary.as_metadata()["fill_padded"] >= summary.fill
    packs = list(iter_encoded(out, "qwen2-vl"))
    for p in packs:
        cu_p = p["cu_seqlens_padded"]
        assert (np.diff(cu_p) % 4 == 0).all() and cu_p[-1] <= 1024
        assert (np.diff(cu_p) - np.diff(p["cu_seqlens"]) < 4).all()


def test_an_incremental_plan_with_a_world_size_replans_in_full_when_a_kept_pack_changes(tmp_path):
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import run_plan
    from pack_assets.core.scan import run_manifest

    shards, work, prof = tmp_path / "in", tmp_path / "work", load_profile("qwen2-vl")
    members = tiny_media_samples(n=40)
    cfg = PlanConfig(max_len=1024, world_size=2, incremental=True)

    def plan(samples):
        write_tar(shards / "tiny.tar", samples)
        run_manifest(shards, work, "tiny")
        run_token_lengths(work, "tiny", prof)
        return run_plan(work, ["tiny"], cfg, prof, input_root=shards)

    assert plan(members).violations == []
    again = plan(members + [("t9999.json", members[0][1])])  # one new sample: one new pack, no whole group
    assert again.planning.startswith("full plan: the new samples") and again.violations == []
    changed = [(n, d.replace("a red", "a longer red") if n == "t0000.json" else d) for n, d in members]
    replanned = plan(changed)  # a kept pack loses its recounted sample: its group could break
    assert replanned.planning.startswith("full plan: packs changed") and replanned.violations == []
