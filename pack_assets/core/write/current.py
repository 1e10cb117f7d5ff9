"""Which output shards on disk hold exactly their planned content, in either mode, as the audit asks: from
the writer's record while it holds, else by the fingerprint query."""

from __future__ import annotations

import functools
from pathlib import Path

from ..indexmode import index_root, load_index, sources_unchanged
from ..plan import PlanInfo
from .fingerprints import ShardFingerprint, current_shards
from .index import IndexFingerprint, index_context
from .record import written_key, written_stamps
from .shared import planned_shards, write_context


def current_stamps(con, work: Path, out_dir: Path, info: PlanInfo) -> dict[str, list]:
    """[size, mtime_ns, fingerprint] of each planned output shard on disk with exactly its planned content.
    Copy mode: the writer's record, while it holds, spares the fingerprint query over every sample. Index
    mode: its shards are current only while every source they name is as indexed."""
    index = load_index(out_dir)
    if index is None:
        context, fingerprint = write_context(info), ShardFingerprint
        stamps = written_stamps(work, written_key(con, info, context), out_dir, planned_shards(con))
        if stamps is not None:
            return stamps
    else:
        context = index_context(info)
        fingerprint = functools.partial(IndexFingerprint, root=index_root(index))
    stamps = {}
    for r in current_shards(con, out_dir, context, fingerprint):
        st = (out_dir / r.shard).stat()
        stamps[r.shard] = [st.st_size, st.st_mtime_ns, r.fingerprint]
    return {} if index is not None and not sources_unchanged(index) else stamps
