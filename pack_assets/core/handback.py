"""Memory a process has freed, handed back to the system between the phases of a long stage.

glibc's allocator keeps what Python and the libraries free on its heaps for reuse (it returns only a free top
of the main heap on its own); Arrow's pool keeps its freed pages too. A process that goes on with less after a
large phase then holds its peak through the next one: the audit's command held ~0.3 GiB of glibc heap with a
quarter of it in use while its workers read the outputs (docs/benchmarks.md, issue 41, session 51). Called by
the audit between its phases, by each helper after its shard (it may then wait through the pack stages), by the
command before the writer processes fork (they would share those pages) and by each writer job. Arrow's pool
(mimalloc) gives back the calling thread's pages only: call it on the thread that did the work.
"""

from __future__ import annotations

import ctypes
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: no `find_library` subprocess
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def hand_back() -> None:
    """Give the system back the freed memory this process's allocators keep: Arrow's pool's unused pages, and
    glibc's free chunks on every heap (``malloc_trim(0)``: whole free pages inside a heap too, not only its top)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
