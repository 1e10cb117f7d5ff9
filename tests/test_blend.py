"""Recipes: datasets blended with repeats, proportions held over the run, one plan per epoch (issue 20, 1-3)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import small_dataset

from pack_assets.core import blend, epochs, store
from pack_assets.core import recipe as rc
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig
from pack_assets.core.safety import UnsafePaths
from pack_assets.core.scan import run_manifest
from pack_assets.core.settings import Settings
from pack_assets.reader import iter_packs

PROFILE = load_profile("qwen3-vl")


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the recipe file ------------------------------------------------------------------------------------------


def test_a_recipe_is_read_with_its_settings_and_relative_inputs(tmp_path):
    (tmp_path / "llava").mkdir()
    (tmp_path / "ocr").mkdir()
    r = rc.load(write_recipe(tmp_path / "r.yaml", """
datasets:
  - {name: llava, input: llava, repeat: 1.0}
  - {name: ocr, input: ocr, repeat: 2.5}
max_len: 16384
profile: qwen2.5-vl
epochs: 2
seed: 7
mode: index
"""))
    assert r.roots == {"llava": str(tmp_path / "llava"), "ocr": str(tmp_path / "ocr")}
    assert r.repeats == {"llava": 1.0, "ocr": 2.5} and r.epochs == 2
    s = Settings.from_flat({"recipe": r.path})
    assert (s.plan.max_len, s.profile, s.plan.seed, s.output_mode) == (16384, "qwen2.5-vl", 7, "index")
    assert s.plan.algorithm == "mixfill"  # a blend's default (its proportions), unless the recipe names one
    assert s.sources == r.roots
    # a setting given as something other than its default (a CLI flag, a Launchpad field) wins over the recipe
    assert Settings.from_flat({"recipe": r.path, "max_len": 4096}).plan.max_len == 4096
    assert Settings.from_flat(s.flat()) == s


@pytest.mark.parametrize("body, message", [
    ("datasets: [{name: a, input: a, repeat: 1, weight: 2}]", r"unknown key\(s\) \['weight'\]"),
    ("datasets: [{name: a, input: a}, {name: a, input: b}]", "appears twice"),
    ("datasets: [{name: 'a/b', input: a}]", "dataset name 'a/b'"),
    ("datasets: [{name: a, input: a, repeat: -0.5}]", "repeat must be a number >= 0"),
    ("datasets: [{name: a, input: a}]\nepochs: 0", "epochs must be an integer >= 1"),
    ("datasets: [{name: a, input: a}]\nmax_lenght: 10", "unknown setting 'max_lenght'"),
    ("datasets: [{name: a, input: a}]\ninput_dir: x", "not a recipe key"),
    ("datasets: []", "at least one dataset"),
    ("datasets: [{name: a, input: a}]\nmode: symlink", "output mode 'symlink'"),
    ("datasets: [{name: a, input: [unclosed", "not valid YAML"),
])
def test_a_bad_recipe_is_refused_with_what_to_fix(tmp_path, body, message):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path = write_recipe(tmp_path / "r.yaml", body)
    with pytest.raises(ValueError, match=message):
        Settings.from_flat({"recipe": str(path)})


def test_missing_and_overlapping_folders_are_refused_before_anything_is_written(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    missing = write_recipe(tmp_path / "m.yaml", "datasets: [{name: a, input: a}, {name: b, input: nope}]")
    with pytest.raises(rc.RecipeError, match="input folder .*nope does not exist"):
        Settings.from_flat({"recipe": str(missing), "work_dir": str(tmp_path / "w")}).check_paths()
    nested = write_recipe(tmp_path / "n.yaml", "datasets: [{name: a, input: a}, {name: b, input: a/sub}]")
    with pytest.raises(UnsafePaths, match="read twice"):
        Settings.from_flat({"recipe": str(nested), "work_dir": str(tmp_path / "w")}).check_paths()
    inside = write_recipe(tmp_path / "o.yaml", "datasets: [{name: a, input: a}]")
    with pytest.raises(UnsafePaths, match="inside the input"):
        Settings.from_flat({"recipe": str(inside), "output_dir": str(tmp_path / "a" / "out")}).check_paths()
    assert not (tmp_path / "w").exists()


# -- the draw ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("repeat", [0.0, 0.5, 1.0, 2.5])
def test_each_sample_is_used_floor_r_times_plus_a_seeded_share(repeat):
    ids = [f"d/s/{i:04d}" for i in range(101)]
    c = rc.copies(ids, repeat, 0, "d", 0)
    base = math.floor(repeat)
    assert set(c.tolist()) <= {base, base + 1}
    assert c.sum() == base * 101 + math.floor((repeat - base) * 101 + 0.5) == rc.expected_copies(101, repeat)
    assert (rc.copies(ids, repeat, 0, "d", 0) == c).all()  # deterministic
    if repeat % 1:
        assert not (rc.copies(ids, repeat, 0, "d", 1) == c).all()  # another epoch, another half
        # adding samples does not move the draw of the others more than the new share needs
        more = rc.copies(ids + [f"d/t/{i:04d}" for i in range(10)], repeat, 0, "d", 0)[:101]
        assert (more != c).sum() <= 10


# -- the planner on many packs: proportions, drift, bound --------------------------------------------------


def synthetic_rows(spec, seed=0):
    rng = np.random.default_rng(seed)
    ids, lens = [], []
    for name, n, mean in spec:
        ids += [f"{name}/s/{i:07d}" for i in range(n)]
        lens += np.clip(rng.lognormal(np.log(mean), 0.6, n).astype(np.int64), 8, 4000).tolist()
    n = len(ids)
    return {"sample_ids": np.asarray(ids, dtype=object), "media_types": np.asarray(["text"] * n, dtype=object),
            "lengths": np.asarray(lens, dtype=np.int64), "media_bytes": np.zeros(n, np.int64),
            "n_media": np.zeros(n, np.int64), "vision_tokens": np.zeros(n, np.int64)}


def saved(tmp_path: Path, plan) -> object:
    """The plan as the stage stores it (store.save_plan): what the checks below read, not the planner's stats."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    con = store.connect(tmp_path)
    store.build_catalog(con, tmp_path, [], "none")  # the (empty) views the lineage view names
    store.save_plan(con, [dataclasses.asdict(p) for p in plan.packs], plan.dropped, {"x": 1}, blend=True)
    return con


@pytest.mark.parametrize("algorithm", ["mixfill", "bfd"])  # mixfill: a recipe's default
def test_proportions_hold_in_every_window_of_the_written_plan(tmp_path, algorithm):
    # three datasets of very different lengths (short, medium, long), one down-sampled, one repeated
    rows = synthetic_rows([("chat", 6000, 300), ("ocr", 1500, 2500), ("caption", 3000, 600)])
    repeats = {"chat": 1.0, "ocr": 2.5, "caption": 0.5}
    plan = blend.make_blend_plan(rows, repeats, PlanConfig(max_len=4096, algorithm=algorithm), epoch=0)
    con = saved(tmp_path, plan)
    packs = con.execute("SELECT pack_id, dataset, sum(p.sample_token_lens[position + 1]) FROM pack_members "
                        "JOIN pack_plan p USING (pack_id) GROUP BY ALL ORDER BY pack_id").fetchall()
    n_packs = con.execute("SELECT count(*) FROM pack_plan").fetchone()[0]
    assert n_packs >= 1024  # four windows of 256 at least
    names = list(repeats)
    tokens = np.zeros((n_packs, len(names)))
    for pack_id, dataset, t in packs:
        tokens[int(pack_id[1:]), names.index(dataset)] += t
    share = tokens.sum(0) / tokens.sum()
    for a in range(0, n_packs - 255, 256):
        w = tokens[a:a + 256].sum(0)
        assert np.all(np.abs(w / w.sum() - share) <= 0.10 * share), (a, w / w.sum(), share)
    spp = np.asarray([r[0] for r in con.execute("SELECT len(sample_ids) FROM pack_plan ORDER BY pack_id").fetchall()])
    means = [spp[a:a + 256].mean() for a in range(0, n_packs - 255, 256)]
    assert max(means) / min(means) <= 1.25
    bound = plan.stats["lower_bound"]
    # +0.1 % on this small set (3,183 packs) too, as at 1M (docs/benchmarks.md); `mix` was +0.5 % here
    assert n_packs <= bound * 1.001 + 1
    b = plan.stats["blend"]
    assert b["share_ok"] and b["drift_ok"] and set(b["datasets"]) == set(names)
    # and the counts add up per dataset, with ⌊r⌋·n + round(frac·n) copies
    got = dict(con.execute("SELECT dataset, count(*) FROM pack_members GROUP BY 1").fetchall())
    dropped = dict(con.execute("SELECT dataset, count(*) FROM dropped GROUP BY 1").fetchall())
    for name, n in (("chat", 6000), ("ocr", 1500), ("caption", 3000)):
        assert got.get(name, 0) + dropped.get(name, 0) == rc.expected_copies(n, repeats[name])


def test_the_old_dealing_misses_what_the_blend_dealing_holds():
    """The share check can fail: plan._deal (stratified by samples per pack alone) misses ±10 % on this mix."""
    from pack_assets.core.plan import _deal

    rows = synthetic_rows([("chat", 6000, 300), ("ocr", 1500, 2500), ("caption", 3000, 60)])
    plan = blend.make_blend_plan(rows, {"chat": 1.0, "ocr": 2.5, "caption": 0.5}, PlanConfig(max_len=4096), 0)
    names = ["chat", "ocr", "caption"]
    tokens = np.zeros((len(plan.packs), 3))
    for k, p in enumerate(plan.packs):
        for d, n in zip(p.datasets, p.sample_token_lens):
            tokens[k, names.index(d)] += n
    spp = np.asarray([len(p.sample_ids) for p in plan.packs], dtype=np.float64)
    old = _deal(list(range(len(plan.packs))), spp, np.random.default_rng(0), 256)
    assert blend.share_errors(tokens[old]).max() > 0.10
    assert blend.share_errors(tokens).max() < blend.share_errors(tokens[old]).max()


# -- epochs --------------------------------------------------------------------------------------------------


def test_epochs_differ_are_deterministic_and_one_epoch_planned_alone_equals_it_in_all():
    rows = synthetic_rows([("a", 800, 300), ("b", 300, 1200)])
    repeats = {"a": 1.0, "b": 1.5}
    cfg = PlanConfig(max_len=2048, seed=5)
    e0, e1 = (blend.make_blend_plan(rows, repeats, cfg, k) for k in (0, 1))
    key = lambda p: [(x.pack_id, x.sample_ids, x.copies) for x in p.packs]  # noqa: E731
    assert key(e0) != key(e1)
    assert key(blend.make_blend_plan(rows, repeats, cfg, 1)) == key(e1)
    assert key(blend.make_blend_plan(rows, repeats, dataclasses.replace(cfg, seed=6), 1)) != key(e1)


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> Path:
    """Four small datasets (a: 2 shards, b, c, z: 1), scanned and counted once; each test copies them."""
    base = tmp_path_factory.mktemp("blend")
    roots = {name: small_dataset(base / "in" / name, n_shards=n, per_shard=9) for name, n in
             (("a", 2), ("b", 1), ("c", 1), ("z", 1))}
    for k in store.find_sources(roots):
        run_manifest(roots, base / "work", k)
        run_token_lengths(base / "work", k, PROFILE)
    return base


def build(tmp_path: Path, counted: Path, repeats: dict[str, float], epochs: int = 2, max_len: int = 1500):
    """A recipe over the counted datasets named in ``repeats`` (copies keep their mtimes: nothing is rescanned)."""
    shutil.copytree(counted / "in", tmp_path / "in")
    shutil.copytree(counted / "work", tmp_path / "work")
    recipe = rc.Recipe(tuple(rc.Dataset(n, str(tmp_path / "in" / n), r) for n, r in repeats.items()), epochs, seed=3)
    keys = list(store.find_sources(recipe.roots))
    assert all(store.read_shard_info(tmp_path / "work", k) for k in keys)
    return recipe, tmp_path / "work", keys, PlanConfig(max_len=max_len, seed=recipe.seed)


def test_a_blend_is_planned_written_audited_and_read_per_epoch(tmp_path, counted):
    # one epoch read back here (the audit draws its plots per epoch); the next test writes two
    recipe, work, keys, cfg = build(tmp_path, counted, {"a": 1.0, "b": 2.5, "c": 0.5, "z": 0.0}, epochs=1)
    assert keys == ["a/part-000", "a/part-001", "b/part-000", "c/part-000", "z/part-000"]
    summary = blend.run_blend_plan(work, keys, cfg, PROFILE, recipe)
    assert summary.violations == [] and len(summary.epochs) == 1
    out = tmp_path / "out"
    epochs.run_blend_write(work, recipe, out, workers=1)
    result = epochs.run_blend_audit(work, recipe, out)
    assert result.verdict == "PASS", result.violations[:5]
    for k in range(recipe.epochs):
        per = result.stats["per_epoch"][k]
        for name, shards in (("a", 2), ("b", 1), ("c", 1), ("z", 1)):
            c = per[name]
            ok = c["ok"]
            assert c["read"] == 10 * shards and c["rejected"] == shards and ok == 9 * shards
            assert c["packed"] + c["dropped"] == c["expected"] == rc.expected_copies(ok, recipe.repeats[name])
        packs = list(iter_packs(sorted((out / blend.epoch_name(k)).glob("*.tar"))))
        with store.connect(blend.epoch_work(work, k), read_only=True) as con:
            members = con.execute("SELECT dataset, epoch, copy, sample_id FROM pack_members ORDER BY pack_id, position"
                                  ).fetchall()
            planned = [r[0] for r in con.execute("SELECT pack_id FROM pack_plan ORDER BY pack_id").fetchall()]
        assert [p["pack_id"] for p in packs] == planned
        assert [s for p in packs for s in p["_meta"]["sample_ids"]] == [m[3] for m in members]
        assert {m[1] for m in members} == {k} and not any(m[0] == "z" for m in members)
        assert max(m[2] for m in members if m[0] == "b") == 2  # 2.5: copies 0, 1 and for half of them 2
    assert (work / "blend_report.md").read_text().count("| b | 10 | 1 | 9 | 2.5 | 23 |") == 1  # 2·9 + 4.5 up
    assert "## Per dataset" in (blend.epoch_work(work, 0) / "audit_report.md").read_text()


def test_a_trainer_resuming_at_epoch_k_reads_the_same_packs(tmp_path, counted):
    recipe, work, keys, cfg = build(tmp_path, counted, {"b": 1.0, "c": 1.5}, epochs=2)
    blend.run_blend_plan(work, keys, cfg, PROFILE, recipe)
    all_epochs = (blend.epoch_work(work, 1) / "pack_plan.jsonl").read_text()
    blend.run_blend_plan(work, keys, cfg, PROFILE, recipe, epochs=[1])  # epoch 1 alone, anew
    assert (blend.epoch_work(work, 1) / "pack_plan.jsonl").read_text() == all_epochs
    out1, out2 = tmp_path / "o1", tmp_path / "o2"
    epochs.run_blend_write(work, recipe, out1, workers=1)
    epochs.run_blend_write(work, recipe, out2, workers=1)
    for k in range(2):
        a = sorted((out1 / blend.epoch_name(k)).glob("*.tar"))
        assert [p.read_bytes() for p in a] == [(out2 / blend.epoch_name(k) / p.name).read_bytes() for p in a]
    assert json.loads(all_epochs.splitlines()[0])["epoch"] == 1
    # the recipe drops to one epoch: epoch-001's files of ours go (no stale epoch for an `epoch-*` glob), a
    # user's file there stays, with its folder
    (out1 / blend.epoch_name(1) / "notes.txt").write_text("mine")
    one = dataclasses.replace(recipe, epochs=1)
    summary = epochs.run_blend_write(work, one, out1, workers=1)
    assert summary.retired == [out1 / blend.epoch_name(1)]
    assert [p.name for p in (out1 / blend.epoch_name(1)).rglob("*")] == ["notes.txt"]
    summary = epochs.run_blend_write(work, one, out2, workers=1)
    assert summary.retired == [out2 / blend.epoch_name(1)] and not (out2 / blend.epoch_name(1)).exists()
    assert sorted(p.name for p in out2.iterdir()) == [blend.epoch_name(0)]


def test_a_shard_added_to_one_dataset_is_planned_and_counted_on_the_next_run(tmp_path, counted):
    recipe, work, keys, cfg = build(tmp_path, counted, {"c": 1.0, "b": 0.5}, epochs=1)
    blend.run_blend_plan(work, keys, cfg, PROFILE, recipe)
    with store.connect(blend.epoch_work(work, 0), read_only=True) as con:
        before = dict(con.execute("SELECT dataset, count(*) FROM (SELECT dataset FROM pack_members UNION ALL "
                                  "SELECT dataset FROM dropped) GROUP BY 1").fetchall())
    small_dataset(tmp_path / "extra", n_shards=1, per_shard=9)
    (tmp_path / "extra" / "part-000.tar").rename(Path(recipe.roots["b"]) / "part-009.tar")
    keys = list(store.find_sources(recipe.roots))
    assert keys == ["c/part-000", "b/part-000", "b/part-009"]
    assert run_manifest(recipe.roots, work, "b/part-000").cached  # the others are kept as they are
    run_manifest(recipe.roots, work, "b/part-009")
    run_token_lengths(work, "b/part-009", PROFILE)
    summary = blend.run_blend_plan(work, keys, cfg, PROFILE, recipe)
    assert summary.violations == []  # check_blend: the draw adds up per dataset (the audit's same count: above)
    with store.connect(blend.epoch_work(work, 0), read_only=True) as con:
        after = dict(con.execute("SELECT dataset, count(*) FROM (SELECT dataset FROM pack_members UNION ALL "
                                 "SELECT dataset FROM dropped) GROUP BY 1").fetchall())
        new = con.execute("SELECT count(*) FROM pack_members WHERE starts_with(sample_id, 'b/part-009/')").fetchone()[0]
    assert before["b"] == 5 and after == {"c": 9, "b": 9} and new > 0  # 0.5 of 9 (4.5 up), then of 18


def test_the_plan_check_catches_a_lost_and_a_duplicated_copy(tmp_path, counted):
    recipe, work, keys, cfg = build(tmp_path, counted, {"c": 1.0, "b": 2.0}, epochs=1)
    blend.run_blend_plan(work, keys, cfg, PROFILE, recipe)
    with store.connect(blend.epoch_work(work, 0)) as con:
        assert blend.check_blend(con, cfg, recipe.repeats) == []
        con.execute("UPDATE pack_members SET copy = 0 WHERE dataset = 'b' AND copy = 1 AND "
                    "sample_id = (SELECT min(sample_id) FROM pack_members WHERE dataset = 'b')")
        checks = {v["check"] for v in blend.check_blend(con, cfg, recipe.repeats)}
    assert {"duplicate_sample", "lost_sample"} <= checks


def test_run_recipe_refuses_bad_input_before_anything_is_written(tmp_path, capsys):
    from pack_assets.cli import main

    (tmp_path / "a").mkdir()
    typo = write_recipe(tmp_path / "t.yaml", "datasets: [{name: a, input: a}]\nmax_lenn: 10\n")
    base = ["run", "--work", str(tmp_path / "work"), "--output", str(tmp_path / "out"),
            "--dagster-home", str(tmp_path / "dh")]
    assert main([*base, "--recipe", str(typo)]) == 2
    assert "unknown setting 'max_lenn'" in capsys.readouterr().err
    ok = write_recipe(tmp_path / "r.yaml", "datasets: [{name: a, input: a}]\n")
    for args, told in ((["--recipe", str(ok), "--input", str(tmp_path / "a")],
                        "--input: not allowed with argument --recipe"),
                       ([], "one of the arguments --input --recipe is required")):
        with pytest.raises(SystemExit) as usage:  # a usage error: argparse's exit 2, one line
            main([*base, *args])
        err = capsys.readouterr().err
        assert usage.value.code == 2 and told in err and err.count("\n") == 1
    assert main([*base, "--input", str(tmp_path / "a")]) == 2
    assert "--max-len N is required with --input" in capsys.readouterr().err
    # a flag equal to the default cannot win over the recipe (flat settings: default = not set): refused, not
    # silently replaced by the recipe's value; any other value overrides it
    long = write_recipe(tmp_path / "l.yaml", "datasets: [{name: a, input: a}]\nmax_len: 16384\nseed: 3\n")
    assert main([*base, "--recipe", str(long), "--max-len", "8192"]) == 2
    assert "--max-len 8192 is the default, which cannot override the recipe's max_len: 16384" in capsys.readouterr().err
    assert main([*base, "--recipe", str(long), "--seed", "0"]) == 2 and "recipe's seed: 3" in capsys.readouterr().err
    from pack_assets.cli import _settings, build_parser

    given = build_parser().parse_args([*base, "--recipe", str(long), "--max-len", "4096"])
    assert _settings(given).plan.max_len == 4096 and _settings(given).plan.seed == 3
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["copy", "index"])
def test_the_pack_assets_follow_the_resources_recipe(tmp_path, counted, mode):
    """The Launchpad's way: the `settings` resource names the recipe; pack_plan, packed_shards and audit_report
    plan, write and audit the epochs (the shard stages ran above, through the core), in the recipe's mode."""
    import dagster as dg

    from pack_assets.defs.assets import audit_report, pack_plan, packed_shards
    from pack_assets.defs.partitions import source_shards
    from pack_assets.defs.resources import PackSettings, summary_io_manager

    shutil.copytree(counted / "in", tmp_path / "in")
    shutil.copytree(counted / "work", tmp_path / "work")
    path = write_recipe(tmp_path / "r.yaml", "datasets:\n  - {name: b, input: in/b, repeat: 1.5}\n"
                        "  - {name: c, input: in/c}\nepochs: 1\nmax_len: 1500\nprofile: qwen3-vl\n"
                        f"mode: {mode}\n")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(source_shards.name, ["b/part-000", "c/part-000"])
    settings = PackSettings(recipe=str(path), work_dir=str(tmp_path / "work"), output_dir=str(tmp_path / "out"))
    result = dg.materialize([pack_plan, packed_shards, audit_report], instance=instance,
                            resources={"settings": settings, "io_manager": summary_io_manager})
    assert result.success
    audit = result.asset_value("audit_report")
    assert audit.verdict == "PASS" and set(audit.stats["per_epoch"]) == {0}
    assert audit.stats["per_epoch"][0]["b"]["expected"] == 9 + 5  # 1.5 of 9: 9 + 4.5 up
    assert [p.name for p in sorted((tmp_path / "out").iterdir())] == ["epoch-000"]
    assert (tmp_path / "out" / "epoch-000" / ".nv-meta" / "index.sqlite").exists()
    assert result.asset_value("packed_shards").epochs[0].output_mode == mode
    assert (tmp_path / "out" / "epoch-000" / "pack_index.json").exists() == (mode == "index")


# -- index mode: the epochs as byte-range indexes into every dataset's shards -----------------------------------


@pytest.fixture
def no_png(monkeypatch):
    """The audit's figures are drawn but not rendered to PNG (seconds each; tested elsewhere)."""
    from pack_assets.core import report

    def placeholder(fig, path: Path) -> None:
        report._plt().close(fig)
        store.atomic_write_text(path, "plot skipped in test_blend")

    monkeypatch.setattr(report, "_save", placeholder)


def without_mode(p: dict) -> dict:
    """A pack with the `_meta` keys that name the output mode (and so its fingerprint) left out."""
    return {**p, "_meta": {k: v for k, v in p["_meta"].items() if k not in ("shard_fingerprint", "output_mode")}}


@pytest.fixture
def indexed(tmp_path, counted, no_png):
    """Two datasets (b repeated 2.5 times), two epochs, written in copy and in index mode."""
    recipe, work, keys, cfg = build(tmp_path, counted, {"a": 1.0, "b": 2.5}, epochs=2)
    assert blend.run_blend_plan(work, keys, cfg, PROFILE, recipe).violations == []
    copy, index = tmp_path / "copy", tmp_path / "index"
    epochs.run_blend_write(work, recipe, copy, workers=1)
    summary = epochs.run_blend_write(work, recipe, index, workers=1, mode="index")
    assert [e.output_mode for e in summary.epochs] == ["index", "index"]
    return recipe, work, copy, index


def epoch_packs(out: Path, k: int, **kw) -> list[dict]:
    return [without_mode(p) for p in iter_packs(out / blend.epoch_name(k), **kw)]


def test_a_recipe_in_index_mode_gives_the_copy_modes_packs_per_epoch_and_passes_the_audit(indexed):
    from pack_assets.core.indexmode import INDEX_FILE
    from pack_assets.reader import PackEncoder

    recipe, work, copy, index = indexed
    roots = {n: str(Path(p).resolve()) for n, p in recipe.roots.items()}
    for k in range(2):
        folder = index / blend.epoch_name(k)
        assert json.loads((folder / INDEX_FILE).read_text())["input_roots"] == roots
        assert {n.split(".", 1)[1] for t in folder.glob("*.tar") for n in tarfile.open(t).getnames()} == {
            "json", "index.json"}  # no media member
        from_copy, from_index = epoch_packs(copy, k), epoch_packs(index, k)
        assert from_copy == from_index and len(from_index) > 3  # every media byte, from both datasets' shards
        sources = {s["shard"].split("/")[0] for p in from_index for s in p["_meta"]["sources"] if s["media"]}
        assert sources == {"a", "b"}
    assert epoch_packs(index, 0) != epoch_packs(index, 1)  # each epoch its own grouping
    enc = PackEncoder("qwen3-vl")
    for a, b in zip(epoch_packs(copy, 1)[:4], epoch_packs(index, 1)[:4]):
        assert np.array_equal(enc.encode(a)["input_ids"], enc.encode(b)["input_ids"])
    result = epochs.run_blend_audit(work, recipe, index)
    assert result.verdict == "PASS", result.violations[:5]
    assert result.stats["media_members_checked"] > 10  # re-hashed from the ranges of both datasets
    # the audit's fingerprint of an index shard takes the recorded roots: a clean audit vouches for every shard
    again = epochs.run_blend_audit(work, recipe, index, scope="changed")
    assert again.verdict == "PASS" and again.stats["output_shards_trusted"] == again.stats["output_shards"] > 0
    # a rerun keeps every index shard: the fingerprint covers the roots and every source's stamp
    assert epochs.run_blend_write(work, recipe, index, workers=1, mode="index").written == 0


def test_a_changed_source_of_one_dataset_is_named_by_the_reader_and_fails_the_blend_audit(indexed):
    from pack_assets.core.indexmode import IndexSourceChanged

    recipe, work, copy, index = indexed
    src = Path(recipe.roots["b"]) / "part-000.tar"
    data = bytearray(src.read_bytes())
    data[-20000] ^= 0xFF
    src.write_bytes(bytes(data))
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    with pytest.raises(IndexSourceChanged, match="changed since it was packed") as e:
        for k in range(2):
            epoch_packs(index, k)
    assert e.value.path == str(src.resolve())
    result = epochs.run_blend_audit(work, recipe, index)
    assert result.verdict == "FAIL"
    changed = [v for v in result.violations if v["check"] == "source_changed"]
    assert changed and {v["epoch"] for v in changed} == {0, 1}
    assert all(str(src.resolve()) in v["detail"] for v in changed)
    # the copy's bytes are its own, intact; but the input changed since it was counted: not a PASS (coverage.py)
    copied = epochs.run_blend_audit(work, recipe, copy)
    assert copied.verdict == "INCOMPLETE" and copied.ok and copied.waiting == ["b/part-000"]


def test_moved_blend_data_is_read_with_a_source_root_mapping_and_reindexed_from_the_new_roots(indexed):
    from pack_assets.core.indexmode import INDEX_FILE, IndexSourceChanged

    recipe, work, copy, index = indexed
    old = Path(recipe.roots["a"])
    moved = old.parent.parent / "moved-a"
    old.rename(moved)  # the same files, mtimes kept: only the folder is new
    with pytest.raises(IndexSourceChanged, match=f"{old.resolve()}/part-00.\\.tar cannot be opened"):
        epoch_packs(index, 0)
    for k in range(2):  # only the dataset that moved is named; b is read from its recorded folder
        assert epoch_packs(index, k, source_root={"a": moved}) == epoch_packs(copy, k)
    with pytest.raises(ValueError, match="mapping dataset name -> folder"):
        epoch_packs(index, 0, source_root=moved)
    # written again from a recipe that names the new folder: every index shard is new (the roots changed)
    recipe2 = dataclasses.replace(recipe, datasets=tuple(
        dataclasses.replace(d, input=str(moved)) if d.name == "a" else d for d in recipe.datasets))
    assert epochs.run_blend_write(work, recipe2, index, workers=1, mode="index").written == sum(
        len(list((index / blend.epoch_name(k)).glob("*.tar"))) for k in range(2))
    assert json.loads((index / "epoch-001" / INDEX_FILE).read_text())["input_roots"]["a"] == str(moved.resolve())
    assert epoch_packs(index, 1) == epoch_packs(copy, 1)
    assert epochs.run_blend_audit(work, recipe2, index).verdict == "PASS"


def test_a_partition_of_no_dataset_of_the_recipe_counts_as_removed_not_a_crash(tmp_path):
    """Under `dagster dev`, `recipe` switched on (or a dataset dropped) while old partitions are registered:
    the plan lists them as removed instead of raising KeyError."""
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.plan import plannable

    (tmp_path / "a").mkdir()
    # both count as removed; nothing is left to plan, which is the usual refusal, not a KeyError
    with pytest.raises(FileNotFoundError, match="no shard has token lengths yet"):
        plannable(tmp_path / "work", ["part-0001", "gone/part-0001"], load_profile("qwen2.5-vl"),
                  {"a": tmp_path / "a"}, allow_missing=True)


def test_run_with_a_recipe_from_the_command_line_packs_every_copy(tmp_path, capsys):
    """`pack-assets run --recipe` end to end (helpers scan both datasets, Dagster records them, one output
    folder per epoch) and its summary; a second run scans nothing and gives the same packs."""
    from pack_assets.cli import main

    small_dataset(tmp_path / "a", n_shards=2, per_shard=9)
    small_dataset(tmp_path / "b", n_shards=1, per_shard=9)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"datasets:\n  - {{name: a, input: {tmp_path / 'a'}}}\n  - {{name: b, input: {tmp_path / 'b'}, "
                      f"repeat: 2}}\nepochs: 2\nmax_len: 1500\n")
    args = ["run", "--recipe", str(recipe), "--work", str(tmp_path / "work"), "--output", str(tmp_path / "out"),
            "--dagster-home", str(tmp_path / "dh"), "--json"]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["verdict"] == "PASS" and s["shards"] == 3 and s["shard_runs"] == 3 and s["epochs"] == 2
    assert s["samples"] == 30 and s["rejected"] == 3
    # every epoch: a's 18 ok samples once, b's 9 twice
    assert s["packed"] + s["dropped"] == 2 * (18 + 2 * 9)
    assert s["output_bytes"] > 0 and [Path(f).name for f in s["output_folders"]] == ["epoch-000", "epoch-001"]
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["shard_runs"] == 0 and again["packs"] == s["packs"] and again["verdict"] == "PASS"
