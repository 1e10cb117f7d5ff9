"""One writer process writing one job (`pack-assets run` on a set of a few output shards, bench_write's set): the
job's catalog rows are read in a thread while the stage's checks and the output folder's claim run (`copy._read_ahead`).
The shards are the bytes the job reading them itself writes, and a check that refuses the write still refuses it
before any shard is written, the reading thread joined."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_write_batches import planned

from pack_assets.core.indexmode import SourceChanged
from pack_assets.core.write import copy, run_write


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _readers(monkeypatch) -> list[str]:
    """The names of the threads that read a job's catalog rows, as they read them."""
    seen: list[str] = []
    real = copy.group_tables

    def spy(*a, **k):
        seen.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(copy, "group_tables", spy)
    return seen


def test_one_job_reads_its_rows_beside_the_checks_and_writes_the_same_bytes(tmp_path, monkeypatch):
    inp, work = planned(tmp_path, max_packs_per_shard=2)
    seen = _readers(monkeypatch)
    run_write(work, inp, tmp_path / "ahead" / "packed", workers=1)
    assert len(seen) == 1 and seen[0].startswith("catalog-rows")  # read once, in the thread
    shards = [p for p in (tmp_path / "ahead" / "packed").iterdir() if p.suffix == ".tar"]
    assert len(shards) >= 2  # one job of several shards, each given its own tables

    seen.clear()
    monkeypatch.setattr(copy, "_read_ahead", lambda *a: None)  # the job reads its rows itself, as before
    run_write(work, inp, tmp_path / "itself" / "packed", workers=1)
    assert seen == [threading.main_thread().name]
    assert _files(tmp_path / "ahead" / "packed") == _files(tmp_path / "itself" / "packed")  # (the same folder name)


def test_a_refused_write_writes_no_shard_and_leaves_no_reading_thread(tmp_path, monkeypatch):
    inp, work = planned(tmp_path, max_packs_per_shard=2)
    seen = _readers(monkeypatch)
    src = inp / "part-001.tar"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched since the scan
    with pytest.raises(SourceChanged, match="part-001"):
        run_write(work, inp, tmp_path / "out", workers=1)
    assert seen and seen[0].startswith("catalog-rows")  # the rows were being read when the check refused
    assert not [t for t in threading.enumerate() if t.name.startswith("catalog-rows")]
    assert not list((tmp_path / "out").glob("*.tar"))


def test_a_failed_read_is_the_write_s_error_and_no_shard_is_written(tmp_path, monkeypatch):
    inp, work = planned(tmp_path, max_packs_per_shard=2)

    def broken(*a, **k):
        raise KeyError("a sample of this shard has no conversation in the catalog")

    monkeypatch.setattr(copy, "group_tables", broken)
    with pytest.raises(KeyError, match="no conversation"):
        run_write(work, inp, tmp_path / "out", workers=1)
    assert not list((tmp_path / "out").glob("*.tar*"))
    assert not [t for t in threading.enumerate() if t.name.startswith("catalog-rows")]
