"""The command's helper processes (runner/procs.py) and the figures drawn there (core/drawing.py): the same PNG
bytes as drawn in line, drawn in another process, no figure lost when a helper dies, and helpers that end
with their command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pack_assets.core import drawing, report
from pack_assets.runner.procs import Helpers

REPO = Path(__file__).resolve().parent.parent


def _sim() -> tuple[np.ndarray, dict, dict]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 9000, 5000)
    media = {"image": lengths[:3000], "text": lengths[3000:]}
    results = [{"max_len": m, "algorithm": a, "efficiency": 0.9 + m / 1e6 + (a == "bfd") / 100}
               for m in (2048, 4096, 8192) for a in ("bfd", "next_fit")]
    return lengths, {"results": results, "recommended_max_len": 4096}, media


def _pid(_, path: Path) -> None:
    path.write_text(str(os.getpid()))


def test_figures_drawn_aside_are_the_bytes_drawn_in_line_and_drawn_elsewhere(tmp_path):
    lengths, sim, media = _sim()
    inline = report.plot_simulation(lengths, sim, tmp_path / "inline", media)
    with Helpers(1) as helpers:
        aside = report.plot_simulation(lengths, sim, tmp_path / "aside", media, pool=helpers.pool)
        where = drawing.draw(helpers.pool, _pid, None, tmp_path / "pid").wait()
    assert int(where.read_text()) != os.getpid()  # drawn in the helper, not here
    assert set(inline) == set(aside) == {"length_distribution", "fill_vs_max_len"}
    for k in inline:
        assert open(inline[k], "rb").read() == open(aside[k], "rb").read(), k
    assert int(drawing.draw(None, _pid, None, tmp_path / "pid").wait().read_text()) == os.getpid()  # no pool: here


def test_the_what_if_beside_the_plan_draws_what_plot_simulation_draws_of_its_sweep(tmp_path):
    """The what-if's two figures are drawn by helpers from the lengths the plan reads (the fill figure where
    its sweep is simulated): the same bytes as `plot_simulation` of that sweep, in line or aside."""
    from pack_assets.core.plan import PlanConfig

    lengths, _, media = _sim()
    rows = {"lengths": lengths, "media_types": np.array(["image"] * 3000 + ["text"] * 2000, dtype=object)}
    inline = report.start_what_if(tmp_path / "inline", PlanConfig(max_len=4096), rows)("fp")
    with Helpers(2) as helpers:
        aside = report.start_what_if(tmp_path / "aside", PlanConfig(max_len=4096), rows, helpers.pool)("fp")
    def timeless(w):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in w.results], w.recommended_max_len

    assert timeless(inline) == timeless(aside)
    drawn = report.plot_simulation(lengths, {"results": inline.results, "recommended_max_len":
                                             inline.recommended_max_len}, tmp_path / "drawn", media)
    assert set(inline.plots) == set(aside.plots) == set(drawn)
    for k in drawn:
        assert Path(inline.plots[k]).read_bytes() == Path(aside.plots[k]).read_bytes() == Path(drawn[k]).read_bytes(), k
    assert report.read_what_if(tmp_path / "aside", "fp") == aside
    # drawn under temporary names, moved into place when the plan is made: none is left behind
    assert sorted(p.name for p in (tmp_path / "aside" / "plots").iterdir()) == sorted(f"{k}.png" for k in drawn)


def test_a_histogram_binned_where_the_values_are_draws_as_ax_hist_draws_them(tmp_path):
    from matplotlib.figure import Figure

    values = np.random.default_rng(1).integers(0, 5000, 2000)

    def png(fill) -> bytes:
        fig = Figure(figsize=(4, 3))
        fill(fig.subplots())
        fig.savefig(tmp_path / "f.png", dpi=50)
        return (tmp_path / "f.png").read_bytes()

    assert png(lambda ax: report._bars(ax, report._hist(values, 60), log=True)) == \
        png(lambda ax: ax.hist(values, bins=60, log=True))


def _pid_then_wait(_, path: Path) -> None:
    _pid(_, path)
    time.sleep(60)


def test_a_helper_that_dies_costs_no_figure(tmp_path):
    lengths, sim, media = _sim()
    with Helpers(1, scan=False) as helpers:
        drawing.draw(helpers.pool, _pid_then_wait, None, tmp_path / "pid")  # a side helper busy with it
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            time.sleep(0.05)
        helper = int((tmp_path / "pid").read_text())
        assert helper != os.getpid()
        os.kill(helper, signal.SIGKILL)
        plots = report.plot_simulation(lengths, sim, tmp_path / "after", media, pool=helpers.pool)
    assert all(os.path.getsize(p) > 1000 for p in plots.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z" if Path(f"/proc/{pid}").exists() else True


@pytest.mark.parametrize("threads", [0, 1], ids=["forked", "fork-server"])
def test_helpers_end_with_their_command_and_an_error_stops_them(tmp_path, threads):
    """A command killed outright leaves no helper behind (they watch its pid); one that raises terminates
    them at once, so no queued shard is scanned after it stopped. Forked helpers let go of the command's
    work lock: once the command leaves it, the folder is free while the helpers live on."""
    script = f"""
import os, sys, threading, time
sys.path.insert(0, {str(REPO)!r})
from pack_assets.runner.procs import Helpers
from pack_assets.core.safety import work_lock
if {threads}:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
with work_lock({str(tmp_path)!r}, "test"):
    h = Helpers(2)
    pids = [h.scan.submit(os.getpid).result() for _ in range(4)]
busy = h.pool.submit(time.sleep, 60)  # a side helper at work
print(h.forked, *sorted(set(pids)), "side", *h.pool._processes, flush=True)
time.sleep(60)
"""
    from pack_assets.core.safety import work_lock

    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    forked, *pids = proc.stdout.readline().split()
    assert forked == str(threads == 0) and pids.index("side") > 0 and pids[-1] != "side"
    pids.remove("side")  # the scanners, then the side helper
    assert all(_alive(int(p)) for p in pids)
    with work_lock(tmp_path, "while the helpers live", wait=0):
        pass
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(int(p)) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(int(p)) for p in pids)

    started = []
    with pytest.raises(KeyError), Helpers(1) as helpers:
        helpers.pool.submit(time.sleep, 60)  # (first: its fork waits for the fork server's imports)
        futures = [helpers.scan.submit(time.sleep, 0.5) for _ in range(20)]
        started = [*(helpers.scan._processes or {}), *(helpers.pool._processes or {})]
        raise KeyError("the command failed")
    assert started and not any(_alive(p) for p in started)
    assert sum(f.done() and not f.cancelled() and f.exception() is None for f in futures) <= 2


def test_a_forked_helper_slow_to_start_does_not_hold_the_work_lock_after_the_command_leaves_it(tmp_path):
    """The second helper is forked but not yet run (a loaded machine): it still holds its copy of the command's
    lock descriptor until its start-up closes it, so `Helpers` returns only once every forked helper has."""
    script = f"""
import os, sys, time
sys.path.insert(0, {str(REPO)!r})
from pack_assets.runner.procs import Helpers
from pack_assets.core.safety import work_lock
forks = [0]
os.register_at_fork(after_in_parent=lambda: forks.__setitem__(0, forks[0] + 1),
                    after_in_child=lambda: forks[0] == 1 and time.sleep(3))
with work_lock({str(tmp_path)!r}, "test"):
    h = Helpers(2)
    h.pool.submit(int).result()
print(h.forked, flush=True)
time.sleep(60)
"""
    from pack_assets.core.safety import work_lock

    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["True"]
        with work_lock(tmp_path, "once the command left it", wait=0):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_the_scanners_end_once_the_shards_are_done_and_the_side_work_runs_in_other_processes(tmp_path):
    """A scanner holds what its scans left on its heaps (0.14-0.64 GB each at 10M samples): it ends once the
    last shard is done, before the plan, and the pack stages' side work (here the what-if sweep and its figures)
    runs in side helpers that never scanned, with the outputs it gives in line."""
    from conftest import small_dataset

    from pack_assets.core.plan import PlanConfig
    from pack_assets.core.settings import Settings
    from pack_assets.runner import shardwork

    inp = small_dataset(tmp_path / "in", n_shards=3, per_shard=9)
    settings = Settings(input_dir=str(inp), work_dir=str(tmp_path / "work"), output_dir=str(tmp_path / "out"))
    work = shardwork.find(settings)
    lengths, _, _ = _sim()
    rows = {"lengths": lengths, "media_types": np.array(["image"] * 3000 + ["text"] * 2000, dtype=object)}
    inline = report.start_what_if(tmp_path / "inline", PlanConfig(max_len=4096), rows)("fp")
    with Helpers(2) as helpers:
        shardwork.start(work, settings, helpers)
        scanners = list(helpers.scan._processes)
        assert len(scanners) == 2 and all(_alive(p) for p in scanners)
        done = []
        work.wait(work.todo[:2], lambda key, n, err: done.append((key, n, err)))
        assert all(_alive(p) for p in scanners)  # a shard still to do: the scanners go on
        work.wait(work.todo[2:], lambda key, n, err: done.append((key, n, err)))
        assert sorted((k, e) for k, _, e in done) == [(k, None) for k in work.todo]
        assert not any(_alive(p) for p in scanners)  # the last shard done: no scanner left
        aside = report.start_what_if(tmp_path / "aside", PlanConfig(max_len=4096), rows, helpers.pool)("fp")
        side = {int(drawing.draw(helpers.pool, _pid, None, tmp_path / f"pid{i}").wait().read_text()) for i in range(4)}
    assert side and not side & {os.getpid(), *scanners}
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in aside.results] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in inline.results]
    for k in inline.plots:
        assert Path(inline.plots[k]).read_bytes() == Path(aside.plots[k]).read_bytes(), k
