"""`pack-assets` commands as a user runs them."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pack_assets.cli import main
from pack_assets.core import filedigest


@pytest.fixture
def ran(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))  # restored after the test
    args = ["run", "--input", str(dataset), "--max-len", "1500", "--work", str(tmp_path / "work"),
            "--output", str(tmp_path / "out"), "--dagster-home", str(tmp_path / "dh"), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    return args, summary, tmp_path


def test_run_through_dagster_prints_a_summary_reruns_incrementally_and_force_rescans_every_shard(ran, capsys):
    """The summary of a run; a rerun keeps every unchanged shard (its files untouched); --force does what its
    help says: every shard scanned and counted again (its files rewritten), and the result unchanged. (One test:
    the rerun and the forced run start from the same first run.)"""
    args, s, tmp = ran
    assert s["samples"] == 26 and s["rejected"] == 2 and s["violations"] == 0
    assert s["packed"] + s["dropped"] + s["rejected"] == s["samples"]
    assert s["packs"] >= s["lower_bound"] and s["shard_runs"] == 2
    assert (tmp / "dh" / "history").exists()  # runs recorded in the instance
    work = tmp / "work"
    files = [work / "manifest" / "part-000" / "samples.parquet",
             work / "token_lengths" / "qwen3-vl" / "part-001" / "token_lengths.parquet"]
    before = [f.stat().st_mtime_ns for f in files]
    assert main(args) == 0  # unchanged shards: kept
    again = json.loads(capsys.readouterr().out)
    assert again["shard_runs"] == 0 and again["packs"] == s["packs"]
    assert [f.stat().st_mtime_ns for f in files] == before
    assert main([*args, "--force"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["shard_runs"] == 2 and forced["packs"] == s["packs"] and forced["violations"] == 0
    assert all(f.stat().st_mtime_ns != b for f, b in zip(files, before))


def test_the_default_incremental_rerun_vouches_for_every_kept_shard_by_digests_it_took(ran, capsys, monkeypatch):
    """`run --incremental` with the default audit: every unchanged output shard hashed by this run while it planned and
    wrote (`filedigest.EarlyDigests`), each digest the audit takes one of a file nobody wrote since and
    equal to the last clean audit's."""
    args, s, tmp = ran
    taken = {}
    digest = filedigest.EarlyDigests.digest

    def spy(self, path):
        taken[path.name] = digest(self, path)
        return taken[path.name]

    monkeypatch.setattr(filedigest.EarlyDigests, "digest", spy)
    read, plain = [], filedigest.identified_digest

    def reading(path, *a, **k):
        read.append(path.name)
        return plain(path, *a, **k)

    monkeypatch.setattr(filedigest, "identified_digest", reading)
    assert main(args + ["--incremental"]) == 0
    again = json.loads(capsys.readouterr().out)
    shards = sorted(p.name for p in (tmp / "out").glob("*.tar"))
    assert again["verdict"] == "PASS" and again["output_shards_written"] == 0
    assert again["output_shards_hashed"] == again["output_shards"] == len(shards) > 0
    assert sorted(n for n, d in taken.items() if d) == shards
    # started before Dagster's import and asked again by the plan: each shard read once all the same
    assert sorted(n for n in read if n.endswith(".tar")) == shards


def test_lookup_and_verify(ran, capsys):
    _, _, tmp = ran
    work, out = str(tmp / "work"), str(tmp / "out")
    assert main(["lookup", "part-001/s1_004", "--work", work, "--json"]) == 0
    sample = json.loads(capsys.readouterr().out)
    assert main(["lookup", sample["pack_id"], "--work", work, "--json"]) == 0
    pack = json.loads(capsys.readouterr().out)
    assert "part-001/s1_004" in [s["sample_id"] for s in pack["sources"]]
    assert main(["lookup", "no/such", "--work", work]) == 2
    capsys.readouterr()
    assert main(["verify", "--work", work, "--output", out]) == 0
    assert capsys.readouterr().out.startswith("OK")
    shard = Path(out) / sample["output_shard"]
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tf:
        ti = next(t for t in tf.getmembers() if not t.name.endswith(".json"))
    data[ti.offset_data] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", "--work", work, "--output", out, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["violations"][0]["check"] == "media_hash_mismatch"


def test_plan_and_simulate_on_a_lengths_file(tmp_path, capsys):
    lengths = np.random.default_rng(0).integers(1, 3000, 5000)
    np.save(tmp_path / "l.npy", lengths)
    (tmp_path / "l.txt").write_text("\n".join(map(str, lengths)))
    assert main(["plan", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["plan", "--lengths", str(tmp_path / "l.txt"), "--max-len", "4096", "--json",
                 "--out", str(tmp_path / "packs.txt")]) == 0
    b = json.loads(capsys.readouterr().out)
    for k in ("packs", "lower_bound", "efficiency", "dropped", "seconds"):
        assert k in a
    assert a["packs"] == b["packs"] and a["packs"] - a["lower_bound"] <= 2
    assert len((tmp_path / "packs.txt").read_text().split()) == 5000
    assert main(["simulate", "--lengths", str(tmp_path / "l.npy"), "--max-len", "2048,4096", "--json",
                 "--algorithms", "bfd,next_fit,window_8", "--global-batch", "64",
                 "--plots", str(tmp_path / "plots")]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = res["results"]
    assert {(r["max_len"], r["algorithm"]) for r in rows} == {(m, a) for m in (2048, 4096)
                                                              for a in ("bfd", "next_fit", "window_8")}
    assert all(r["steps_per_epoch"] == -(-r["packs"] // 64) for r in rows)
    assert res["recommended_max_len"] in (2048, 4096)
    assert all(Path(p).stat().st_size > 0 for p in res["plots"].values())
    assert main(["plan", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--json",
                 "--max-samples-per-pack", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["max_samples_per_pack"] <= 2


def test_plan_and_simulate_pack_what_context_parallelism_pads(tmp_path, capsys):
    # run plans on each sub-sample padded to 2*cp: the planner commands must not promise packs that overflow
    lengths = np.random.default_rng(1).integers(1, 700, 3000)
    np.save(tmp_path / "l.npy", lengths)
    assert main(["plan", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--json", "--cp-size", "4",
                 "--out", str(tmp_path / "packs.npy")]) == 0
    s = json.loads(capsys.readouterr().out)
    assignment = np.load(tmp_path / "packs.npy")
    padded = -(-lengths // 8) * 8
    per_pack = np.bincount(assignment[assignment >= 0], weights=padded[assignment >= 0])
    assert per_pack.max() <= 4096 and s["packs"] == len(per_pack) and s["lower_bound"] == -(-padded.sum() // 4096)
    assert s["sample_multiple"] == 8
    assert main(["plan", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lower_bound"] < s["lower_bound"]  # padding costs room
    assert main(["simulate", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--json",
                 "--algorithms", "bfd", "--cp-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["packs"] == s["packs"]
    assert main(["plan", "--lengths", str(tmp_path / "l.npy"), "--max-len", "4096", "--tp-size", "2"]) == 2
    assert "sequence parallelism" in capsys.readouterr().err


def test_count_records_outside_shards(tmp_path, capsys):
    from conftest import image_bytes

    (tmp_path / "img.jpg").write_bytes(image_bytes(640, 480))
    recs = [{"id": "a", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                          {"from": "gpt", "value": "A box."}],
             "image": "img.jpg"},
            {"id": "b", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"id": "c", "image": "missing.jpg",
             "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    assert main(["count", "--input", str(tmp_path / "d.jsonl"), "--media-root", str(tmp_path)]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["image_tokens"] == (480 // 32) * (640 // 32)
    assert rows[0]["total_tokens"] == rows[0]["text_tokens"] + rows[0]["image_tokens"]
    assert rows[1]["image_tokens"] == 0 and rows[1]["total_tokens"] > 5
    assert rows[2]["error"] == "missing_media"


def test_errors_are_clear_not_tracebacks(tmp_path, capsys):
    assert main(["run", "--input", str(tmp_path / "nope"), "--max-len", "100",
                 "--dagster-home", str(tmp_path / "dh")]) == 2
    assert "does not exist" in capsys.readouterr().err
