"""The audit's conversations gathered once for all the output shards it reads (`store.staged`) give the audit
that a query per output shard gives: a wrong packed conversation is still caught, in the shard that holds it."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

from conftest import SqlSpy, appended_catalog

from pack_assets.core import audit as audit_mod
from pack_assets.core import expected, store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, PlanInfo, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import run_write


def _packed(inp: Path, work: Path, out: Path) -> None:
    profile = load_profile("qwen3-vl")
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, profile)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=1), profile)
    run_write(work, inp, out, workers=1)


def _change_a_conversation(shard: Path) -> str:
    """One letter of the first text of the last pack document of ``shard`` changed (the tar rewritten); returns
    the id of the sample whose conversation it is."""
    with tarfile.open(shard) as tf:
        items = [(ti.name, tf.extractfile(ti).read()) for ti in tf.getmembers()]
    at = max(i for i, (n, _) in enumerate(items) if n.endswith(".json"))
    doc = json.loads(items[at][1])
    sample = doc["samples"][0]
    text = next(c if isinstance(c, str) else next(p["text"] for p in c if p.get("text"))
                for c in (m["content"] for m in sample["messages"]))
    new = ("X" if text[:1] != "X" else "Y") + text[1:]
    raw = items[at][1].decode()
    old = json.dumps(text, ensure_ascii=False)
    assert old in raw
    items[at] = (items[at][0], raw.replace(old, json.dumps(new, ensure_ascii=False), 1).encode())
    with tarfile.open(shard, "w") as tf:
        for name, data in items:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return sample["sample_id"]


def test_staged_conversations_catch_a_wrong_one_in_its_shard_as_the_query_per_shard_does(dataset, tmp_path,
                                                                                           monkeypatch):
    work, out = tmp_path / "work", tmp_path / "out"
    _packed(dataset, work, out)
    shards = sorted(out.glob("*.tar"))
    assert len(shards) >= 3
    changed = _change_a_conversation(shards[1])
    read = []  # (query, shard) read from the staged files (as rows or as Arrow columns)
    for how in ("rows", "table"):
        real = getattr(store.Staged, how)
        monkeypatch.setattr(store.Staged, how, lambda self, con, query, shard, *a, real=real, **k:
                            read.append((query, shard)) or real(self, con, query, shard, *a, **k))
    texts = []  # the output shards whose conversation texts were read: the audit holds digests (`expected.ShardTexts`)
    real_load = expected.ShardTexts._load
    monkeypatch.setattr(expected.ShardTexts, "_load", lambda self: texts.append(self.name) or real_load(self))
    one = run_audit(work, out, workers=1, recount_fraction=0)
    threads = run_audit(work, out, workers=2, recount_fraction=0)  # (processes: test_packed_shards_and_audit)
    # every shard's conversations (their digests, in its samples rows) from the staged files, none by a query of its own
    assert sorted(s for q, s in read if q == "samples") == sorted([p.name for p in shards] * 2)
    # their texts only for the shard whose packed conversation is not the manifest's, once per audit
    assert texts == [shards[1].name] * 2
    stale = [(v["shard"], v["sample_id"]) for v in one.violations if v["check"] == "stale_conversation"]
    assert stale == [(shards[1].name, changed)]
    assert {v["check"] for v in one.violations} == {"stale_conversation"}
    assert (threads.violations, threads.stats) == (one.violations, one.stats)
    # in worker processes (their DuckDB held to 256MB: the texts streamed), the same audit
    processes = run_audit(work, out, workers=2, parallel_min_bytes=0, recount_fraction=0)
    assert (processes.violations, processes.stats) == (one.violations, one.stats)
    with store.connect(work, read_only=True) as con:  # each shard's own query (no staged rows): the same audit
        config = PlanInfo.load(con).config
        alone, gathered = (audit_mod.audit(con, out, config, work=w, workers=1) for w in (None, work))
        assert (alone.violations, alone.stats) == (gathered.violations, gathered.stats)
        assert alone.violations == one.violations
        # what a worker holds per shard, from the staged files (read as Arrow columns) as from its own queries
        names = [p.name for p in shards]
        with store.staged(work, expected.AUDIT_ROWS, names, con) as rows:
            for name in names:
                assert expected.shard_expectations(con, name, rows) == expected.shard_expectations(con, name)


# the samples rows as the audit staged them before session 51: through the `samples` view (which joins every
# sample's counts once more for a status the audit does not read), the manifest's rows the join's build side
_SAMPLES_BY_VIEW = """SELECT p.output_shard, s.sample_id, t.total_tokens, s.media_type, t.n_images + t.n_videos,
                             t.vision_tokens, s.json_member, s.media_members, s.extra_members,
                             unhex(sha256(s.conversation)), length(s.conversation)
                      FROM pack_plan p JOIN pack_members pm USING (pack_id) JOIN samples s USING (sample_id)
                      LEFT JOIN token_lengths t USING (sample_id) WHERE {shards}"""


def test_a_workers_expectations_are_the_samples_views_rows_each_name_held_once(dataset, tmp_path):
    """The staged samples rows (planned samples joined to their counts, then to the manifest) are the rows the
    `samples` view gave, staged or per shard; a worker holds each media type as one string and a sample's
    json member name as one string for its row and its member (310k samples per output shard at 10M)."""
    work, out = tmp_path / "work", tmp_path / "out"
    _packed(dataset, work, out)
    names = sorted(p.name for p in out.glob("*.tar"))
    assert len(names) >= 3
    with store.connect(work, read_only=True) as con:
        by_view = {**expected.AUDIT_ROWS, "samples": _SAMPLES_BY_VIEW}
        for name in names:
            assert sorted(store.shard_rows(con, expected.AUDIT_ROWS, "samples", name)) == \
                sorted(store.shard_rows(con, by_view, "samples", name))
        with store.staged(work, expected.AUDIT_ROWS, names, con) as rows, \
                store.staged(work, by_view, names, con) as view_rows:
            for name in names:
                _, samples, members = expected.shard_expectations(con, name, rows)
                assert (samples, members) == expected.shard_expectations(con, name, view_rows)[1:]
                assert len({id(r[1]) for r in samples.values()}) == len({r[1] for r in samples.values()})
                json_names = {sid: r[4] for sid, r in samples.items() if r[4]}
                assert json_names
                for sid, member in members:
                    if member == json_names.get(sid):
                        assert member is json_names[sid]


def test_the_audit_checks_and_stages_under_a_lower_duckdb_limit_then_puts_the_catalogs_back(dataset, tmp_path,
                                                                                            monkeypatch):
    """At 10M samples the plan's checks and the staging each filled the catalog's 1GB beside the side helpers'
    recount (the audit stage's peak): they run held to `audit.BESIDE_MEMORY`, or to the limit the user set
    (store.MEMORY_ENV); the audit's later queries have the catalog's limit again, and the audit passes."""
    work, out = tmp_path / "work", tmp_path / "out"
    _packed(dataset, work, out)
    checks, staged, counts, seen = audit_mod.check_plan, store.staged, audit_mod.per_shard, []

    def limit(con) -> str:
        return con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]

    def check_plan(con, config):
        seen.append(limit(con))
        return checks(con, config)

    def spy(work, queries, shards, con=None, **kw):
        seen.append(limit(con))
        return staged(work, queries, shards, con, **kw)

    def per_shard(con):
        seen.append(limit(con))
        return counts(con)

    def as_duckdb_says(*limits: str) -> list[str]:
        with store.connect(work, read_only=True) as con:
            return [limit(con.execute(f"SET memory_limit = '{m}'")) for m in limits]

    monkeypatch.setattr(audit_mod, "check_plan", check_plan)
    monkeypatch.setattr(store, "staged", spy)
    monkeypatch.setattr(audit_mod, "per_shard", per_shard)
    assert run_audit(work, out).ok
    assert seen == as_duckdb_says(audit_mod.BESIDE_MEMORY, audit_mod.BESIDE_MEMORY, "1GB")
    monkeypatch.setenv(store.MEMORY_ENV, "2GB")
    seen.clear()
    assert run_audit(work, out, scope="all", digests=False).ok
    assert seen == as_duckdb_says("2GB", "2GB", "2GB")  # the user's limit, while checking and staging too


def test_one_output_shards_expectations_read_only_its_sources_catalog_files(tmp_path, monkeypatch):
    """An output shard read alone (not staged: a rerun's new shard) gets its expectations from the manifest's and
    counts' files of the source shards its samples come from only, the same as over the whole catalog."""
    work, shards = appended_catalog(tmp_path)
    with store.connect(work, read_only=True) as con:
        sources = {}
        for name, src in con.execute("SELECT DISTINCT output_shard, shard FROM lineage").fetchall():
            sources.setdefault(name, set()).add(src)
        spies = {name: SqlSpy(con) for name in sources}
        got = {name: expected.shard_expectations(spies[name], name) for name in sorted(sources)}
        monkeypatch.setattr(expected, "source_folders", lambda con, name: None, raising=False)  # views read whole
        assert got == {name: expected.shard_expectations(con, name) for name in sorted(sources)}
    assert any(len(s) < len(shards) for s in sources.values())
    for name, spy in spies.items():
        folders = {f.as_posix() for s in sources[name]
                   for f in (store.manifest_dir(work, s), store.token_dir(work, "qwen3-vl", s))}
        read = [f for sql in spy.sql for f in re.findall(r"'([^']*\.parquet)'", sql)]
        assert read and {os.path.dirname(f) for f in read} <= folders, name
