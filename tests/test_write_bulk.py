"""The copy writer's bulk parts against what they stand for: the tar headers built together against one by one
(and tarfile), a .json record copied as it is only where the scan found it in json.dumps's form, and a
catalog of older manifests (no such flag) written the same bytes by parsing and dumping every record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import chat, image_bytes, write_tar

from pack_assets.core import store, tario
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import ScanOptions, run_manifest
from pack_assets.core.write import run_write
from pack_assets.core.write import shard as write_shard_mod

PROFILE = load_profile("qwen3-vl")


def test_headers_built_together_equal_each_built_alone():
    names = ["p00000001.json", "p00000001.s000_00.jpg", "x" * 99, "a", "p00000002.s013_x02", "p.1.s000_00.png"]
    sizes = [0, 123_456, 8**11 - 1, 1, 512, 7]
    rows = tario.header_rows(names, sizes)
    assert [r.tobytes() for r in rows] == [tario.member_header(n, s) for n, s in zip(names, sizes)]
    assert [r.tobytes() for r in rows] == [tario._tarfile_header(n, s) for n, s in zip(names, sizes)]
    # what only tarfile's PAX headers hold: no rows, the caller builds those one by one
    assert tario.header_rows(["ü.json", "a"], [5, 6]) is None
    assert tario.header_rows(["y" * 100], [5]) is None
    assert tario.header_rows(["big.mp4"], [8**11]) is None


RECORD = {"conversations": chat("Wïth ünïcode / \"quotes\"\n\ttab", "An answer \u2028 😀", images=1)["conversations"],
          "score": 0.25, "id": 7}
FORMS = {  # key -> the record's text, and whether it is json.dumps(..., ensure_ascii=False)'s own
    "exact": (json.dumps(RECORD, ensure_ascii=False), True),
    "ascii": (json.dumps(RECORD), False),  # \u escapes
    "indented": (json.dumps(RECORD, indent=1, ensure_ascii=False), False),
    "compact": (json.dumps(RECORD, separators=(",", ":"), ensure_ascii=False), False),
    "float": (json.dumps(RECORD, ensure_ascii=False).replace('"score": 0.25', '"score": 0.250'), False),
    "twice": (json.dumps(RECORD, ensure_ascii=False).replace('"id": 7', '"id": 6, "id": 7'), False),  # a key twice
}


@pytest.fixture
def forms(tmp_path) -> tuple[Path, Path]:
    members = []
    for key, (text, _) in FORMS.items():
        members += [(f"{key}.json", text), (f"{key}.jpg", image_bytes(40, 30))]
    write_tar(tmp_path / "in" / "s0.tar", members)
    inp, work = tmp_path / "in", tmp_path / "work"
    run_manifest(inp, work, "s0", ScanOptions(hash_members=True))
    run_token_lengths(work, "s0", PROFILE)
    run_plan(work, ["s0"], PlanConfig(max_len=8192), PROFILE)
    return inp, work


def _written(inp: Path, work: Path, out: Path, monkeypatch) -> tuple[dict, int]:
    """Each sample's record as its pack document holds it, and how many records the writer dumped again."""
    parsed = []
    real = write_shard_mod.dumps  # (the writer's shards dump nothing else)
    monkeypatch.setattr(write_shard_mod, "dumps", lambda v: (parsed.append(v), real(v))[1])
    run_write(work, inp, out, workers=1)
    monkeypatch.setattr(write_shard_mod, "dumps", real)
    sources = {}
    for shard in sorted(out.glob("*.tar")):
        for _, parts in tario.iter_pack_parts(shard):
            doc = parts["json"]
            assert doc == json.dumps(json.loads(doc), ensure_ascii=False).encode()  # the writer's layout, as ever
            sources.update({s["sample_id"]: s["source"] for s in json.loads(doc)["samples"]})
    return sources, len(parsed)


def test_only_records_in_json_dumps_form_are_copied_as_they_are(forms, tmp_path, monkeypatch):
    inp, work = forms
    with store.connect(work, read_only=True) as con:
        flags = dict(con.execute("SELECT key, record_exact FROM manifest_samples").fetchall())
    assert flags == {key: exact for key, (_, exact) in FORMS.items()}
    sources, parsed = _written(inp, work, tmp_path / "out", monkeypatch)
    assert sources == {f"s0/{key}": json.loads(text) for key, (text, _) in FORMS.items()}
    assert parsed == sum(not exact for _, exact in FORMS.values())


def test_a_catalog_of_older_manifests_writes_the_same_bytes(forms, tmp_path, monkeypatch):
    """Manifests from before `record_exact` (format 3) have no such column: every record is parsed and
    dumped again, and the shards are the same bytes."""
    inp, work = forms
    _, parsed = _written(inp, work, tmp_path / "new", monkeypatch)
    with store.connect(work) as con:
        (sql,) = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'manifest_samples'").fetchone()
        con.execute(sql.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1).replace(
            "SELECT *", "SELECT * EXCLUDE (record_exact)", 1))
        assert "record_exact" not in con.sql("SELECT * FROM manifest_samples LIMIT 0").columns
    _, parsed_old = _written(inp, work, tmp_path / "old", monkeypatch)
    assert parsed_old == len(FORMS) > parsed
    new = {p.name: p.read_bytes() for p in (tmp_path / "new").glob("*.tar")}
    assert new and new == {p.name: p.read_bytes() for p in (tmp_path / "old").glob("*.tar")}


def test_a_job_prepares_its_next_shard_while_a_thread_syncs_one_and_stops_at_a_failure(monkeypatch):
    """The overlap of `copy._overlapped`: shard b is prepared while a's fsync runs in a thread (a's sync waits
    for it: run one after the other, it would time out), b's first byte is written only once a is in place,
    results come back in order, and once a shard fails no later one is written (c is prepared at most)."""
    import threading

    from pack_assets.core.write import copy as copy_mod

    prepared = {n: threading.Event() for n in "abc"}
    events: list[str] = []

    def loader(group):
        for name in group:
            prepared[name].set()
            yield name

    def begin(out_dir, job, context):
        events.append(f"write {job}")
        if job == context.get("fail"):
            raise OSError("disk gone")
        return job

    def end(job):
        if job == "a":
            assert prepared["b"].wait(10), "b was not prepared while a was synced"
        events.append(f"sync {job}")
        return job.upper()

    monkeypatch.setattr(copy_mod, "begin_shard", begin)
    monkeypatch.setattr(copy_mod, "end_shard", end)
    assert copy_mod._write_group(("out", list("abc"), {}, loader)) == ["A", "B", "C"]
    assert events == ["write a", "sync a", "write b", "sync b", "write c", "sync c"]
    events.clear()
    for e in prepared.values():
        e.clear()
    with pytest.raises(OSError, match="disk gone"):
        copy_mod._write_group(("out", list("abc"), {"fail": "b"}, loader))
    assert events == ["write a", "sync a", "write b"]
