"""packed_shards stage: one output sample per pack, in copy mode (media copied by byte range) or index mode
(byte ranges into the sources instead). The caller chooses the mode: `run_write` or `run_write_index`.

The modules, each on the ones before it:

| module | owns |
|---|---|
| `publish.py` | files put in place as one batch: all fsynced side by side, each folder fsynced once |
| `energon.py` | Energon's `.nv-meta/` and `.tar.idx`, webdataset's `wids-index.json` |
| `jobs.py` | the job types (output shard -> packs -> sub-samples), gathered from the catalog; the pack document |
| `syscalls.py` | moving bytes: `copy_file_range`, one `pread` per sample into a reused buffer, `writev`, advice |
| `fingerprints.py` | which output shards already hold their planned content (`current_shards`) |
| `layout.py` | a shard's tar headers, paddings and member offsets built at once; its Energon index from them |
| `places.py` | where a shard's bytes come from: one `pread` per sample's span, or a copy in kernel, all at once |
| `bulk.py` | a copy-mode shard prepared in bulk from the catalog: documents, reads, members, fingerprint |
| `batches.py` | a copy-mode shard from its Arrow rows, a batch of packs at a time (memory per batch, not shard) |
| `record.py` | the writer's record of what it wrote: the next write and the audit trust it while it holds |
| `shard.py` | one copy-mode output shard written atomically (`write_shard`) |
| `space.py` | the plan's output bytes (a lower bound): a write that clearly does not fit is refused up front |
| `shared.py` | what both modes share as a stage: `_meta`'s context, the source check, the folder, the summary |
| `copy.py`, `index.py` | the two modes as stages (`run_write`, `run_write_index`) |
"""

from .copy import run_write
from .index import run_write_index
from .shared import SourceChanged, WriteSummary, write_context

__all__ = ["SourceChanged", "WriteSummary", "run_write", "run_write_index", "write_context", "writer"]

WRITERS = {"copy": run_write, "index": run_write_index}  # Settings.output_mode -> the stage


def writer(mode: str):
    """The stage of an output mode (`Settings.output_mode`): the one place a mode's name picks its writer."""
    if mode not in WRITERS:
        raise ValueError(f"output mode {mode!r}: expected one of {', '.join(WRITERS)}")
    return WRITERS[mode]
