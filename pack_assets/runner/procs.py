"""The helper processes of one command (`pack-assets run`): one pool, started at once, that scans and
counts shards (runner/shardwork.py), then takes the work the pack stages hand off (core/aside.py): the
what-if sweep (core/report.py), the audit's recount (core/audit.py) and the report's figures
(core/drawing.py). The pool reaches them as a parameter: `runner.orchestrate` builds the pack assets with it.

Forked from a process with a single thread: at once, with what it has imported (the CLI, before Dagster).
With other threads running (a library caller, a test runner) a fork could copy a lock another thread holds,
so the helpers come from a fork server instead (started once per process with the helper modules
imported; each helper forked from it in milliseconds, where a spawned one pays for every import again) and take
the caller's environment of the moment. A helper ends with its command: it checks twice a second that the
command's process is alive, and exits when it is gone (killed, crashed); an error in the command
terminates the helpers, so no shard is written after the command has stopped."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from ..core.safety import forget_inherited_locks, pid_alive

PRELOAD = ["pack_assets.runner.shardwork", "pack_assets.core.report", "matplotlib.figure"]


def _watch(pid: int) -> None:
    while pid_alive(pid):
        time.sleep(0.5)
    os._exit(70)


def _helper_init(forked: bool, command_pid: int, environ: dict[str, str], let_go=None) -> None:
    if forked:
        forget_inherited_locks()
        let_go.release()
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
        let_go = ctx.Semaphore(0) if forked else None
        self.pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_helper_init,
                                        initargs=(forked, os.getpid(), dict(os.environ), let_go))
        self.pool.submit(int)  # forked: every helper starts now, while this process is small and single-threaded
        # and has closed its copies of the command's locks before the command can leave them: a helper not yet
        # scheduled would hold a lock on after the command's `with` (a crashed one breaks the pool: not waited for)
        for _ in range(n if forked else 0):
            let_go.acquire(timeout=60)

    def close(self, terminate: bool = False) -> None:
        if terminate:
            for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(terminate=exc_type is not None)
