"""Memory a process freed but its allocators keep for reuse, handed back to the system: where a process holds
what its last piece of work freed while it waits, or before it forks children that would share those pages."""

from __future__ import annotations

import ctypes
import sys


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries have none (then nothing to do)
    except (AttributeError, OSError):
        return None


_TRIM = _malloc_trim()


def give_back() -> None:
    """Arrow's pool's freed memory (mimalloc's: this thread's, so call it in the thread that did the work), then
    the C library's free pages in every arena (glibc's malloc_trim). The memory in use stays; what is handed
    back costs a page fault when it is used again."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)
