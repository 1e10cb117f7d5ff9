"""The catalog's per-shard views (`store.build_catalog`: manifest_samples, members, shards, token_lengths) read
over only the files of some source shards: a query about a few output shards' samples (a rerun's new shard)
then reads those shards' rows, not every shard's (docs/benchmarks.md, issue 41). The rows it gives are the
views' rows of those shards, so a query whose every row comes from them gives what it gives over the views."""

from __future__ import annotations

import os
import re

import duckdb

VIEWS = ("members", "manifest_samples", "token_lengths", "shards")
_READ = re.compile(r"\b(FROM|JOIN)\s+(" + "|".join(VIEWS) + r")\b")
_PARQUET = re.compile(r"'(?:[^']|'')*?\.parquet'")


def over(con, view: str, folders: set[str]) -> str:
    """``view`` over only those of its files that lie in ``folders`` (the files' names as the view's own SQL has
    them): its rows of the source shards of those folders, the other shards' files unread."""
    sql = con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal AND view_name = ?", [view]).fetchone()[0]
    files = [q for q in _PARQUET.findall(sql or "") if os.path.dirname(q[1:-1].replace("''", "'")) in folders]
    return f"SELECT * FROM read_parquet([{', '.join(files)}])" if files else f"FROM {view} WHERE false"


def within(con, sql: str, folders: set[str] | None) -> str:
    """``sql`` with each per-shard view it reads (``FROM view`` or ``JOIN view``) read `over` ``folders``: a
    common table expression of the view's name before the query's own, which takes the view's place;
    unchanged when ``folders`` is None (not known)."""
    if folders is None:
        return sql
    views = sorted({m[1] for m in _READ.findall(sql)})
    ctes = ", ".join(f"{v} AS ({over(con, v, folders)})" for v in views)
    head, rest = (sql.lstrip()[5:], ", ") if sql.lstrip()[:5].upper() == "WITH " else (sql, " ")
    return f"WITH {ctes}{rest}{head}" if views else sql


def source_folders(con, output_shard: str) -> set[str] | None:
    """The catalog folders (manifest and token counts) of the source shards one output shard's planned samples come
    from, by their ids (`scan`'s ``{shard}/{key}``: every catalog shard whose name and a slash begin an id, so
    a name that is a prefix of another adds folders, never misses one); None when a planned sample id (or a split
    piece's, ``{sample id}#k``) begins with no catalog shard's name, or the catalog does not list its shards'
    folders (built before it did)."""
    try:
        rows = con.execute(
            """WITH planned AS (SELECT DISTINCT pm.sample_id FROM pack_plan p JOIN pack_members pm USING (pack_id)
                                WHERE p.output_shard = ?),
                    matched AS (SELECT pl.sample_id, c.manifest_dir, c.token_dir FROM planned pl
                                LEFT JOIN catalog_shards c ON starts_with(pl.sample_id, c.shard || '/'))
               SELECT DISTINCT manifest_dir, token_dir FROM matched""", [output_shard]).fetchall()
    except duckdb.CatalogException:  # a catalog without catalog_shards
        return None
    if any(m is None for m, _ in rows):
        return None
    return {f for r in rows for f in r}
