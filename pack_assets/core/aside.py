"""Work a stage can hand off while it goes on (the what-if sweep, the audit's recount, the report's figures):
to the executor the caller passes, typically the command's helper processes (runner/procs.py), or done in
line when there is none. Where it runs is always a parameter; a broken executor costs no result, only the
time: the work is done here instead."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, Future
from dataclasses import dataclass


@dataclass
class Aside:
    """fn(*args) handed to a helper: `result()` waits for it, or computes it here when the helper died."""

    future: Future
    fn: Callable
    args: tuple

    def result(self):
        try:
            return self.future.result()
        except BrokenExecutor:
            return self.fn(*self.args)


def run_aside(pool: Executor | None, fn: Callable, *args) -> Aside:
    """fn(*args) by ``pool``, or now without one (or when it is broken or closed); either way its error is raised
    by `result()`."""
    if pool is not None:
        with contextlib.suppress(BrokenExecutor, RuntimeError):  # a broken or closed pool: run here
            return Aside(pool.submit(fn, *args), fn, args)
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except Exception as e:
        done.set_exception(e)
    return Aside(done, fn, args)
