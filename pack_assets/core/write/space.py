"""The output's bytes as the plan knows them, before any is written: a copy-mode shard holds at least each
packed sample's media and extra members (a 512-byte header each, the data padded to 512), its conversation
in its pack's record (a header and a block at least per pack), and the archive's end blocks. A write whose
shards clearly do not fit in the output folder's free space is refused before its first byte; one that
fills the disk anyway is told with the bytes its unwritten shards still need (`faults.names_full_disk`).

Both figures look at the shards to write only, never at the whole catalog: their samples' ids bound the rows
read (a rerun that adds one input shard reads that shard's rows, not every conversation of the catalog)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from .. import faults, store

OUTPUT = ("output", "--output")

_TODO = "SELECT pack_id FROM pack_plan WHERE output_shard IN (SELECT unnest($shards::VARCHAR[]))"
# ``lo``/``hi`` (the samples' least and greatest ids) only let DuckDB skip the Parquet row groups of other samples
_BYTES = f"""WITH todo AS ({_TODO}), subs AS (SELECT sample_id FROM todo JOIN pack_members USING (pack_id)),
                 src AS (SELECT sample_id, conversation, json_member FROM manifest_samples
                         WHERE sample_id BETWEEN $lo AND $hi)
            SELECT (SELECT count(*) * 1024 FROM todo)
                 + (SELECT coalesce(sum(strlen(s.conversation)), 0) FROM subs JOIN src s USING (sample_id))
                 + (SELECT coalesce(sum(512 + (m.size + 511) // 512 * 512), 0)
                    FROM subs JOIN src s USING (sample_id)
                    JOIN (SELECT sample_id, name, size FROM members WHERE sample_id BETWEEN $lo AND $hi) m
                      USING (sample_id)
                    WHERE m.name IS DISTINCT FROM s.json_member)"""
_SPAN = f"""SELECT min(sample_id), max(sample_id), count(*), count(DISTINCT sample_id) FROM pack_members
            WHERE pack_id IN ({_TODO})"""
# the input shards that may hold those samples: a sample id is "<shard>/<key>" (a piece's "<sample id>#<k>",
# core/scan.py, core/split.py), so each shard's ids lie in ["<shard>/", "<shard>0") ('0' follows '/')
_SOURCE_BYTES = "SELECT coalesce(sum(size), 0) FROM shards WHERE shard || '/' <= $hi AND shard || '0' > $lo"


@dataclass(frozen=True)
class Span:
    """The members of the output shards to write: their least and greatest sample ids, how many, how many
    distinct (a blend's plan holds copies)."""

    lo: str | None
    hi: str | None
    members: int
    distinct: int

    @classmethod
    def of(cls, con, shards: list[str]) -> Span:
        lo, hi, members, distinct = con.execute(_SPAN, {"shards": shards}).fetchone()
        return cls(lo, hi, members, distinct)


def planned_bytes(con, shards: list[str], span: Span | None = None) -> int:
    """A lower bound of the bytes these output shards take (module docstring)."""
    if not shards:
        return 0
    span = span or Span.of(con, shards)
    found = con.execute(_BYTES, {"lo": span.lo or "", "hi": span.hi or "", "shards": shards}).fetchone()[0]
    return found + 1024 * len(shards)


def roomy_bytes(con, span: Span) -> float:
    """Far more than the shards take (their samples' source shards' bytes twice over per copy, 8 KiB of record
    each): with this much room free the bound's query (it reads their conversations) is not worth making."""
    if not span.members:
        return 0
    source = con.execute(_SOURCE_BYTES, {"lo": span.lo, "hi": span.hi}).fetchone()[0]
    return source * 2 * max(1.0, span.members / max(1, span.distinct)) + span.members * 8192


def refuse_if_full(work: Path, out_dir: Path, todo: list[str], con=None) -> None:
    """``faults.NoSpace`` when the shards to write clearly do not fit in the output folder's free space.
    ``con``: the caller's catalog connection, else one is opened."""
    if not todo:
        return
    with contextlib.nullcontext(con) if con is not None else store.connect(work, read_only=True) as con:
        span = Span.of(con, todo)
        if faults.free_bytes(out_dir) > roomy_bytes(con, span):
            return
        faults.check_space(out_dir, *OUTPUT, planned_bytes(con, todo, span))


def still_needed(work: Path, out_dir: Path, **_) -> int | None:
    """After a full disk: the bytes of the planned shards not in the output folder yet (a lower bound)."""
    try:
        with store.connect(Path(work), read_only=True) as con:
            names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan").fetchall()]
            return planned_bytes(con, [n for n in names if not (Path(out_dir) / n).exists()]) or None
    except Exception:  # the catalog unreadable too: the line goes without the figure
        return None
