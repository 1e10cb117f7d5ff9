"""Run a command and report the CPU seconds of its whole process tree, every process counted once it ends:
this process is the tree's child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a descendant orphaned by its
parent (a fork server the command leaves to end on its own, and its children) is reaped here and counted, where
`/usr/bin/time` counts only what the command itself waited for. Linux only.

    python bench/tree_cpu.py [--label A] -- <command ...>     # one JSON line: label, wall, user, system, rc
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    while True:  # the orphans, until none is left
        try:
            os.wait()
        except ChildProcessError:
            break
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"label": args.label, "wall_s": round(wall, 2), "user_s": round(ru.ru_utime, 2),
                      "system_s": round(ru.ru_stime, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "rc": rc}),
          flush=True)


if __name__ == "__main__":
    main()
