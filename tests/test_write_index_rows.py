"""The Energon index (index.sqlite) made as the writer's shards come (`energon.IndexRows`: a pool's parent inserts
each shard's rows while the writers write the next ones, where it made them all after the last shard): the same
file, byte for byte, and the same `.tar.idx` files as made at the end, with a shard found current (read back
from its tar headers) between those given; the rows are in as each shard is given; a write that fails leaves no
temporary index file nor a `.nv-meta/` folder it made; a shard given after a later one is refused."""

from __future__ import annotations

import io
import sqlite3
import tarfile
from pathlib import Path

import pytest

from pack_assets.core.owned import NV_META
from pack_assets.core.write import energon
from pack_assets.core.write.publish import Publish


def _index(packs: int, seed: int) -> energon.Index:
    samples, parts, pos = [], [], 0
    for i in range(packs):
        samples.append((f"p{seed}x{i:03d}", pos, 3072))
        parts += [(i, "json", pos + 512, 100 + seed), (i, "0.jpg", pos + 2048, 900 + i)]
        pos += 3072
    return samples, parts, pos


def _tar(path: Path, keys: list[str]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for k in keys:
            for part, data in (("json", b"{}"), ("0.jpg", b"x" * 700)):
                info = tarfile.TarInfo(f"{k}.{part}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


NAMES = ["a.tar", "b.tar", "c.tar", "d.tar"]  # c.tar: found current, on disk (no index given)


def _folder(root: Path) -> tuple[Path, dict]:
    out = root / "out"
    out.mkdir(parents=True)
    _tar(out / "c.tar", ["c0", "c1", "c2"])
    return out, {n: _index(3 + i, i) for i, n in enumerate(NAMES) if n != "c.tar"}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.suffix != ".tar"}


def test_rows_made_as_the_shards_come_give_the_files_made_at_the_end(tmp_path):
    end, indexes = _folder(tmp_path / "end")
    with Publish() as publish:
        energon.write_energon_meta(end, NAMES, "fp", publish, indexes)
        publish.commit()
    came, _ = _folder(tmp_path / "came")
    with energon.IndexRows(came, NAMES) as rows, Publish() as publish:
        rows.add("a.tar", indexes["a.tar"])
        rows.add("b.tar", indexes["b.tar"])
        assert rows.counts == {"a.tar": 3, "b.tar": 4}  # in as given
        assert rows.db.execute("SELECT count(*) FROM samples").fetchone() == (7,)
        rows.add("d.tar", indexes["d.tar"])  # c.tar's rows read back before it
        assert rows.counts == {"a.tar": 3, "b.tar": 4, "c.tar": 3, "d.tar": 6}
        energon.write_energon_meta(came, NAMES, "fp", publish, built=rows)
        publish.commit()
    assert _files(came) == _files(end)
    assert {"a.tar.idx", "c.tar.idx", f"{NV_META}/index.sqlite"} <= set(_files(came))
    with sqlite3.connect(came / NV_META / "index.sqlite") as db:
        assert db.execute("SELECT count(*) FROM samples").fetchone() == (16,)


def test_a_write_that_fails_leaves_no_index_file_nor_the_folder_it_made(tmp_path):
    out, indexes = _folder(tmp_path)
    with pytest.raises(OSError), energon.IndexRows(out, NAMES) as rows:
        rows.add("a.tar", indexes["a.tar"])
        assert (out / NV_META).is_dir() and list((out / NV_META).iterdir())
        raise OSError("the next shard failed")
    assert not (out / NV_META).exists()
    assert sorted(p.name for p in out.iterdir()) == ["c.tar"]


def test_a_shard_given_after_a_later_one_is_refused(tmp_path):
    out, indexes = _folder(tmp_path)
    with energon.IndexRows(out, NAMES) as rows:
        rows.add("a.tar", indexes["a.tar"])
        rows.add("b.tar", indexes["b.tar"])
        rows.add("d.tar", indexes["d.tar"])
        with pytest.raises(RuntimeError, match="b.tar"):
            rows.add("b.tar", indexes["b.tar"])
