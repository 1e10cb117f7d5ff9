"""The catalog's tables as pandas DataFrames, for a notebook: what was read, counted, planned, dropped and
rejected (the tables of docs/formats.md), read from a work folder's DuckDB file, read-only.

    from pack_assets import catalog
    t = catalog.tables("work")              # {"samples": DataFrame, "members": ..., "dropped": ...}
    t["rejected"].groupby("reason").size()
    catalog.sql("work", "SELECT media_type, avg(total_token_len) FROM pack_plan GROUP BY 1")

A recipe's work folder holds one catalog per epoch (``epoch-<k>/``): ``epoch=k`` reads that one; without it the
plan's tables (``pack_plan``, ``pack_members``, ``dropped``, each with its ``epoch`` column) are every epoch's,
one after the other, and the sample tables (the same in every epoch) the first epoch's. pandas is imported
here only, never by the pipeline or the CLI.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from .core import store

SAMPLE_TABLES = ("samples", "members", "rejected", "token_lengths")  # one per input, shared by a recipe's epochs
PLAN_TABLES = ("pack_plan", "pack_members", "dropped")  # one per plan (per epoch of a recipe)
TABLES = SAMPLE_TABLES + PLAN_TABLES


def catalogs(work: str | Path, epoch: int | None = None) -> list[Path]:
    """The catalog folders to read: the work folder's own, or a recipe's epoch folders (``epoch`` one of them)."""
    work = Path(work)
    if (work / store.DB_NAME).is_file():
        if epoch is not None:
            raise ValueError(f"{work}: a single plan's work folder has no epoch-<k> catalogs (epoch={epoch})")
        return [work]
    epochs = sorted(p for p in work.glob("epoch-[0-9][0-9][0-9]") if (p / store.DB_NAME).is_file())
    if not epochs:
        raise FileNotFoundError(
            f"no pack_assets catalog in {work}: run `pack-assets run` first (or give the --work folder)"
        )
    if epoch is None:
        return epochs
    chosen = [p for p in epochs if p.name == f"epoch-{epoch:03d}"]
    if not chosen:
        raise ValueError(f"{work}: no catalog for epoch {epoch} (epochs: {', '.join(p.name for p in epochs)})")
    return chosen


def _read(folder: Path, query: str, params: list | None = None) -> pd.DataFrame:
    try:
        con = store.connect(folder, read_only=True)
    except duckdb.IOException as e:  # a stage of a run holds it for writing
        raise RuntimeError(
            f"{folder / store.DB_NAME} is in use by a running stage; read it when that ends ({e})"
        ) from None
    with con:
        return con.execute(query, params or []).df()


def table(work: str | Path, name: str, epoch: int | None = None, limit: int | None = None) -> pd.DataFrame:
    """One table of the catalog (``TABLES``) as a DataFrame, at most ``limit`` rows of it."""
    if name not in TABLES:
        raise ValueError(f"{name!r} is not a catalog table: {', '.join(TABLES)}")
    folders = catalogs(work, epoch)
    if name in SAMPLE_TABLES:
        folders = folders[:1]
    query = f"SELECT * FROM {name}" + (" LIMIT ?" if limit is not None else "")
    frames = [_read(f, query, [limit] if limit is not None else None) for f in folders]
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return out if limit is None else out.head(limit)


def tables(work: str | Path, epoch: int | None = None) -> dict[str, pd.DataFrame]:
    """Every table of ``TABLES``, by name."""
    return {name: table(work, name, epoch) for name in TABLES}


def sql(work: str | Path, query: str, epoch: int | None = None) -> pd.DataFrame:
    """A query over one catalog (a recipe's: ``epoch``, default its first) as a DataFrame; the connection is
    read-only, so a statement that writes fails."""
    return _read(catalogs(work, epoch)[0], query)
