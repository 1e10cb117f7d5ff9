"""The machine's faults made for real: a full tmpfs under the output and the work folder, a read-only mount,
folders this user may not write, I/O errors injected by libfiu (`fiu-utils`); and the folder fsynced after
every rename. Mounting needs root (CI runs as root: .ci/run); without it these tests skip, and under
PACK_ASSETS_CI=1 they fail instead."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import small_dataset
from io_fault_harness import draw, faulty_runs, fiu_available, judge, snapshot, stages, temp_leftovers

from pack_assets.cli import main
from pack_assets.core import faults


def _unavailable(reason: str) -> None:
    if os.environ.get("PACK_ASSETS_CI") == "1":
        pytest.fail(f"PACK_ASSETS_CI=1, yet {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False):
    """A tmpfs of ``size`` mounted on ``path`` for the block; `remount(size)` grows it."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        _unavailable(f"cannot mount a tmpfs ({done.stderr.strip()}): these tests need root")
    try:
        yield lambda new: subprocess.run(["mount", "-o", f"remount,size={new}", str(path)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A dataset and its clean run's catalog tables, output files and plan (folders named work/ and out/, as
    every run here names them: wids-index.json holds the output folder's name)."""
    root = tmp_path_factory.mktemp("faults")
    inp = small_dataset(root / "in", n_shards=3, per_shard=10)
    assert stages(inp, root / "clean" / "work", root / "clean" / "out", 1) == 0
    return inp, snapshot(root / "clean" / "work", root / "clean" / "out")


def _cli(inp: Path, work: Path, out: Path, capsys) -> tuple[int, list[str]]:
    code = main(["run", "--input", str(inp), "--work", str(work), "--output", str(out), "--max-len", "1500"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_read_only_output_or_work_folder_is_refused_before_any_scan(clean, tmp_path, capsys):
    inp, _ = clean
    ro = tmp_path / "ro"
    with tmpfs(ro, "1m") as _:
        (ro / "out").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        for work, out, named in ((tmp_path / "work", ro / "out", f"the output folder {ro / 'out'} is on a read-only"),
                                 (ro / "work", tmp_path / "out", f"the work folder {ro / 'work'} cannot be made: {ro} "
                                                                 "is on a read-only")):
            code, lines = _cli(inp, work, out, capsys)
            assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {named}"), lines
        assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()  # nothing scanned or written


def test_a_folder_this_user_may_not_write_is_refused_by_its_mode(tmp_path):
    """Root writes through mode bits, so the check runs in a child that gives root up (uid nobody)."""
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        (base / "out").mkdir(mode=0o555)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no pytest machinery, only the check and its one line
            os.close(read)
            try:
                os.setgid(65534)
                os.setuid(65534)
                faults.check_writable(base / "out", "output", "--output")
                msg = b"accepted"
            except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
                msg = f"{type(e).__name__}: {e}".encode()
            os.write(write, msg)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            got = f.read().decode()
        os.waitpid(pid, 0)
        if os.geteuid() != 0:
            _unavailable("giving root up needs root")
        assert got == (f"NotWritable: the output folder {base / 'out'} is not writable by this user (uid 65534); "
                       "make it writable or choose another --output")
        faults.check_writable(base / "out", "output", "--output")  # root may: no refusal
    finally:
        os.chmod(base / "out", 0o755)
        os.rmdir(base / "out")
        os.rmdir(base)


def test_a_full_output_disk_stops_with_one_line_and_a_rerun_after_freeing_space_equals_a_clean_run(clean, tmp_path):
    inp, expected = clean
    work, out = tmp_path / "work", tmp_path / "out"
    with tmpfs(out, "16k") as grow:  # the plan's shards clearly do not fit: refused before the first byte
        with pytest.raises(faults.NoSpace, match=rf"for the output folder {out}: 16,384 bytes free, the run needs "
                                                 r"at least [\d,]+ bytes;"):
            stages(inp, work, out, 1)
        assert list(out.iterdir()) == []
        grow("100k")  # room for the plan's lower bound, not for the shards: the disk fills while writing
        with pytest.raises(faults.NoSpace, match=rf"for the output folder {out}: [\d,]+ bytes free, the run needs "):
            stages(inp, work, out, 2)
        assert temp_leftovers(work, out) == []
        got = snapshot(work, out)
        assert got["tables"] == expected["tables"] and got["plan"] == expected["plan"]  # the catalog as it was
        grow("1m")
        assert stages(inp, work, out, 1) == 0
        assert snapshot(work, out) == expected


def test_a_full_work_disk_stops_with_one_line_and_a_rerun_after_freeing_space_equals_a_clean_run(clean, tmp_path):
    inp, expected = clean
    work, out = tmp_path / "work", tmp_path / "out"
    with tmpfs(work, "200k") as grow:
        with pytest.raises(faults.NoSpace, match=rf"no space left on device (for the work folder {work}|writing "
                                                 rf"{work}/\S+ \([\d,]+ bytes\)): [\d,]+ bytes free"):
            stages(inp, work, out, 1)
        assert temp_leftovers(work, out) == []
        grow("8m")
        assert stages(inp, work, out, 1) == 0
        assert snapshot(work, out) == expected


def test_each_rename_is_followed_by_an_fsync_of_its_folder(clean, tmp_path, monkeypatch):
    """A power cut can lose at most the last rename: the folder a name was renamed into is fsynced before
    a name of another folder is renamed (and before the run ends)."""
    inp, _ = clean
    events: list[tuple[str, str]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst):
        real_replace(src, dst)
        events.append(("rename", os.path.dirname(os.path.abspath(dst))))

    def fsync(fd):
        real_fsync(fd)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    assert stages(inp, tmp_path / "work", tmp_path / "out", 1) == 0
    renames = [i for i, e in enumerate(events) if e[0] == "rename"]
    assert len(renames) > 20  # manifest and count folders, the plan, output shards, Energon files, records
    for i in renames:  # (a folder's renames back to back, as a swap's two, may share one fsync)
        elsewhere = next((j for j in renames if j > i and events[j][1] != events[i][1]), len(events))
        assert ("fsync", events[i][1]) in events[i + 1:elsewhere], events[i]


def test_injected_io_errors_give_a_pass_with_the_clean_bytes_or_one_line_naming_the_file(clean, tmp_path):
    """A short run of bench/soak_io_faults.py: libfiu's EIO in the scan's reads (which once became reason rows:
    a PASS without those samples) and in every read, write and fsync of the write stage."""
    if not fiu_available():
        _unavailable("fiu-run is not installed (apt-get install fiu-utils)")
    inp, expected = clean
    rng = random.Random(40)
    todo = [{**draw(rng, i), "stage": stage, "points": points, "probability": 0.05, "errno": "EIO"}
            for i, (stage, points) in enumerate([("scan", "read"), ("write", "all")])]
    results = faulty_runs(inp, tmp_path, todo, start=10)  # a start that deadlocks (libfiu) is redone sooner
    assert any(r["exit"] == 2 for r in results.values())  # the faults did land
    for fault in todo:
        folder = tmp_path / f"r{fault['run']}"
        verdict = judge(results[fault["run"]], inp, expected, folder / "work", folder / "out")
        assert verdict["outcome"] in ("pass_equal", "clear_error") and verdict["rerun"] == "equal", (fault, verdict)
        assert verdict["temp_left_visible"] == []
