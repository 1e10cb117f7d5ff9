"""Typed progress events of a run's stages, from the Dagster assets (defs/assets.py) to whoever follows
the run in the same process: `pack-assets run` executes its Dagster runs in process and shows the events on
a terminal (runner/progress.py). Under `dagster dev` nobody listens; the assets' log lines say the same in the UI.

A listener is added for a scope (`listening`), like a logging handler; `emit` calls each in turn. A listener
that raises is dropped and its error logged once: the display of a run never fails the run."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

SCAN, COUNT, PLAN, WRITE, AUDIT = "scan", "count", "plan", "write", "audit"


@dataclass(frozen=True)
class Progress:
    """`done` of `total` units of a stage; `count` of `count_unit` so far (samples scanned, packs written,
    members re-hashed); `item`: the shard just done, for the shard stages."""

    stage: str
    done: int
    total: int
    unit: str
    count: int = 0
    count_unit: str = ""
    item: str = ""


Listener = Callable[[Progress], None]
_listeners: list[Listener] = []


def emit(event: Progress) -> None:
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception:
            _listeners.remove(listener)
            logging.getLogger(__name__).warning("a progress listener failed; it gets no more events of this run",
                                                exc_info=True)


@contextlib.contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """`listener` gets every event emitted in this process while the block runs (None: nothing to add)."""
    if listener is None:
        yield
        return
    _listeners.append(listener)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # dropped already (it raised)
            _listeners.remove(listener)
