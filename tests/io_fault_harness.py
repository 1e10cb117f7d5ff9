"""I/O errors injected for real (Debian's libfiu, `fiu-run -x`) into one stage of the pipeline, and the
verdict on what the run did. Used by test_faults.py (a few runs) and bench/soak_io_faults.py (the soak).

    fiu-run -x python io_fault_harness.py INPUT ROOT '[{"run": 0, "seed": 1, "stage": "write", ...}]'

runs, for each fault, `fault_harness.run_pipeline`'s stages in ROOT/r<run>/{work,out}, turning libfiu's
failure points on (`fiu_enable_random` through ctypes, seeded with `fiu_set_prng_seed`) at the start of its
stage and off at its end. Before that it runs the pipeline once on a tiny dataset of its own, so Python's
lazy imports are done: the faults land on the data's files, not on the interpreter's. Per run: exit 0 the
audit passed, 3 it did not, 2 the run stopped with the line `pack-assets run` prints for a failed step; a
process that dies or hangs is a crash or a hang.

libfiu's short-read/short-write points (`.../reduce`) are left out: libfiu 1.1 divides by zero in them on a
zero-byte request (SIGFPE in the C library wrapper, not in the program). `copy_file_range` has no libfiu point.
"""

from __future__ import annotations

import ctypes
import errno
import faulthandler
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fault_harness import snapshot  # noqa: E402  (the catalog, output and plan a run is judged by)

POINTS = {
    "read": ["posix/io/rw/read", "posix/io/rw/pread", "posix/io/rw/readv", "posix/io/rw/preadv"],
    "write": ["posix/io/rw/write", "posix/io/rw/pwrite", "posix/io/rw/writev", "posix/io/rw/pwritev"],
    "sync": ["posix/io/sync/fsync", "posix/io/sync/fdatasync"],
}
POINTS["all"] = POINTS["read"] + POINTS["write"] + POINTS["sync"]
STAGES = ["scan", "count", "plan", "write", "audit"]
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC}


def fiu_available() -> bool:
    return shutil.which("fiu-run") is not None and Path("/usr/lib/fiu/fiu_posix_preload.so").exists()


class Faults:
    """libfiu's failure points, on for one stage."""

    def __init__(self, seed: int, points: list[str], probability: float, err: int) -> None:
        self.lib = ctypes.CDLL("libfiu.so.0")
        self.lib.fiu_enable_random.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_float]
        self.lib.fiu_set_prng_seed.argtypes = [ctypes.c_uint]
        self.lib.fiu_set_prng_seed(seed)
        self.points, self.probability, self.err = [p.encode() for p in points], probability, err

    def on(self) -> None:
        for p in self.points:  # failinfo: the errno libfiu's POSIX wrappers set
            assert self.lib.fiu_enable_random(p, 1, ctypes.c_void_p(self.err), self.probability) == 0

    def off(self) -> None:
        for p in self.points:
            self.lib.fiu_disable(p)


def stages(inp: Path, work: Path, out: Path, workers: int, faults: Faults | None = None, at: str = "") -> int:
    """fault_harness.run_pipeline's stages, the faults on during stage ``at``."""
    from pack_assets.core import store
    from pack_assets.core.audit import run_audit
    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.report import WhatIfBeside
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.write import run_write

    profile = load_profile("qwen3-vl")
    shards = list(store.find_shards(inp))
    config = PlanConfig(max_len=1500, max_packs_per_shard=2)

    def plan():
        what_if = WhatIfBeside(work, config)
        what_if.finish(run_plan(work, shards, config, profile, on_lengths=what_if.start).fingerprint)

    steps = {"scan": lambda: [run_manifest(inp, work, s) for s in shards],
             "count": lambda: [run_token_lengths(work, s, profile) for s in shards],
             "plan": plan, "write": lambda: run_write(work, inp, out, workers=workers),
             "audit": lambda: run_audit(work, out)}
    result = None
    for name in STAGES:
        if faults is not None and name == at:
            faults.on()
        try:
            result = steps[name]()
        finally:
            if faults is not None and name == at:
                faults.off()
    return 0 if result.ok else 3


def temp_leftovers(work: Path, out: Path) -> list[str]:
    return [str(p) for p in [*out.rglob(".*tmp*"), *work.rglob(".*.tmp-*")]]


def _warm() -> None:
    from conftest import small_dataset

    with tempfile.TemporaryDirectory() as d:
        inp = small_dataset(Path(d) / "in", n_shards=1, per_shard=6)
        stages(inp, Path(d) / "work", Path(d) / "out", 1)


def main() -> int:
    """INPUT ROOT FAULTS: each fault (a JSON list of `draw`'s dicts) in its own folders ROOT/r<i>/; one JSON
    line per run on stdout (its exit and the line it printed), as soon as it is done."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver asks for the stacks of a run that hangs
    inp, root, todo = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    _warm()
    root.mkdir(parents=True, exist_ok=True)
    (root / "armed").touch()  # the driver's sign that the start under libfiu is over (see faulty_runs)
    from pack_assets.cli import error_line
    from pack_assets.runner.orchestrate import FAULTS

    for fault in todo:
        faults = Faults(fault["seed"], POINTS[fault["points"]], fault["probability"], ERRNOS[fault["errno"]])
        work, out = root / f"r{fault['run']}" / "work", root / f"r{fault['run']}" / "out"
        line = ""
        try:
            code = stages(inp, work, out, fault["workers"], faults, fault["stage"])
        except Exception as e:  # as `pack-assets run` prints a failed step: runner/orchestrate.py's PipelineError
            name, code = type(e).__name__, 2
            step = fault["stage"]
            line = error_line(RuntimeError(f"{step}: {e}" if name in FAULTS else f"{step}: {name}: {e}"))
        print(json.dumps({"run": fault["run"], "exit": code, "line": line}), flush=True)
    return 0


# --- the driver's side: faulty runs, each judged after a clean rerun ---------------------------------------

def draw(rng: random.Random, run: int) -> dict:
    """One run's fault, from the soak's seeded generator."""
    points = rng.choice(["read", "read", "write", "write", "sync", "all"])
    return {"run": run, "seed": rng.randrange(1 << 31), "stage": rng.choice(STAGES), "points": points,
            "probability": rng.choice([0.002, 0.01, 0.05, 0.2]),
            "errno": "ENOSPC" if points == "write" and rng.random() < 0.3 else "EIO", "workers": rng.choice([1, 2])}


def _cpu_ticks(pid: int) -> int | None:
    """A process's user + system CPU time in clock ticks (/proc/PID/stat), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def _deadlocked_start(proc: subprocess.Popen, armed: Path, stall: float) -> bool:
    """Wait for a start to arm (or end): True when it spent no CPU for ``stall`` seconds before that, the
    preload's deadlock. A start that is only slow (a busy machine) keeps going: killing it at a fixed wall time
    threw away its CPU and made it again, up to ten times under load."""
    last, since = _cpu_ticks(proc.pid), time.monotonic()
    while not armed.exists() and proc.poll() is None:
        time.sleep(0.2)
        now = _cpu_ticks(proc.pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            return True
    return False


def faulty_runs(inp: Path, root: Path, faults: list[dict], start: float = 20, per_run: float = 120) -> dict[int, dict]:
    """The runs under `fiu-run -x`, as few processes as it takes: run -> {exit, line, starts}. libfiu's preload
    (it wraps malloc too) deadlocks now and then while Python loads pyarrow's library, before any fault is
    on: a start that spends no CPU for ``start`` seconds before it arms is killed and made again (``starts``
    counts them). A process that dies or hangs once armed gives its run ``crash`` (its exit and last stderr
    line) or ``hang``; the runs after it go to a new process."""
    results: dict[int, dict] = {}
    starts = 0
    while pending := [f for f in faults if f["run"] not in results]:
        armed = root / "armed"
        armed.unlink(missing_ok=True)
        starts += 1
        proc = subprocess.Popen(["fiu-run", "-x", sys.executable, str(Path(__file__)), str(inp), str(root),
                                 json.dumps(pending)], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        if _deadlocked_start(proc, armed, start) and starts < 10:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            continue
        try:
            out_text, err_text = proc.communicate(timeout=per_run * len(pending))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)  # faulthandler: the stacks, for the record
            time.sleep(1)
            os.killpg(proc.pid, signal.SIGKILL)
            out_text, err_text = proc.communicate()
            err_text += "\nhang"
        for line in out_text.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                results[r["run"]] = {"exit": r["exit"], "line": r["line"], "starts": starts}
        first = next((f["run"] for f in pending if f["run"] not in results), None)
        if first is not None:
            hung = err_text.endswith("hang")
            results[first] = {"exit": -9 if hung else proc.returncode, "starts": starts,
                              "line": (err_text.strip().splitlines() or [""])[-1]}
        starts = 0
    return results


def judge(result: dict, inp: Path, clean: dict, work: Path, out: Path) -> dict:
    """The faulty run's outcome: ``pass_equal`` (PASS and the clean run's bytes), ``clear_error`` (exit 2, one
    line naming a file or folder), or a violation: ``pass_wrong_bytes``, ``unclear_error``,
    ``crash``, ``hang``. Then ``rerun``: a plain rerun without faults, which must give the clean run's bytes."""
    last, code = result["line"], result["exit"]
    if code == 0:
        outcome = "pass_equal" if snapshot(work, out) == clean else "pass_wrong_bytes"
    elif code == 2 and last.startswith("error: ") and re.search(r"(^|[\s\"'(])/\w", last):
        outcome = "clear_error"
    elif code == 2:
        outcome = "unclear_error"
    elif code == -9:
        outcome = "hang"
    else:
        outcome = "crash"
    leftovers = temp_leftovers(work, out)
    try:
        again = stages(inp, work, out, 1)
        rerun = "equal" if again == 0 and snapshot(work, out) == clean else f"differs (exit {again})"
    except Exception as e:  # the catalog or the output could not be recovered by a plain rerun
        rerun = f"failed: {type(e).__name__}: {e}"
    return {"outcome": outcome, "exit": code, "line": last[:300], "rerun": rerun, "starts": result["starts"],
            "temp_left_visible": leftovers}


if __name__ == "__main__":
    sys.exit(main())
