"""The writer's rows and reads. The Energon index (index.sqlite) as readers find it, however the writer inserts
its rows: a tar's parts inserted many rows a statement (`energon.insert_parts`) give the file a statement per row
gives, byte for byte (the output is deterministic and compared across versions), and the rows in their order. The
writer's members, read from the catalog in any order and put in their samples' order in numpy
(`bulk.in_sample_order`), come out as DuckDB's sort gave them, without importing pandas. A pack's reads, each
source's descriptor looked up once, read the right bytes when the sources kept open are fewer than its sources."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from pack_assets.core import store
from pack_assets.core.write import bulk, energon


def _parts(n: int, seed: int) -> list[tuple]:
    return [(i // 5, f"s{i % 5:03d}_{seed:02d}.jpg" if i % 5 else "json", 512 * (3 * i + 1), 16000 + (i * 37) % 999)
            for i in range(n)]


def _index(path: Path, insert) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous = OFF")
    db.execute("PRAGMA journal_mode = OFF")
    for sql in store.ENERGON_INDEX_TABLES:
        db.execute(sql)
    for tar_id, n in enumerate([0, 1, energon.PARTS_PER_INSERT, 2 * energon.PARTS_PER_INSERT + 7, 3]):
        insert(db, tar_id, _parts(n, tar_id))
    for sql in store.ENERGON_INDEX_INDEXES:
        db.execute(sql)
    db.commit()
    db.close()


def test_parts_inserted_many_a_statement_make_the_file_one_a_statement_makes(tmp_path):
    one = tmp_path / "one.sqlite"
    _index(one, lambda db, tar_id, parts: db.executemany("INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)",
                                                         [(tar_id, *p) for p in parts]))
    many = tmp_path / "many.sqlite"
    _index(many, energon.insert_parts)
    assert many.read_bytes() == one.read_bytes()
    with sqlite3.connect(many) as db:
        rows = db.execute("SELECT * FROM sample_parts ORDER BY rowid").fetchall()
        types = db.execute("SELECT DISTINCT typeof(tar_file_id), typeof(sample_index), typeof(part_name), "
                           "typeof(content_byte_offset), typeof(content_byte_size) FROM sample_parts").fetchall()
    assert rows == [(t, *p) for t, n in enumerate([0, 1, energon.PARTS_PER_INSERT, 2 * energon.PARTS_PER_INSERT + 7,
                                                    3]) for p in _parts(n, t)]
    assert types == [("integer", "integer", "text", "integer", "integer")]


def _members(rows: list[tuple]) -> pa.Table:
    names = ["output_shard", "pack_id", "position", "kind", "i", "name", "offset", "size", "sha256"]
    return pa.table({k: [r[j] for r in rows] for j, k in enumerate(names)})


def test_members_in_any_order_come_out_in_their_samples_order():
    # samples as the catalog orders them: output shard, pack, position (pack ids not in string order per shard
    # would not happen; any order of the packs is followed as the samples give it)
    samples = pa.table({"output_shard": ["a", "a", "a", "b", "b"], "pack_id": ["p2", "p2", "p10", "p1", "p1"],
                        "position": [0, 1, 0, 0, 1]})
    want = [("a", "p2", 0, 0, 1, "x.0.jpg", 0, 1, None), ("a", "p2", 0, 0, 2, "x.1.jpg", 9, 1, None),
            ("a", "p2", 0, 1, 1, "x.cls", 5, 1, None), ("a", "p2", 1, 0, 1, "y.jpg", 3, 1, "h"),
            ("a", "p10", 0, 1, 1, "z.npy", 7, 1, None), ("b", "p1", 0, 0, 1, "u.jpg", 2, 1, None),
            ("b", "p1", 1, 0, 1, "v.0.jpg", 4, 1, None), ("b", "p1", 1, 0, 2, "v.1.jpg", 6, 1, None)]
    shuffled = [want[k] for k in (5, 2, 7, 0, 4, 6, 1, 3)]
    assert bulk.in_sample_order(samples, _members(shuffled)).to_pylist() == _members(want).to_pylist()
    with pytest.raises(KeyError):
        bulk.in_sample_order(samples, _members([*shuffled, ("b", "p9", 0, 0, 1, "w.jpg", 1, 1, None)]))


def test_integer_columns_as_numpy_from_their_buffers():
    col = pa.chunked_array([pa.array([5, 6, 7, 8], pa.int32()).slice(1), pa.array([], pa.int32()),
                            pa.array([-1, 2**40], pa.int64()).cast(pa.int32(), safe=False).slice(0, 1)])
    assert bulk._ints(col).tolist() == [6, 7, 8, -1]
    assert bulk._ints(pa.array([3, 4], pa.uint8())).tolist() == [3, 4]
    with pytest.raises(TypeError):
        bulk._ints(pa.array([1, None]))


def test_putting_members_in_order_does_not_import_pandas():
    """Arrow's to_numpy and take of a numpy array import pandas on their first call: ~0.4 s of a fresh writer's
    first shard (`pack-assets write` in a process of its own), for nothing."""
    code = ("import sys, duckdb\n"
            "from pack_assets.core.write import bulk, run_write\n"
            "s = duckdb.sql(\"SELECT 'a' AS output_shard, unnest(['p', 'q']) AS pack_id, 0 AS position\")\n"
            "s = s.to_arrow_table()\n"
            "m = duckdb.sql(\"SELECT 'a' AS output_shard, unnest(['q', 'p']) AS pack_id, 0 AS position, 0 AS kind, \"\n"
            "               \"1::BIGINT AS i\").to_arrow_table()\n"
            "before = 'pandas' in sys.modules\n"
            "assert bulk.in_sample_order(s, m).column('pack_id').to_pylist() == ['p', 'q']\n"
            "print(before, 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(bulk.__file__).parents[3])})
    assert out.stdout.strip() == "False False"


def test_a_packs_reads_from_more_sources_than_are_kept_open_read_each_ones_bytes(tmp_path):
    """A pack's reads look each source's descriptor up once, but never keep one the sources' LRU has closed
    (and whose number a later open may reuse for another file)."""
    from pack_assets.core.write.shard import _reads
    from pack_assets.core.write.syscalls import Arena, Sources

    paths, data = [], []
    for k in range(6):
        paths.append(str(tmp_path / f"src-{k}.tar"))
        data.append(bytes((37 * k + j) % 256 for j in range(200)))
        Path(paths[-1]).write_bytes(data[-1])
    order = (0, 1, 2, 3, 4, 5, 0, 3, 1, 5, 2, 4, 0)
    sources = Sources(limit=3)
    try:
        got = _reads(sources, Arena(), [(paths[k], 100 + k, 3, f"s{k}", True) for k in order])
        assert [bytes(g) for g in got] == [data[k][100 + k:103 + k] for k in order]
        with pytest.raises(OSError, match="ends early"):
            _reads(sources, Arena(), [(paths[0], 198, 5, "s0", True)])
    finally:
        sources.close()
