"""A pytest plugin: each test's CPU seconds (its setup, call and teardown; this process's and its waited-for
children's user + system time), appended to ``$PYTEST_CPU_OUT`` as ``seconds<TAB>node id<TAB>worker<TAB>start<TAB>
end`` lines (worker: the xdist worker's id, or ``main``; start and end: the wall clock, epoch seconds, at the
test's setup and at the end of its teardown, to draw each worker's timeline), each process's session total last.
For comparing the suite's CPU before and after a change in one sitting on a shared machine, where wall-clock
durations say more about the load than about the test. Children not waited for by the test's process are not in
its figures: the command's helper processes, forked from a fork server under pytest-xdist, are counted when
the fork server ends with the worker (time the whole tree, e.g. `/usr/bin/time`, for totals).

    PYTHONPATH=.:bench PYTEST_CPU_OUT=/tmp/after.tsv python -m pytest -q -n 0 -p pytest_cpu tests/test_x.py
"""

from __future__ import annotations

import os
import resource
import time

import pytest

_SPENT: dict[str, float] = {}
_STARTED: dict[str, float] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _out() -> str:
    return os.environ.get("PYTEST_CPU_OUT", "pytest_cpu.tsv")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _STARTED.setdefault(item.nodeid, time.time())
    t = _cpu()
    yield
    _SPENT[item.nodeid] = _SPENT.get(item.nodeid, 0.0) + _cpu() - t


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    t = _cpu()
    yield
    _SPENT[item.nodeid] = _SPENT.get(item.nodeid, 0.0) + _cpu() - t


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    t = _cpu()
    yield
    _SPENT[item.nodeid] = _SPENT.get(item.nodeid, 0.0) + _cpu() - t
    with open(_out(), "a", encoding="utf-8") as f:
        f.write(f"{_SPENT[item.nodeid]:.2f}\t{item.nodeid}\t{_worker()}\t{_STARTED[item.nodeid]:.2f}\t{time.time():.2f}\n")


def pytest_sessionstart(session):
    session.config.stash[_START] = _cpu()


def pytest_sessionfinish(session):
    with open(_out(), "a", encoding="utf-8") as f:
        f.write(f"# session total {_cpu() - session.config.stash[_START]:.2f} {_worker()}\n")


_START = pytest.StashKey[float]()
