"""The helper processes of one command (`pack-assets run`): one pool, started at once, that scans and
counts shards (core/shardwork.py), then, inside `aside()`, takes work the command can hand off: the what-if
sweep (core/report.py), the audit's recount (core/audit.py) and the report's figures (core/drawing.py).

Forked from a process with a single thread: at once, with what it has imported (the CLI, before Dagster).
With other threads running (a library caller, a test runner) a fork could copy a lock another thread holds,
so the helpers come from a fork server instead (started once per process with the helper modules
imported; each helper forked from it in milliseconds, where a spawned one pays ~1 s of imports) and take
the caller's environment of the moment. A helper ends with its command: it checks twice a second that the
command's process is alive, and exits when it is gone (killed, crashed); an error in the command
terminates the helpers, so no shard is written after the command has stopped."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass

from .safety import forget_inherited_locks, pid_alive

PRELOAD = ["pack_assets.core.shardwork", "pack_assets.core.report", "matplotlib.figure"]


def _watch(pid: int) -> None:
    while pid_alive(pid):
        time.sleep(0.5)
    os._exit(70)


def _helper_init(forked: bool, command_pid: int, environ: dict[str, str]) -> None:
    if forked:
        forget_inherited_locks()
    else:
        os.environ.clear()
        os.environ.update(environ)
    threading.Thread(target=_watch, args=(command_pid,), daemon=True, name="pack_assets-watch").start()


class Helpers:
    """`n` helper processes for this command, started now; a context manager that stops them at its end
    (terminated when the block raised, KeyboardInterrupt included)."""

    def __init__(self, n: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        forked = threading.active_count() == 1 and "fork" in methods
        if forked:
            ctx = multiprocessing.get_context("fork")
        elif "forkserver" in methods:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
        else:
            ctx = multiprocessing.get_context("spawn")
        self.n, self.forked = n, forked
        self.pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_helper_init,
                                        initargs=(forked, os.getpid(), dict(os.environ)))
        self.pool.submit(int)  # forked: every helper starts now, while this process is small and single-threaded

    def close(self, terminate: bool = False) -> None:
        if terminate:
            for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(terminate=exc_type is not None)


_pool: Executor | None = None  # the helpers, inside aside()


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


def run_aside(fn: Callable, *args) -> Aside:
    """fn(*args) by a helper inside `aside()`, else now; either way its error is raised by `result()`."""
    if _pool is not None:
        with contextlib.suppress(BrokenExecutor, RuntimeError):  # a broken or closed pool: run here
            return Aside(_pool.submit(fn, *args), fn, args)
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except Exception as e:
        done.set_exception(e)
    return Aside(done, fn, args)


def warm_aside(fn: Callable, n: int = 1) -> None:
    """Have `n` helpers run fn() now (its imports) when there are helpers; nothing otherwise."""
    if _pool is not None:
        with contextlib.suppress(BrokenExecutor, RuntimeError):
            for _ in range(n):
                _pool.submit(fn)


@contextlib.contextmanager
def aside(pool: Executor) -> Iterator[None]:
    """Hand `run_aside` work to `pool` (the command's helpers) until the block ends."""
    global _pool
    outer, _pool = _pool, pool
    try:
        yield
    finally:
        _pool = outer
