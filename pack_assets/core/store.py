"""The work directory's layout and the catalog's table contract: every table, view and their DDL.

Per-shard stages write their own Parquet files (one directory per shard, replaced atomically), so
concurrent shard runs never contend for one DuckDB file. The single-writer steps (plan, write, audit)
gather them into ``<work>/pack_assets.duckdb`` as views, next to the tables the plan owns.

    <work>/manifest/<shard>/{samples,members,rejected,shard}.parquet
    <work>/token_lengths/<profile>/<shard>/{token_lengths,rejected,stamp}.parquet|json
    <work>/pack_plan.jsonl, <work>/what_if.json, <work>/audit_report.md, <work>/pack_assets.duckdb
    <work>/.staged-<host>-<pid>-*/  rows the writer or the audit reads per output shard, while that stage runs

Views over the Parquet files: manifest_samples, members, shards, token_lengths, rejected, samples (status
and reason after both scan and count). Tables the plan writes (or appends to) in one transaction: pack_plan,
pack_members, dropped, split_pieces (over-long samples split, core/split.py), plan_info (one JSON row), and the
view lineage. Temporary tables: the plan check's snapshot of samples (core/plancheck.py) and the audit's
audit_seen (core/audit.py). Beside the catalog, the one other schema the tool writes: Megatron-Energon's
``index.sqlite`` in an output folder (`ENERGON_INDEX_TABLES`, SQLite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import operator
import os
import re
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import safety
from .records import (
    MANIFEST_FORMAT,
    MEMBERS_SCHEMA,
    REJECTED_SCHEMA,
    SAMPLES_SCHEMA,
    SHARDS_SCHEMA,
    TOKEN_LENGTHS_SCHEMA,
    Rejection,
    Sample,
    ShardInfo,
)

DB_NAME = "pack_assets.duckdb"
_BATCH = 8192


def shard_key(input_root: Path, tar_path: Path) -> str:
    """`part-00012` for `<root>/part-00012.tar`: the path under the root, without `.tar`."""
    rel = tar_path.relative_to(input_root).as_posix()
    return rel[: -len(".tar")] if rel.endswith(".tar") else rel


def source_tar(input_root, shard: str) -> Path:
    """A shard's tar: ``<input>/<shard>.tar``, or with a recipe's roots (dataset name -> input folder) and a
    ``<dataset>/<shard>`` key, ``<that dataset's input>/<shard>.tar``."""
    if isinstance(input_root, Mapping):
        name, _, rest = shard.partition("/")
        if name not in input_root or not rest:
            raise KeyError(f"shard {shard!r} names no dataset of the recipe ({', '.join(input_root)})")
        return Path(input_root[name]) / f"{rest}.tar"
    return Path(input_root) / f"{shard}.tar"


def find_sources(input_root, recursive: bool = True) -> dict[str, Path]:
    """`find_shards` of one input folder, or of every dataset of a recipe's roots with keys ``<dataset>/<shard>``."""
    if isinstance(input_root, Mapping):
        return {f"{name}/{k}": p for name, root in input_root.items()
                for k, p in find_shards(Path(root), recursive).items()}
    return find_shards(Path(input_root), recursive)


def find_shards(input_root: Path, recursive: bool = True) -> dict[str, Path]:
    """Shard key -> path for every ``*.tar`` under the input root, sorted by key."""
    pattern = "**/*.tar" if recursive else "*.tar"
    found = {shard_key(input_root, p): p for p in input_root.glob(pattern) if p.is_file()}
    return dict(sorted(found.items()))


def stat_shards(input_root: Path, recursive: bool = True) -> dict[str, tuple[int, int]]:
    """Shard key -> (size, mtime_ns) of every ``*.tar`` under the input root (a tar gone meanwhile is left out)."""
    out = {}
    for key, path in find_sources(input_root, recursive).items():
        try:
            st = path.stat()
        except OSError:
            continue
        out[key] = (st.st_size, st.st_mtime_ns)
    return out


def recorded_stats(work: Path, shards: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Shard key -> (size, mtime_ns) its manifest recorded, for the given shards that have one: a single
    read over all their ``shard.parquet`` files, on an in-memory connection (never the catalog, which a
    plan may hold)."""
    paths = [p for p in (manifest_dir(work, s) / "shard.parquet" for s in shards) if p.exists()]
    if not paths:
        return {}
    source = f"read_parquet({_files(paths)}, union_by_name = true)"
    with _configured(duckdb.connect()) as con:
        fmt = "manifest_format" if "manifest_format" in con.sql(f"SELECT * FROM {source} LIMIT 0").columns else "NULL"
        rows = con.execute(f"SELECT shard, size, mtime_ns, {fmt} FROM {source}").fetchall()
    # an older version's manifest counts as changed, so the sensor requests its rescan as the CLI does
    return {r[0]: (r[1], r[2]) if r[3] == MANIFEST_FORMAT else (-1, -1) for r in rows}


def manifest_dir(work: Path, shard: str) -> Path:
    return work / "manifest" / shard


def token_dir(work: Path, profile: str, shard: str) -> Path:
    return work / "token_lengths" / profile / shard


def shard_lock(work: Path, shard: str):
    """Held while a shard is scanned or counted (the lock its manifest directory swap takes too), so two
    runs of one shard take turns and counts never pair with a manifest swapped in under them."""
    d = manifest_dir(work, shard)
    return safety.path_lock(d.parent / f".{d.name}.lock", f"shard {shard}", wait=safety.lock_wait())


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Fill a temporary sibling directory, then swap it in; a crash leaves the old one or none. A lock per
    directory (``.{name}.lock`` beside it) makes a concurrent run of the same shard wait, so the temporary
    directories removed here can only be a dead run's."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with safety.path_lock(final.parent / f".{final.name}.lock", f"writing {final.name}", wait=safety.lock_wait()):
        for stale in [*final.parent.glob(f".{final.name}.tmp-*"), *final.parent.glob(f".{final.name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed run of this same shard
        tmp = Path(safety.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            yield tmp
            safety.fsync_tree(tmp)  # its files on disk before the name points at them
            if final.exists():
                old = final.with_name(f".{final.name}.old-{os.getpid()}")
                os.replace(final, old)
                safety.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                safety.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: Path, text: str | Iterable[str]) -> None:
    """``text``: a str, or its parts in order, each encoded and written in turn (never all in memory at once)."""
    safety.atomic_write_bytes(path, text.encode("utf-8") if isinstance(text, str)
                              else (part.encode("utf-8") for part in text))


class BatchedParquet:
    """Append rows (dicts or tuples in schema order), kept as tuples and written in batches (turned into
    columns by one zip per batch), so memory stays bounded and no per-row dict has to be converted."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.schema = schema
        self.names = schema.names
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")
        self.rows: list[tuple] = []
        self._values = operator.itemgetter(*self.names)  # a dict row's values in column order (2+ columns)
        self.count = 0

    def add(self, row) -> None:
        self.rows.append(self._values(row) if isinstance(row, dict) else row)
        if len(self.rows) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            # pa.array (pyarrow then imports pandas), not `columns_relation`: a forked helper writes these, and
            # DuckDB's state is not fork-safe (a helper's first connect hung when its parent had used DuckDB)
            arrays = [pa.array(col, type=f.type) for col, f in zip(zip(*self.rows), self.schema)]
            self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


_DUCK_TYPES = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.bool_(): "BOOLEAN",
               pa.float64(): "DOUBLE"}


def _duck_type(t: pa.DataType) -> str:
    return f"{_duck_type(t.value_type)}[]" if pa.types.is_list(t) else _DUCK_TYPES[t]


def columns_relation(con: duckdb.DuckDBPyConnection, name: str, columns: list[list], schema: pa.Schema):
    """``columns`` of Python values registered as ``name`` while the block runs; yields a SELECT of them with
    ``schema``'s columns and types. Handed to DuckDB as NumPy object columns, because building Arrow arrays
    from Python objects makes pyarrow import pandas, which the command's own process no longer pays (its helpers
    do, in `BatchedParquet`)."""
    return _registered(con, name, {f.name: np.fromiter(col, dtype=object, count=len(col))
                                   for f, col in zip(schema, columns)}, schema)


@contextlib.contextmanager
def _registered(con: duckdb.DuckDBPyConnection, name: str, data, schema: pa.Schema) -> Iterator[str]:
    con.register(name, data)
    try:
        yield "SELECT " + ", ".join(f'CAST("{f.name}" AS {_duck_type(f.type)}) AS "{f.name}"' for f in schema) \
            + f" FROM {name}"
    finally:
        con.unregister(name)


def rows_relation(con: duckdb.DuckDBPyConnection, name: str, rows: list | pa.RecordBatchReader, schema: pa.Schema):
    """`columns_relation` for rows (dicts, or tuples in schema order), or for Arrow batches (read once)."""
    if isinstance(rows, pa.RecordBatchReader):
        return _registered(con, name, rows, schema)
    keys = schema.names if rows and isinstance(rows[0], dict) else range(len(schema))
    return columns_relation(con, name, [[r[k] for r in rows] for k in keys], schema)


def _rejection_row(r: Rejection) -> dict:
    return dataclasses.asdict(r)


sample_row = operator.attrgetter(*SAMPLES_SCHEMA.names)  # a Sample's values in the file's column order


def write_manifest(work: Path, shard: str, records: Iterable[Sample | Rejection], info: ShardInfo) -> dict:
    """Stream a shard's scan into its Parquet files; returns the counts."""
    with atomic_dir(manifest_dir(work, shard)) as d:
        samples = BatchedParquet(d / "samples.parquet", SAMPLES_SCHEMA)
        members = BatchedParquet(d / "members.parquet", MEMBERS_SCHEMA)
        rejected = BatchedParquet(d / "rejected.parquet", REJECTED_SCHEMA)
        for rec in records:
            if isinstance(rec, Rejection):
                rejected.add(_rejection_row(rec))
                continue
            samples.add(sample_row(rec))
            for m in rec.members:
                members.add((m.sample_id, m.name, m.offset, m.size, m.sha256))
        for w in (samples, members, rejected):
            w.close()
        pq.write_table(pa.Table.from_pylist([dataclasses.asdict(info)], schema=SHARDS_SCHEMA), d / "shard.parquet")
    return {"samples": samples.count, "members": members.count, "rejected": rejected.count}


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file as a table. (`pq.read_table` goes through pyarrow.dataset, whose import every process
    that reads a file would pay: the CLI and each worker.)"""
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns)


def read_shard_info(work: Path, shard: str) -> dict | None:
    p = manifest_dir(work, shard) / "shard.parquet"
    if not p.exists():
        return None
    return read_parquet(p).to_pylist()[0]


def write_token_lengths(work: Path, profile: str, shard: str, rows: Iterable[dict],
                        rejections: Iterable[Rejection]) -> int:
    with atomic_dir(token_dir(work, profile, shard)) as d:
        out = BatchedParquet(d / "token_lengths.parquet", TOKEN_LENGTHS_SCHEMA)
        for row in rows:
            out.add(row)
        out.close()
        rej = BatchedParquet(d / "rejected.parquet", REJECTED_SCHEMA)
        for r in rejections:
            rej.add(_rejection_row(r))
        rej.close()
    return out.count


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _files(paths: list[Path]) -> str:
    return "[" + ", ".join(_sql_text(p.as_posix()) for p in paths) + "]"


def _empty_select(schema: pa.Schema) -> str:
    return "SELECT " + ", ".join(f"CAST(NULL AS {_duck_type(f.type)}) AS {f.name}" for f in schema) + " WHERE false"


def _view_source(paths: list[Path], schema: pa.Schema) -> str:
    existing = [p for p in paths if p.exists()]
    if not existing:
        return _empty_select(schema)
    return f"SELECT * FROM read_parquet({_files(existing)})"


PACK_PLAN_SCHEMA = pa.schema([
    ("pack_id", pa.string()), ("media_type", pa.string()), ("sample_ids", pa.list_(pa.string())),
    ("sample_token_lens", pa.list_(pa.int64())), ("total_token_len", pa.int64()), ("output_shard", pa.string()),
    ("overlong", pa.bool_())])
DROPPED_SCHEMA = pa.schema([("sample_id", pa.string()), ("total_tokens", pa.int64()), ("reason", pa.string())])
# an over-long sample split into pieces (core/split.py): each piece packed like a sample under its own id
SPLIT_PIECES_SCHEMA = pa.schema([
    ("piece_id", pa.string()), ("sample_id", pa.string()), ("piece", pa.int32()), ("pieces", pa.int32()),
    ("system", pa.int32()), ("context_start", pa.int32()), ("first_message", pa.int32()), ("end_message", pa.int32()),
    ("context_messages", pa.int32()), ("total_tokens", pa.int64()), ("n_media", pa.int64()),
    ("vision_tokens", pa.int64()), ("media_members", pa.list_(pa.string())), ("extra_members", pa.list_(pa.string())),
    ("conversation", pa.string())])
# a blend's plan (core/blend.py) also names, per member, its dataset and which copy of the sample it is, and the
# epoch of the whole plan; a single-input plan keeps the columns above only (its rows are all epoch 0, copy 0)
BLEND_PACK_PLAN_SCHEMA = PACK_PLAN_SCHEMA.append(pa.field("datasets", pa.list_(pa.string()))) \
    .append(pa.field("copies", pa.list_(pa.int32()))).append(pa.field("epoch", pa.int32()))
BLEND_DROPPED_SCHEMA = DROPPED_SCHEMA.append(pa.field("dataset", pa.string())).append(pa.field("epoch", pa.int32())) \
    .append(pa.field("copy", pa.int32()))

LINEAGE_VIEW = """CREATE OR REPLACE VIEW lineage AS
SELECT pm.pack_id, pm.position, p.output_shard, p.media_type, p.total_token_len,
       s.sample_id, s.shard, s.key, s.json_member, s.media_members
FROM pack_members pm JOIN pack_plan p USING (pack_id) JOIN manifest_samples s USING (sample_id)"""


MEMORY_ENV = "PACK_ASSETS_DUCKDB_MEMORY"  # the catalog's DuckDB limit (default: `connect`'s memory, 1GB; e.g. "4GB")


def memory_limit(default: str = "1GB") -> str:
    return os.environ.get(MEMORY_ENV) or default


def _configured(con: duckdb.DuckDBPyConnection, memory: str = "1GB") -> duckdb.DuckDBPyConnection:
    # DuckDB's own default limit is 80 % of RAM: the fingerprint query over 1M samples then held 5 GB where
    # it spills past a bound at the same speed. Its progress bar writes to stdout, into `run --json`.
    limit = memory_limit(memory)
    try:
        con.execute(f"SET memory_limit = '{limit}'")
    except duckdb.Error as e:
        con.close()
        raise ValueError(f"{MEMORY_ENV}={limit!r} is not a DuckDB memory limit (e.g. 1GB, 512MB): {e}") from None
    con.execute("SET enable_progress_bar = false")
    # memory DuckDB frees is handed back to the system by its allocator's own threads; without them a process
    # kept what its largest query had held (the plan's sort of every sample id) through the later stages
    con.execute("SET allocator_background_threads = true")
    return con


@contextlib.contextmanager
def held_to(con: duckdb.DuckDBPyConnection, memory: str) -> Iterator[None]:
    """``con``'s DuckDB held to ``memory`` for the block (a query spills past it), then to the catalog's limit."""
    con.execute(f"SET memory_limit = '{memory}'")
    try:
        yield
    finally:
        con.execute(f"SET memory_limit = '{memory_limit()}'")


# what DuckDB says of a catalog file it cannot open at all (an I/O error while it was written, a bad sector)
UNREADABLE = ("Could not read enough bytes", "not a valid DuckDB database file", "Corrupt database file")


def _open(work: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """The catalog; one DuckDB cannot open is set aside (``<name>.unreadable-<ns>``, with its WAL) and a new
    one begun, for writing: everything in it is rebuilt from the per-shard Parquet files and the next plan."""
    path = work / DB_NAME
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as e:
        if read_only or not any(m in str(e) for m in UNREADABLE):
            raise
    stamp = time.time_ns()
    for f in (path, path.with_name(path.name + ".wal")):
        if f.exists():
            safety.replace(f, f.with_name(f"{f.name}.unreadable-{stamp}"))
    return duckdb.connect(str(path))


def connect(work: Path, read_only: bool = False, memory: str = "1GB") -> duckdb.DuckDBPyConnection:
    con = _configured(_open(work, read_only), memory)
    # SQL reads only catalog tables and what is registered by name: a Python local must never stand in for
    # (or be shadowed by) a table of the same name, as `dropped` once was
    con.execute("SET python_enable_replacements = false")
    return con


def catalog_files(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every Parquet file the catalog's views read (the paths `_files` wrote into their SQL)."""
    sql = " ".join(r[0] or "" for r in con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall())
    return sorted({m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*?\.parquet)'", sql)})


# the samples view's status of a sample: its manifest row's (s), unless its token_lengths row (t) rejects it
SAMPLE_STATUS = "CASE WHEN t.status = 'rejected' THEN 'rejected' ELSE s.status END"


def build_catalog(con: duckdb.DuckDBPyConnection, work: Path, shards: list[str], profile: str) -> None:
    """(Re)create the views over the per-shard Parquet files of the given shards."""
    m = [manifest_dir(work, s) for s in shards]
    t = [token_dir(work, profile, s) for s in shards]
    for view, folders, file, schema in (("manifest_samples", m, "samples.parquet", SAMPLES_SCHEMA),
                                        ("members", m, "members.parquet", MEMBERS_SCHEMA),
                                        ("shards", m, "shard.parquet", SHARDS_SCHEMA),
                                        ("token_lengths", t, "token_lengths.parquet", TOKEN_LENGTHS_SCHEMA)):
        con.execute(f"CREATE OR REPLACE VIEW {view} AS {_view_source([d / file for d in folders], schema)}")
    # which folders hold each shard's rows (a blend's epoch catalog reads the dataset work folder's), so a
    # reader can tell from their files' stamps whether a shard's rows changed (write.shard_digests)
    con.execute("CREATE OR REPLACE TABLE catalog_shards AS SELECT unnest(?::VARCHAR[]) AS shard, "
                "unnest(?::VARCHAR[]) AS manifest_dir, unnest(?::VARCHAR[]) AS token_dir",
                [shards, [d.as_posix() for d in m], [d.as_posix() for d in t]])
    rej = [d / "rejected.parquet" for d in m] + [d / "rejected.parquet" for d in t]
    con.execute(f"CREATE OR REPLACE VIEW rejected AS {_view_source(rej, REJECTED_SCHEMA)}")
    # a sample the token stage rejects (e.g. an image the processor refuses) is rejected overall
    con.execute(
        f"""CREATE OR REPLACE VIEW samples AS
        SELECT s.* REPLACE (
            {SAMPLE_STATUS} AS status,
            COALESCE(s.reason, CASE WHEN t.status = 'rejected' THEN t.reason END) AS reason)
        FROM manifest_samples s LEFT JOIN token_lengths t USING (sample_id)"""
    )


STAGED_PREFIX = ".staged-"
_STAGED_BATCH = 32768  # rows streamed at once; each output shard's share of a batch is one row group
_STAGED_GROUP = 256  # output shards filed per pass over the query: bounds open files and buffered metadata


def _part(shard: str) -> str:
    """An output shard's folder in a staged query: a digest of its name (no escaping, no shard index to carry)."""
    return "part=" + hashlib.sha1(shard.encode("utf-8")).hexdigest()[:20]


@dataclasses.dataclass(frozen=True)
class Staged:
    """Rows a stage reads per output shard, gathered once for all of them (`staged`): one Parquet file per
    query and output shard. Picklable and small, so worker processes read their shard's file themselves."""

    root: Path

    def rows(self, con: duckdb.DuckDBPyConnection, query: str, shard: str, order_by: str = "") -> list[tuple]:
        found = self._relation(con, query, shard, order_by)
        return [] if found is None else found.fetchall()

    def table(self, con: duckdb.DuckDBPyConnection, query: str, shard: str, order_by: str = "") -> pa.Table | None:
        """The rows as an Arrow table; None when the query had none for this shard."""
        found = self._relation(con, query, shard, order_by)
        return None if found is None else found.to_arrow_table()

    def _relation(self, con: duckdb.DuckDBPyConnection, query: str, shard: str, order_by: str):
        if not self.root.is_dir():
            raise FileNotFoundError(f"the staged rows under {self.root} are gone")
        path = self.root / query / _part(shard) / "rows.parquet"
        if not path.exists():  # the query had no row for this shard
            return None
        return con.sql(f"SELECT * FROM read_parquet({_files([path])}, hive_partitioning = false)"
                       + (f" ORDER BY {order_by}" if order_by else ""))


def shard_rows(con: duckdb.DuckDBPyConnection, queries: Mapping[str, str], query: str, shard: str,
               rows: Staged | None = None, order_by: str = "") -> list[tuple]:
    """One output shard's rows of ``queries[query]``, its columns without ``output_shard``: from the staged files
    (`staged`), or without them by the query itself, filtered to that shard."""
    if rows is not None:
        return rows.rows(con, query, shard, order_by)
    sql = queries[query].replace("{shards}", "p.output_shard = ?") + (f" ORDER BY {order_by}" if order_by else "")
    return [r[1:] for r in con.execute(sql, [shard]).fetchall()]


def _stage_query(con: duckdb.DuckDBPyConnection, sql: str, shards: list[str], folder: Path,
                 files: Mapping[str, str] | None = None, batch_rows: int = _STAGED_BATCH) -> None:
    """Stream the query's rows and file them by output shard, a Parquet file per shard, or per ``files`` (each
    shard's file, named after the first shard of its group; ``output_shard`` kept). Filed here, not by
    DuckDB's `COPY … PARTITION_BY`, which held its whole memory limit (1.2 GB at 1M samples,
    bench/bench_stage.py); this holds a batch and one open file per shard (or group) of the pass."""
    at = {name: i for i, name in enumerate(shards)}
    writers: dict[str, pq.ParquetWriter] = {}
    try:
        for batch in con.sql(sql).to_arrow_reader(batch_rows):  # a relation streams; execute() holds every row
            # each row's shard as its place in `shards`, by way of a dictionary: no pa.array, no to_numpy (both
            # make pyarrow import pandas, see `columns_relation`)
            codes = batch.column("output_shard").cast(pa.string()).dictionary_encode()  # (large or view strings)
            ix = codes.indices
            position = np.asarray([at[s] for s in codes.dictionary.to_pylist()], dtype=np.int64)[
                np.frombuffer(ix.buffers()[1], dtype=np.int32)[ix.offset:ix.offset + len(ix)]]
            order = np.argsort(position, kind="stable")
            batch = (batch if files else batch.drop_columns(["output_shard"])).take(
                pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order.astype(np.int64, copy=False))]))
            position = position[order]
            cuts = [0, *(np.flatnonzero(np.diff(position)) + 1).tolist(), len(position)]
            for lo, hi in zip(cuts, cuts[1:]):
                file = files[shards[int(position[lo])]] if files else shards[int(position[lo])]
                if file not in writers:
                    (folder / _part(file)).mkdir(parents=True)
                    writers[file] = pq.ParquetWriter(folder / _part(file) / "rows.parquet", batch.schema)
                writers[file].write_batch(batch.slice(lo, hi - lo))
    finally:
        for w in writers.values():
            w.close()


@contextlib.contextmanager
def staged(work: Path, queries: Mapping[str, str], shards: list[str], con: duckdb.DuckDBPyConnection | None = None,
           groups: list[list[str]] | None = None, batch_rows: Mapping[str, int] | None = None) -> Iterator[Staged]:
    """Run each query once per group of output shards into ``<work>/.staged-<host>-<pid>-*/<query>/``, removed on
    exit; ``con``: the caller's connection, else a read-only one closed before the rows are read. Each query
    selects ``output_shard`` from ``pack_plan p`` and filters with ``WHERE {shards}``. The same SELECT run per
    output shard (``WHERE output_shard = ?``, `shard_rows` without staging) scans every manifest file each
    time, so a stage's queries cost output shards × samples; gathered, a shard's rows are one small file.
    ``groups`` (of ``shards``): one file per group instead, read back by `Staged.table` with a group's first.
    ``batch_rows``: rows streamed at once by the queries it names (wide rows: fewer, a batch's bytes kept small)."""
    host = socket.gethostname().replace("-", "_")
    for stale in work.glob(f"{STAGED_PREFIX}{host}-*"):  # a killed run's on this host (a live process's stay)
        pid = stale.name[len(f"{STAGED_PREFIX}{host}-"):].split("-", 1)[0]
        if pid.isdigit() and not safety.pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    root = Path(safety.mkdtemp(prefix=f"{STAGED_PREFIX}{host}-{os.getpid()}-", dir=work))
    try:
        with contextlib.nullcontext(con) if con is not None else connect(work, read_only=True) as c, c.cursor() as cur:
            # a cursor of its own: a result the caller left open on ``con`` neither blocks nor is lost
            files = {s: g[0] for g in groups for s in g} if groups else None
            passes = [sum(groups[at:at + _STAGED_GROUP], []) for at in range(0, len(groups), _STAGED_GROUP)] if groups \
                else [shards[at:at + _STAGED_GROUP] for at in range(0, len(shards), _STAGED_GROUP)]
            for group in passes:
                names = ", ".join(map(_sql_text, group))
                for name, sql in queries.items():
                    _stage_query(cur, sql.replace("{shards}", f"p.output_shard IN ({names})"), group, root / name,
                                 files, (batch_rows or {}).get(name, _STAGED_BATCH))
        yield Staged(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def has_plan(con: duckdb.DuckDBPyConnection) -> bool:
    # fetchall, not fetchone: a result left unfinished makes DuckDB refuse a later register()
    found = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'plan_info'").fetchall()
    return bool(found[0][0])


def check_plan_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse, in one clear line, a plan saved by a version before split_pieces (its readers join it)."""
    found = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'split_pieces'").fetchall()
    if not found[0][0] and has_plan(con):
        raise FileNotFoundError("the plan in this work folder was made by an older pack_assets (no split_pieces "
                                "table): plan again (`pack-assets run`) before auditing or looking up")


def read_plan_info(con: duckdb.DuckDBPyConnection) -> dict:
    return json.loads(con.execute("SELECT info FROM plan_info").fetchall()[0][0])


def save_plan(con: duckdb.DuckDBPyConnection, packs: list[dict] | pa.RecordBatchReader, dropped: list[dict], info: dict,
              blend: bool = False, pieces: list[tuple] = (), multiple: int = 1, append: bool = False) -> None:
    """Replace pack_plan (``packs``: rows, or Arrow batches), pack_members, dropped, split_pieces (``pieces``:
    rows in SPLIT_PIECES_SCHEMA order) and plan_info in one transaction (a reader sees the old plan or the new
    one), and the lineage view; with ``append``, ``packs`` and ``dropped`` added to the stored rows instead
    (core/incremental.py). ``blend``: rows with datasets, copies and epoch (BLEND_* schemas), pack_members with
    ``dataset``, ``epoch``, ``copy``. ``padded_len``: a length padded to ``multiple`` (core/cpad.py)."""
    plan_schema, dropped_schema = (BLEND_PACK_PLAN_SCHEMA, BLEND_DROPPED_SCHEMA) if blend else \
        (PACK_PLAN_SCHEMA, DROPPED_SCHEMA)
    extra = ", datasets[i] AS dataset, epoch, copies[i] AS copy" if blend else ""
    members = (f"SELECT pack_id, CAST(i AS INTEGER) - 1 AS position, sample_ids[i] AS sample_id{extra}, "
               f"CAST(ceil(sample_token_lens[i] / {int(multiple)}) * {int(multiple)} AS BIGINT) AS padded_len "
               "FROM {}, range(1, len(sample_ids) + 1) AS r(i)")
    # registered under names no table uses (connect() turns Python replacement scans off)
    with rows_relation(con, "_new_pack_plan", packs, plan_schema) as new_packs, \
            rows_relation(con, "_new_dropped", dropped, dropped_schema) as new_dropped, \
            rows_relation(con, "_new_split_pieces", list(pieces), SPLIT_PIECES_SCHEMA) as new_pieces:
        into = (lambda t: f"INSERT INTO {t} ") if append else (lambda t: f"CREATE OR REPLACE TABLE {t} AS ")
        added = "(SELECT * FROM pack_plan WHERE pack_id NOT IN (SELECT pack_id FROM pack_members))"  # (appended)
        con.execute("BEGIN")
        try:
            con.execute(into("pack_plan") + new_packs)
            con.execute(into("pack_members") + members.format(added if append else "pack_plan"))
            con.execute(into("dropped") + new_dropped)
            con.execute(f"CREATE OR REPLACE TABLE split_pieces AS {new_pieces}")
            con.execute("CREATE OR REPLACE TABLE plan_info AS SELECT ? AS info", [json.dumps(info)])
            con.execute(LINEAGE_VIEW)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")  # the old plan stays, and the connection is usable (to unregister, too)
            raise


# Megatron-Energon's index of an output folder (``.nv-meta/index.sqlite``, SQLite), as `energon prepare` makes
# it: tables first, indexes once the rows are in (core/write/energon.py fills it)
ENERGON_INDEX_TABLES = (
    "CREATE TABLE IF NOT EXISTS samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
    "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)",
    "CREATE TABLE IF NOT EXISTS sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
    "content_byte_offset INTEGER, content_byte_size INTEGER)")
ENERGON_INDEX_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
    "content_byte_offset, content_byte_size)")
