"""The writer touches only its own files; overlapping folders are refused; one run per work folder at a
time; output files get the umask's mode (issues #16 items 2 and 9, #22 item 1)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import chat, image_bytes, small_dataset, write_tar

from pack_assets.cli import main
from pack_assets.core import owned, safety, store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths, token_lengths_are_current
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.write import run_write

PROFILE = load_profile("qwen3-vl")


def pack(inp: Path, work: Path, out: Path, packs_per_shard: int = 2, workers: int = 1) -> dict:
    """The whole pipeline in this process (the stages the assets call)."""
    shards = list(store.find_shards(inp))
    for s in shards:
        run_manifest(inp, work, s)
        run_token_lengths(work, s, PROFILE)
    run_plan(work, shards, PlanConfig(max_len=1500, max_packs_per_shard=packs_per_shard), PROFILE)
    w = run_write(work, inp, out, workers=workers)
    result = run_audit(work, out)
    assert result.ok, result.violations
    return w


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# --- item 2: only the tool's own files are deleted or overwritten ---------------------------------------

def test_user_files_survive_a_rerun_that_shrinks_the_plan(tmp_path):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    first = pack(inp, work, out, packs_per_shard=1)
    shards = sorted(p.name for p in out.glob("*.tar"))
    assert len(shards) >= 3
    user_tar = write_tar(out / "my-notes.tar", [("a.txt", "mine")])
    notes = out / "notes.txt"
    notes.write_text("keep me")
    (out / ".nv-meta" / "my-config.yaml").write_text("mine: true\n")
    # a recorded shard the user has since replaced with a file of their own is theirs now
    (out / shards[-1]).write_bytes(user_tar.read_bytes())
    kept = {p: digest(p) for p in (user_tar, notes, out / shards[-1], out / ".nv-meta" / "my-config.yaml")}

    again = pack(inp, work, out, packs_per_shard=1000)  # one output shard: the others are stale
    assert again.shards == 1 and first.shards == len(shards)
    assert {p: digest(p) for p in kept} == kept
    record = owned.load(out)
    assert set(p.name for p in out.glob("*.tar")) == {"packed-000000.tar", "my-notes.tar", shards[-1]}
    assert "my-notes.tar" not in record and shards[-1] not in record and "packed-000000.tar" in record
    assert not [s for s in shards[1:-1] if (out / s).exists() or (out / f"{s}.idx").exists()]  # stale: deleted
    assert {"my-notes.tar", "notes.txt", shards[-1], ".nv-meta/my-config.yaml"} <= set(again.foreign_files)


def test_a_file_the_tool_did_not_write_is_never_overwritten(tmp_path):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    theirs = write_tar(out / "packed-000000.tar", [("x.txt", "a user's shard with the name the plan uses")])
    before = digest(theirs)
    with pytest.raises(owned.ForeignFiles, match="packed-000000.tar"):
        pack(inp, work, out)
    assert digest(theirs) == before and sorted(p.name for p in out.iterdir()) == ["packed-000000.tar"]


def test_nv_meta_the_tool_did_not_write_or_that_was_edited_is_refused(tmp_path):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    (out / ".nv-meta").mkdir(parents=True)
    (out / ".nv-meta" / "dataset.yaml").write_text("__module__: megatron.energon\n__class__: MyOwnDataset\n")
    with pytest.raises(owned.ForeignFiles, match="energon prepare"):
        pack(inp, work, out)
    assert "MyOwnDataset" in (out / ".nv-meta" / "dataset.yaml").read_text()
    (out / ".nv-meta" / "dataset.yaml").unlink()
    pack(inp, work, out)
    edited = "__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors: {x: 1}\n"
    (out / ".nv-meta" / "dataset.yaml").write_text(edited)  # a hand edit after the run
    with pytest.raises(owned.ForeignFiles, match="dataset.yaml"):
        pack(inp, work, out)
    assert (out / ".nv-meta" / "dataset.yaml").read_text() == edited


def test_output_from_before_the_record_is_adopted_by_its_meta(tmp_path):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    pack(inp, work, out)
    files = {p: digest(p) for p in out.rglob("*") if p.is_file() and p.name != owned.RECORD}
    (out / owned.RECORD).unlink()  # as written by a version without the record
    (out / ".nv-meta" / ".info.yaml").write_text("shard_counts:\n  packed-000000.tar: 1\n")  # an early version's
    pack(inp, work, out)
    assert not (out / ".nv-meta" / ".info.yaml").exists()
    assert {p: digest(p) for p in files if p.name != "index.sqlite"} == \
        {p: h for p, h in files.items() if p.name != "index.sqlite"}
    assert set(owned.load(out)) == {p.relative_to(out).as_posix() for p in files}


def test_only_the_writers_exact_temp_names_are_removed(tmp_path):
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    pack(inp, work, out)
    ours = [out / ".packed-000000.tar.tmp-ab12cd_9", out / ".nv-meta" / ".index.sqlite.tmp-zz00yy11-journal",
            out / ".packed-000001.tar.idx.tmp-0a1b2c3d"]
    theirs = [out / ".notes.txt.tmp-ab12cd34", out / ".packed-000000.tar.tmp-backup", out / ".cache.tmp-x",
              out / ".nv-meta" / ".mine.tmp-abcdefgh"]
    for p in ours + theirs:
        p.write_text("left by someone")
    pack(inp, work, out)
    assert [p for p in ours if p.exists()] == [] and all(p.exists() for p in theirs)


@pytest.mark.parametrize("case", ["out=in", "out in in", "in in out", "work=out", "work in out", "symlink"])
def test_overlapping_folders_are_refused(tmp_path, case):
    inp = tmp_path / "data"
    inp.mkdir()
    inp_link = tmp_path / "link"
    inp_link.symlink_to(inp)
    work, out = {"out=in": (tmp_path / "w", inp), "out in in": (tmp_path / "w", inp / "packed"),
                 "in in out": (tmp_path / "w", tmp_path), "work=out": (tmp_path / "o", tmp_path / "o"),
                 "work in out": (tmp_path / "o" / "work", tmp_path / "o"),
                 "symlink": (tmp_path / "w", inp_link / "packed")}[case]
    with pytest.raises(safety.UnsafePaths):
        safety.check_paths(inp, work, out)


def test_separate_folders_and_output_inside_work_are_accepted(tmp_path):
    safety.check_paths(tmp_path / "in", tmp_path / "work", tmp_path / "packed")
    safety.check_paths(tmp_path / "in", tmp_path / "work", tmp_path / "work" / "packed")
    safety.check_paths(tmp_path / "in", tmp_path / "in-work", tmp_path / "in-packed")  # a prefix is not a parent


@pytest.mark.parametrize("where", ["output=input", "work inside output"])
def test_cli_refuses_overlapping_folders_with_exit_2_before_any_write(tmp_path, capsys, where):
    inp = small_dataset(tmp_path / "in")
    before = {p.name: digest(p) for p in inp.iterdir()}
    work, out = (tmp_path / "work", inp) if where == "output=input" else (tmp_path / "o" / "w", tmp_path / "o")
    code = main(["run", "--input", str(inp), "--max-len", "1500", "--work", str(work), "--output", str(out),
                 "--dagster-home", str(tmp_path / "dh")])
    err = capsys.readouterr().err
    assert code == 2 and "error: the " in err and ("is the input folder" in err or "inside the output" in err)
    assert {p.name: digest(p) for p in inp.iterdir()} == before
    assert not work.exists() and not (tmp_path / "dh").exists()


@pytest.mark.parametrize("case", ["dagster home under a file", "work is a file", "output under a file",
                                  "recorded shard now the user's file", "recorded shard now a folder"])
def test_cli_refuses_an_unusable_folder_in_one_line_before_the_lock(tmp_path, capsys, monkeypatch, case):
    """Folders that cannot be used are refused by the preflight (exit 2, one line): no lock, no scan."""
    from pack_assets.runner import command

    inp, work, out, home = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out", tmp_path / "dh"
    (tmp_path / "afile").write_text("a user's file")
    if case.startswith("recorded"):
        pack(inp, work, out)
        shard = out / "packed-000000.tar"
        shard.unlink()
        if case.endswith("folder"):
            shard.mkdir()
        else:
            write_tar(shard, [("x.txt", "mine now")])
    else:
        home, work, out = {"dagster home under a file": (tmp_path / "afile" / "dh", work, out),
                           "work is a file": (home, tmp_path / "afile", out),
                           "output under a file": (home, work, tmp_path / "afile" / "out")}[case]
    monkeypatch.setattr(command, "run", lambda *a, **k: pytest.fail("the run started"))
    code = main(["run", "--input", str(inp), "--max-len", "1500", "--work", str(work), "--output", str(out),
                 "--dagster-home", str(home)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert ("packed-000000.tar" if case.startswith("recorded") else "is a file, not a folder") in err


def test_preflight_trusts_recorded_shards_as_the_writer_left_them_without_reading_them(tmp_path, monkeypatch):
    from pack_assets.core.preflight import preflight
    from pack_assets.core.settings import Settings

    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    pack(inp, work, out)
    reads = []
    monkeypatch.setattr(owned, "first_pack_meta", lambda path: reads.append(path.name) or {})
    settings = Settings(input_dir=str(inp), work_dir=str(work), output_dir=str(out))
    assert preflight(settings) and reads == []  # a first pack read would have said "not ours"
    os.utime(out / "packed-000000.tar")  # touched since: read, and no longer ours (the stand-in says so)
    with pytest.raises(owned.ForeignFiles, match="packed-000000.tar"):
        preflight(settings)
    assert reads == ["packed-000000.tar"]


def test_writer_claims_recorded_shards_as_it_left_them_without_reading_them(tmp_path, monkeypatch):
    """The writer's claim of its output folder (checked again after the preflight) reads no shard the writer's
    record shows as it left it; a recorded shard the user replaced with a file of their own is still read, and
    refused, with nothing written."""
    inp, work, out = small_dataset(tmp_path / "in"), tmp_path / "work", tmp_path / "out"
    pack(inp, work, out)
    shards = sorted(p.name for p in out.glob("*.tar"))
    reads = []
    monkeypatch.setattr(owned, "first_pack_meta", lambda path: reads.append(path.name) or {})
    w = run_write(work, inp, out, workers=1)
    assert w.skipped == len(shards) and reads == []  # a first pack read would have said "not ours"
    monkeypatch.undo()
    user = write_tar(tmp_path / "mine.tar", [("x.txt", "mine now")])
    (out / shards[0]).write_bytes(user.read_bytes())  # the user's own file under the shard's name
    before = {p.name: digest(p) for p in out.rglob("*") if p.is_file()}
    with pytest.raises(owned.ForeignFiles, match=shards[0]):
        run_write(work, inp, out, workers=1)
    assert {p.name: digest(p) for p in out.rglob("*") if p.is_file()} == before


# --- item 9: one run per work folder; concurrent runs of one shard take turns ------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pack_assets.core import safety
    with safety.work_lock(sys.argv[1], "test holder"):
        print("held", flush=True)
        sys.stdin.readline()
""")


@pytest.fixture
def holder(tmp_path):
    """Another process holding the work folder's lock; killed (not released) at the end, as a crash."""
    procs = []

    def start(work: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_second_cli_run_refuses_while_the_lock_is_held_and_a_crash_releases_it(tmp_path, capsys, holder):
    inp, work = small_dataset(tmp_path / "in"), tmp_path / "work"
    proc = holder(work)
    args = ["run", "--input", str(inp), "--max-len", "1500", "--work", str(work), "--output", str(tmp_path / "out"),
            "--dagster-home", str(tmp_path / "dh"), "--json"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"pid {proc.pid} (test holder, since " in err and "in use" in err
    assert not (tmp_path / "out").exists() and not (work / "manifest").exists()
    proc.kill()  # a crash: flock dies with its process
    proc.wait()
    assert main(args) == 0
    capsys.readouterr()
    with safety.work_lock(work, "after the run", wait=0):  # released by the run (taken again at once)
        pass
    check = subprocess.run([sys.executable, "-c", "import sys; from pack_assets.core import safety\n"
                            "with safety.work_lock(sys.argv[1], 'x', wait=0): pass", str(work)],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert check.returncode == 0  # another process can take it too


def test_a_dagster_step_waits_then_fails_clearly_while_another_run_holds_the_lock(tmp_path, holder, monkeypatch):
    import dagster as dg

    from pack_assets.defs.assets import pack_plan
    from pack_assets.defs.resources import PackSettings

    work = tmp_path / "work"
    proc = holder(work)
    monkeypatch.setenv(safety.LOCK_WAIT_ENV, "0.5")
    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize([pack_plan], raise_on_error=False, instance=instance, resources={"settings": PackSettings(
        input_dir=str(small_dataset(tmp_path / "in")), work_dir=str(work), output_dir=str(tmp_path / "out"))})
    assert not res.success
    failure = next(ev for ev in res.all_events if ev.is_step_failure).step_failure_data.error
    message = (failure.cause or failure).message
    assert f"pid {proc.pid} (test holder, since" in message and "gave up after 0.5 s" in message
    logged = [e.user_message for e in instance.all_logs(res.run_id)]
    assert any("in use by" in m and "waiting up to 0.5 s" in m for m in logged)


def test_the_work_lock_is_reentrant_within_a_process(tmp_path):
    with safety.work_lock(tmp_path, "outer"):
        with safety.work_lock(tmp_path, "inner", wait=0):
            pass
        # still held by this process after the inner exit: another process is refused
        r = subprocess.run([sys.executable, "-c", "import sys; from pack_assets.core import safety\n"
                            "with safety.work_lock(sys.argv[1], 'x', wait=0): pass", str(tmp_path)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert r.returncode != 0 and f"pid {os.getpid()} (outer" in r.stderr


def _scan_and_count(inp: str, work: str, shard: str) -> None:
    run_manifest(Path(inp), Path(work), shard, force=True)
    run_token_lengths(Path(work), shard, PROFILE, force=True)


def test_two_concurrent_runs_of_one_shard_both_finish_with_a_correct_manifest(tmp_path):
    members = []
    for j in range(300):
        rec = {**chat(f"question {j} " * 20, "answer", images=1), "image": "png"}
        members.append((f"k{j:04d}.json", json.dumps(rec)))
        members.append((f"k{j:04d}.png", image_bytes(16 + j % 50, 16, "PNG")))
    inp = tmp_path / "in"
    write_tar(inp / "big.tar", members)
    ref = tmp_path / "ref"
    _scan_and_count(str(inp), str(ref), "big")
    work = tmp_path / "work"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_scan_and_count, args=(str(inp), str(work), "big")) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    import pyarrow.parquet as pq

    for d_ref, d in [(store.manifest_dir(ref, "big"), store.manifest_dir(work, "big")),
                     (store.token_dir(ref, PROFILE.name, "big"), store.token_dir(work, PROFILE.name, "big"))]:
        for f in ("samples.parquet", "members.parquet", "token_lengths.parquet"):
            if (d_ref / f).exists():
                assert pq.read_table(d / f).to_pylist() == pq.read_table(d_ref / f).to_pylist()
    assert token_lengths_are_current(work, "big", PROFILE)
    assert not [p for p in work.rglob(".*.tmp-*")] and not [p for p in work.rglob(".*.old-*")]


# --- #22 item 1: every output file and folder gets the umask's mode ----------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_and_folder_gets_the_mode_the_umask_gives(tmp_path, umask):
    old = os.umask(umask)
    try:
        inp, work, out = small_dataset(tmp_path / "in", n_shards=3), tmp_path / "work", tmp_path / "out"
        pack(inp, work, out, workers=2)
        from pack_assets.core.convert import convert

        records = tmp_path / "records.jsonl"
        records.write_text(json.dumps({"id": "r1", **chat()}) + "\n")
        convert([records], tmp_path / "converted", [])
    finally:
        os.umask(old)
    wrong = []
    for root in (work, out, tmp_path / "converted"):
        for p in [root, *root.rglob("*")]:
            want = (0o777 if p.is_dir() else 0o666) & ~umask
            if stat.S_IMODE(p.stat().st_mode) != want:
                wrong.append(f"{p.relative_to(tmp_path)} {oct(stat.S_IMODE(p.stat().st_mode))} != {oct(want)}")
    assert not wrong
    assert any(out.glob("*.tar")) and any((work / "manifest").iterdir()) and any((tmp_path / "converted").glob("*.tar"))
