"""The output's bytes as the plan knows them, before any is written: a copy-mode shard holds at least each
packed sample's media and extra members (a 512-byte header each, the data padded to 512), its conversation
in its pack's record (a header and a block at least per pack), and the archive's end blocks. A write whose
shards clearly do not fit in the output folder's free space is refused before its first byte; one that
fills the disk anyway is told with the bytes its unwritten shards still need (`faults.names_full_disk`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from .. import faults, store

OUTPUT = ("output", "--output")

_BYTES = """WITH todo AS (SELECT pack_id FROM pack_plan WHERE output_shard IN (SELECT unnest(?::VARCHAR[]))),
                 subs AS (SELECT sample_id FROM todo JOIN pack_members USING (pack_id))
            SELECT (SELECT count(*) * 1024 FROM todo)
                 + (SELECT coalesce(sum(strlen(s.conversation)), 0) FROM subs JOIN manifest_samples s USING (sample_id))
                 + (SELECT coalesce(sum(512 + (m.size + 511) // 512 * 512), 0)
                    FROM subs JOIN manifest_samples s USING (sample_id) JOIN members m USING (sample_id)
                    WHERE m.name IS DISTINCT FROM s.json_member)"""


def planned_bytes(con, shards: list[str]) -> int:
    """A lower bound of the bytes these output shards take (module docstring)."""
    if not shards:
        return 0
    return con.execute(_BYTES, [shards]).fetchone()[0] + 1024 * len(shards)


# far more than a plan's output takes (each sample's source bytes twice over per copy, 8 KiB of record each):
# with this much room the bound's query (it reads every conversation) is not worth making
_ROOMY = """SELECT coalesce((SELECT sum(size) FROM shards), 0) * 2 * greatest(1, count(*) / greatest(1, count(DISTINCT
                sample_id))) + count(*) * 8192 FROM pack_members"""


def refuse_if_full(work: Path, out_dir: Path, todo: list[str], con=None) -> None:
    """``faults.NoSpace`` when the shards to write clearly do not fit in the output folder's free space.
    ``con``: the caller's catalog connection, else one is opened."""
    if not todo:
        return
    with contextlib.nullcontext(con) if con is not None else store.connect(work, read_only=True) as con:
        if faults.free_bytes(out_dir) > con.execute(_ROOMY).fetchone()[0]:
            return
        faults.check_space(out_dir, *OUTPUT, planned_bytes(con, todo))


def still_needed(work: Path, out_dir: Path, **_) -> int | None:
    """After a full disk: the bytes of the planned shards not in the output folder yet (a lower bound)."""
    try:
        with store.connect(Path(work), read_only=True) as con:
            names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan").fetchall()]
            return planned_bytes(con, [n for n in names if not (Path(out_dir) / n).exists()]) or None
    except Exception:  # the catalog unreadable too: the line goes without the figure
        return None
