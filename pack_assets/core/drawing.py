"""Where the report's PNGs are drawn: in line by default, or, inside `aside(pool)`, in helper processes.

Drawing costs matplotlib's import and ~0.1 s a figure, all holding the GIL. `pack-assets run` gives it
to its helpers (core/procs.py) once they have scanned the shards: they import matplotlib (`warm()`) while
Dagster records the shards and the plan is made, and draw the audit's figures while the audit reads the
outputs back. The caller computes what a figure shows (small arrays: histograms, not samples) and sends
that with the path."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future
from dataclasses import dataclass
from pathlib import Path


_pool: Executor | None = None  # set inside aside()


@dataclass
class Drawn:
    """A figure asked for: `wait()` before its file is read."""

    future: Future
    fn: Callable
    data: object
    path: Path

    def wait(self) -> Path:
        try:
            self.future.result()
        except BrokenExecutor:  # a helper died (the pool is broken): the figure is drawn here instead
            self.fn(self.data, self.path)
        return self.path


def draw(fn: Callable, data, path: Path) -> Drawn:
    """fn(data, path) by a helper inside `aside()`, else now (its errors raised here)."""
    if _pool is not None:
        with contextlib.suppress(BrokenExecutor, RuntimeError):  # a broken or closed pool: drawn here
            return Drawn(_pool.submit(fn, data, path), fn, data, path)
    fn(data, path)
    done = Future()
    done.set_result(None)
    return Drawn(done, fn, data, path)


def _warm() -> None:
    """Import matplotlib and draw one figure (fonts, Agg) before the first is asked for."""
    import io

    from matplotlib.figure import Figure

    Figure(figsize=(1, 1)).subplots().figure.savefig(io.BytesIO(), format="png", dpi=20)


def warm(n: int = 1) -> None:
    """Have the drawing helpers import matplotlib now (when they run): called once the shards are done, so
    the import takes a core the scan no longer needs. `n`: how many helpers (each imports it once)."""
    if _pool is not None:
        with contextlib.suppress(BrokenExecutor, RuntimeError):
            for _ in range(n):
                _pool.submit(_warm)


@contextlib.contextmanager
def aside(pool: Executor) -> Iterator[None]:
    """Draw in `pool` (the command's helpers, core/procs.py) until the block ends."""
    global _pool
    _pool = pool
    try:
        yield
    finally:
        _pool = None
