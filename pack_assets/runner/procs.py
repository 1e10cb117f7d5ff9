"""The helper processes of one command (`pack-assets run`): the scanners, started at once, that scan and count
shards (runner/shardwork.py) and end when the shards are done, and the side helpers, which take the work the
pack stages hand off (core/aside.py): the what-if sweep (core/report.py), the audit's recount (core/audit.py)
and the report's figures (core/drawing.py). The side helpers never scan: a scanner ends holding what its scans
left on its heaps (0.14-0.64 GB at 10M samples), which it would hold through the plan, the write and the audit
(docs/benchmarks.md, issue 41, session 52). The pack stages reach the side helpers as a parameter:
`runner.orchestrate` builds the pack assets with them.

The scanners are forked from a process with a single thread: at once, with what it has imported (the CLI,
before Dagster). With other threads running (a library caller, a test runner) a fork could copy a lock another
thread holds, so they come from a fork server instead, as the side helpers always do (the command has Dagster's
threads by then): a server started here, once per process, with the helper modules imported; each helper is
forked from it in milliseconds when first needed (a spawned one pays for every import again) and takes the
caller's environment of this moment. A helper ends with its command: it checks twice a second that the
command's process is alive, and exits when it is gone (killed, crashed); the fork server ends when the command
does; an error in the command terminates the helpers, so no shard is written after the command has stopped."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver

from ..core.safety import forget_inherited_locks, pid_alive

# every module a helper's work runs in: a side helper does one task and ends, so one not imported by the server
# would be imported again for every task
PRELOAD = ["pack_assets.runner.shardwork", "pack_assets.core.report", "pack_assets.core.recount",
           "pack_assets.core.audit", "matplotlib.figure"]


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


def _server_context():
    """The fork server's context (its modules `PRELOAD`), else spawn's where there is none (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _forked_pool(n: int) -> ProcessPoolExecutor:
    """``n`` processes forked now from this single-threaded process, each having closed its copies of the
    command's locks before this returns: a helper not yet scheduled would hold a lock on after the command's
    `with` (a crashed one breaks the pool: not waited for)."""
    ctx = multiprocessing.get_context("fork")
    let_go = ctx.Semaphore(0)
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_helper_init,
                               initargs=(True, os.getpid(), dict(os.environ), let_go))
    pool.submit(int)  # every process forked now, while this process is small and single-threaded
    for _ in range(n):
        let_go.acquire(timeout=60)
    return pool


class Helpers:
    """The command's helper processes; a context manager that stops them at its end (terminated when the block
    raised, KeyboardInterrupt included). `scan`: ``n`` scanners started now (None without ``scan``), ended by
    `end_scan`. `pool`: up to ``n`` side helpers, each started from the fork server when work first needs it."""

    def __init__(self, n: int, scan: bool = True) -> None:
        server = _server_context()
        self.forked = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
        self.n, self.scan = n, None
        if scan:
            self.scan = _forked_pool(n) if self.forked else ProcessPoolExecutor(
                n, mp_context=server, initializer=_helper_init, initargs=(False, os.getpid(), dict(os.environ)))
        # one task per side helper: each ends with its task, what it held with it (the sweep's heaps, the
        # recount's tokenizer), and the next is forked from the server (milliseconds; its imports done there)
        served = server.get_start_method() == "forkserver"
        self.pool = ProcessPoolExecutor(n, mp_context=server, initializer=_helper_init,
                                        initargs=(False, os.getpid(), dict(os.environ)),
                                        max_tasks_per_child=1 if served else None)
        if served:  # the server's imports now, beside the scan, not when the plan's work comes
            forkserver.ensure_running()

    def end_scan(self) -> None:
        """End the scanners (their shards done): what they hold goes back to the system."""
        if self.scan is not None:
            self.scan.shutdown(wait=True)

    def close(self, terminate: bool = False) -> None:
        pools = [p for p in (self.scan, self.pool) if p is not None]
        if terminate:
            for pool in pools:
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(terminate=exc_type is not None)
