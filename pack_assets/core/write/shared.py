"""What both output modes share as a stage: the context every pack's ``_meta`` carries, the check that every
source is the shard the manifest scanned, the output folder (the tool's files claimed before the first write,
its Energon/wids metadata and its record at the end) and the stage's summary."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from .. import labels, owned, store
from ..indexmode import SourceChanged
from ..plan import PlanInfo, config_fingerprint
from ..results import FilePath
from ..safety import check_paths
from ..tario import first_pack_meta
from .energon import EnergonMeta, Index, IndexRows, LastIndex, write_energon_meta, write_wids_index
from .jobs import ShardResult
from .publish import Publish

# progress(result, shards done, shards in all), after each output shard written or found current
Progress = Callable[[ShardResult, int, int], None]


def write_context(info: PlanInfo) -> dict:
    """What every output shard's `_meta` carries besides its packs."""
    return {"profile": info.profile, "profile_fingerprint": info.profile_fingerprint,
            "chat_template_kwargs": json.loads(info.chat_template_kwargs or "{}"),
            "label_policy": labels.meta_value(info.config.label_policy),
            "config_fingerprint": config_fingerprint(info.config, info.profile_fingerprint),
            "max_len": info.config.max_len, "tool": "pack_assets", "tool_version": __version__,
            # context parallelism: what each sub-sample is padded to (the reader's cu_seqlens_padded); absent: 1
            **({"sample_multiple": info.config.multiple} if info.config.multiple > 1 else {})}


def check_roots(input_root: Path | Mapping, work: Path, out_dir: Path) -> None:
    """Refuse an output folder in or around an input folder (each of a recipe's) or the work folder."""
    for root in (input_root.values() if isinstance(input_root, Mapping) else [input_root]):
        check_paths(Path(root), work, out_dir)


def planned_shards(con) -> list[str]:
    """The plan's output shards, in name order."""
    return [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]


def check_sources(con, input_root: Path) -> list[str]:
    """The source shards the plan's packs take samples from, each checked: refuse to copy byte ranges out of
    a shard that is not the one the manifest scanned."""
    shards = [r[0] for r in con.execute(
        "SELECT DISTINCT shard FROM pack_members JOIN manifest_samples USING (sample_id) ORDER BY 1").fetchall()]
    rows = con.execute("SELECT shard, size, mtime_ns, status FROM shards").fetchall()
    recorded = {r[0]: (r[1], r[2], r[3]) for r in rows}
    problems = []
    for shard in shards:
        path = store.source_tar(input_root, shard)
        try:
            st = path.stat()
        except OSError as e:
            problems.append(f"{shard}: {type(e).__name__}: {e}")
            continue
        size, mtime, status = recorded.get(shard, (None, None, None))
        if (st.st_size, st.st_mtime_ns) != (size, mtime) or status == "changed":
            problems.append(f"{shard}: changed since it was scanned")
    if problems:
        raise SourceChanged("source shards differ from the manifest; rerun manifest/token_lengths/pack_plan for them "
                            "before writing: " + "; ".join(problems[:10]))
    return shards


class OutputFolder:
    """An output folder being written: the tool's files claimed before the first write (refusing when a
    planned name is not its own) and a killed run's temporary files removed; at the end its Energon and wids
    metadata, then its record trimmed to this plan (only recorded files of an earlier plan are deleted)."""

    def __init__(self, out_dir: Path, planned: set[str],
                 unchanged: Callable[[str], bool] = lambda name: False) -> None:
        """``unchanged``: whether a recorded shard is as the writer left it (`owned.claim`)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir, self.planned = out_dir, planned
        self.before = owned.claim(out_dir, planned, unchanged)
        owned.remove_temp_leftovers(out_dir, planned | set(self.before))

    def metadata(self, names: list[str], fingerprint: str, indexes: dict[str, Index] | None = None,
                 last: LastIndex | None = None, built: IndexRows | None = None) -> EnergonMeta:
        """The folder's Energon and wids metadata, every file written and fsynced first, then all renamed into
        place, each folder fsynced once (the shards' renames before them included: `publish.py`). ``built``:
        the index's rows made as the shards came (`energon.IndexRows`)."""
        with Publish() as publish:
            meta = write_energon_meta(self.out_dir, names, fingerprint, publish, indexes, last, built)
            write_wids_index(meta, publish)
            publish.commit()
        return meta

    def finish(self, meta: EnergonMeta, results: Iterable[ShardResult]) -> None:
        owned.finish(self.out_dir, self.planned, self.before)
        meta.check((r.shard, r.packs) for r in results)


@dataclass(frozen=True)
class WriteSummary:
    output_dir: Path
    shards: int
    written: int  # rewritten this run; the rest already held exactly their planned content
    skipped: int
    bytes: int
    packs: int
    seconds: float
    fingerprint: str
    foreign_files: list[str]  # files in the output folder this tool did not write: left alone
    example_meta: dict  # the first output shard's first `_meta`, for the UI
    output_mode: str = "copy"  # "index": the shards hold byte ranges into the sources, not media (bytes is the index)

    @classmethod
    def of(cls, out_dir: Path, planned: set[str], names: list[str], results: list[ShardResult], seconds: float,
           fingerprint: str, mode: str = "copy") -> WriteSummary:
        """The stage's summary: ``names`` the planned output shards, ``planned`` every file of the folder's plan."""
        first = out_dir / names[0] if names else None
        return cls(
            output_dir=out_dir, shards=len(results), written=sum(not r.skipped for r in results),
            skipped=sum(r.skipped for r in results), bytes=sum(r.bytes for r in results),
            packs=sum(r.packs for r in results), seconds=round(seconds, 3), fingerprint=fingerprint,
            foreign_files=owned.foreign_files(out_dir, planned),
            example_meta=(first_pack_meta(first) or {}) if first is not None else {}, output_mode=mode)

    @property
    def mb_per_second(self) -> float | None:
        return round(self.bytes / self.seconds / 1e6, 1) if self.seconds else None

    def as_metadata(self) -> dict:
        return {"dagster/row_count": self.packs, "output_shards": self.shards, "written": self.written,
                "skipped": self.skipped, "bytes": self.bytes, "mb_per_second": self.mb_per_second,
                "dagster/uri": FilePath(self.output_dir), "foreign_files_left_alone": self.foreign_files,
                "example_meta": self.example_meta, "output_mode": self.output_mode}
