"""Python's cyclic garbage collector paused around bulk work that makes many objects and no reference cycle."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The collector off inside, back to its state after. Only for work that makes no reference cycle (its
    caller's test shows it): reference counting then frees everything, and the collector's passes over the many
    objects made meanwhile would cost time for nothing; a cycle made by mistake waits until the block ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
