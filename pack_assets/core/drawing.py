"""Where the report's PNGs are drawn: in line, or by the executor the caller passes (the command's helper
processes, runner/procs.py).

Drawing costs matplotlib's import and a good part of a second per figure, all holding the GIL. `pack-assets
run` gives it to its side helpers, each forked for its task from a server that imported matplotlib once: they
draw the what-if figures while the plan is made and the audit's while the audit reads the outputs back. The
caller computes what a figure shows (small arrays: histograms, not samples) and sends that with the path."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from .aside import Aside, run_aside


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
