"""Where the report's PNGs are drawn: in line by default, or, inside `procs.aside(pool)`, in helper processes.

Drawing costs matplotlib's import and ~0.1 s a figure, all holding the GIL. `pack-assets run` gives it
to its helpers (core/procs.py) once they have scanned the shards: they import matplotlib (`warm()`) while
Dagster records the shards and the plan is made, and draw the audit's figures while the audit reads the
outputs back. The caller computes what a figure shows (small arrays: histograms, not samples) and sends
that with the path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procs


@dataclass
class Drawn:
    """A figure asked for: `wait()` before its file is read."""

    aside: procs.Aside
    path: Path

    @property
    def data(self):
        return self.aside.args[0]

    def wait(self) -> Path:
        self.aside.result()  # (drawn here instead if its helper died)
        return self.path


def draw(fn: Callable, data, path: Path) -> Drawn:
    """fn(data, path) by a helper inside `procs.aside()`, else now (its errors raised by `wait()`)."""
    return Drawn(procs.run_aside(fn, data, path), path)


def _warm() -> None:
    """Import matplotlib and draw one figure (fonts, Agg) before the first is asked for."""
    import io

    from matplotlib.figure import Figure

    Figure(figsize=(1, 1)).subplots().figure.savefig(io.BytesIO(), format="png", dpi=20)


def warm(n: int = 1) -> None:
    """Have the drawing helpers import matplotlib now (when they run): called once the shards are done, so
    the import takes a core the scan no longer needs. `n`: how many helpers (each imports it once)."""
    procs.warm_aside(_warm, n)
