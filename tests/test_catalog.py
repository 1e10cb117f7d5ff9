"""pack_assets.catalog: the catalog's tables as pandas DataFrames (a single plan's, a recipe's per epoch or all
epochs), equal to what the output holds; read-only; a catalog held by a running stage is named, not a crash."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import small_dataset
from pack_helpers import packed_outputs

from pack_assets import catalog
from pack_assets.reader import iter_packs

DOC = Path(__file__).resolve().parents[1] / "docs" / "usage.md"


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalog")
    return packed_outputs(small_dataset(root / "in", n_shards=3, per_shard=12), root, "qwen2.5-vl", max_len=450)


def test_the_tables_are_what_was_read_planned_and_packed(out):
    t = catalog.tables(out["work"])
    assert list(t) == list(catalog.TABLES) and all(isinstance(df, pd.DataFrame) for df in t.values())
    packs = list(iter_packs(out["copy"]))
    assert t["pack_plan"]["pack_id"].tolist() == [p["pack_id"] for p in packs]
    assert t["pack_plan"]["total_token_len"].tolist() == [p["_meta"]["total_token_len"] for p in packs]
    members = t["pack_members"].sort_values(["pack_id", "position"])
    assert members["sample_id"].tolist() == [s for p in packs for s in p["_meta"]["sample_ids"]]
    assert len(t["samples"]) == 39 and Counter(t["samples"]["status"]) == {"ok": 36, "rejected": 3}
    assert t["rejected"]["reason"].tolist() == ["invalid_json"] * 3 and t["dropped"].empty
    assert set(t["token_lengths"]["sample_id"]) == set(members["sample_id"])
    assert catalog.table(out["work"], "members", limit=5).shape[0] == 5


def test_a_recipes_epochs_one_at_a_time_or_all_in_a_row(out):
    every = catalog.table(out["blend_work"], "pack_plan")
    ones = [catalog.table(out["blend_work"], "pack_plan", epoch=k) for k in range(2)]
    assert every["epoch"].tolist() == [0] * 24 + [1] * 24
    assert every.equals(pd.concat(ones, ignore_index=True))
    for k in range(2):
        assert ones[k]["pack_id"].tolist() == [p["pack_id"] for p in iter_packs(out["blend"] / f"epoch-{k:03d}")]
    assert len(catalog.table(out["blend_work"], "samples")) == 39  # read once, not once per epoch
    with pytest.raises(ValueError, match="no catalog for epoch 2"):
        catalog.table(out["blend_work"], "pack_plan", epoch=2)


def test_queries_read_and_cannot_write(out):
    n = catalog.sql(out["work"], "SELECT media_type, count(*) AS packs FROM pack_plan GROUP BY 1 ORDER BY 1")
    assert n["packs"].sum() == 17
    with pytest.raises(Exception, match="read-only"):
        catalog.sql(out["work"], "DELETE FROM pack_plan")
    assert len(catalog.table(out["work"], "pack_plan")) == 17


def test_a_catalog_a_stage_holds_is_named_and_a_wrong_name_refused(out, tmp_path):
    db = out["work"] / "pack_assets.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(db)!r}); "
                               "print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match="in use by a running stage"):
            catalog.table(out["work"], "samples")
    finally:
        holder.stdin.close()
        holder.wait()
    with pytest.raises(FileNotFoundError, match="no pack_assets catalog"):
        catalog.tables(tmp_path)
    with pytest.raises(ValueError, match="not a catalog table"):
        catalog.table(out["work"], "lineage")
    with pytest.raises(ValueError, match="no epoch-<k> catalogs"):
        catalog.table(out["work"], "pack_plan", epoch=0)


def test_the_usage_docs_example_runs(out, tmp_path, monkeypatch):
    (tmp_path / "work").symlink_to(out["work"])
    monkeypatch.chdir(tmp_path)
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index("## The catalog in a notebook"):].split("```python\n", 1)[1].split("```", 1)[0]
    ns: dict = {}
    exec(compile(block, "usage.md", "exec"), ns)
    assert ns["shares"]["packs"].sum() == 17 and len(ns["plan"]) == 10
