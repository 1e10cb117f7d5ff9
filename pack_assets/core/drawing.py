"""Where the report's PNGs are drawn: in line, or by the executor the caller passes (the command's helper
processes, runner/procs.py).

Drawing costs matplotlib's import and a good part of a second per figure, all holding the GIL. `pack-assets
run` gives it to its helpers once they have scanned the shards: they import matplotlib (`warm()`) while
Dagster records the shards and the plan is made, and draw the audit's figures while the audit reads the
outputs back. The caller computes what a figure shows (small arrays: histograms, not samples) and sends
that with the path."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from .aside import Aside, run_aside, warm_aside


@dataclass
class Drawn:
    """A figure asked for: `wait()` before its file is read."""

    aside: Aside
    path: Path

    @property
    def data(self):
        return self.aside.args[0]

    def wait(self) -> Path:
        try:
            self.aside.result()  # (drawn here instead if its helper died)
        except Exception as e:  # matplotlib's own errors (a font it could not read) name no file: say which figure
            raise RuntimeError(f"the figure {self.path} could not be drawn: {type(e).__name__}: {e}") from e
        return self.path


def draw(pool: Executor | None, fn: Callable, data, path: Path) -> Drawn:
    """fn(data, path) by ``pool``, else now (its errors raised by `wait()`)."""
    return Drawn(run_aside(pool, fn, data, path), path)


def _warm() -> None:
    """Import matplotlib and draw one figure (fonts, Agg) before the first is asked for."""
    import io

    from matplotlib.figure import Figure

    Figure(figsize=(1, 1)).subplots().figure.savefig(io.BytesIO(), format="png", dpi=20)


def warm(pool: Executor | None, n: int = 1) -> None:
    """Have ``n`` of the pool's processes import matplotlib now (nothing without a pool): called once the shards
    are done, so the import takes a core the scan no longer needs."""
    warm_aside(pool, _warm, n)
