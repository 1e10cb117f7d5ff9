"""The default rerun after one new shard, profiled (profile_rerun.py) with this code and with a baseline's, in
alternating pairs on one set, and the rerun's output folder compared: after each run every file of it hashed.

    python -P bench/profile_rerun_pairs.py --out <bench_e2e's --out> --baseline-src /work/wt/base55 --pairs 3

Each run is profile_rerun.py's (its untimed incremental run without the newest shard first, so each profiled
rerun starts from the same state); the code of each comes from PYTHONPATH (this tree's or ``--baseline-src``).
Records per run: profile_rerun.py's record, which code, and whether every file of the output folder equals the
first run's (sha256; the SQLite index by its rows, its pages not being byte-stable; `index.uuid` left out, as the
plan's fingerprint names it and each run gives the new shard a new mtime, and its hash in the owned-files record).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results  # noqa: E402

HERE = Path(__file__).resolve().parent
# named after the plan's fingerprint, which holds the sources' mtimes: each run gives the new shard a new one
UUID = ".nv-meta/index.uuid"


def folder_digest(out: Path) -> dict[str, str]:
    """sha256 per file of the output folder (path relative to it); index.sqlite by its tables' rows, the owned-files
    record but for index.uuid's hash."""
    found = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        h = hashlib.sha256()
        if p.name == ".pack_assets-files.json":
            files = json.loads(p.read_text())["files"]
            h.update(json.dumps({n: v for n, v in files.items() if n != UUID}, sort_keys=True).encode())
        elif p.name == "index.sqlite":
            with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as db:
                for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1"):
                    h.update(json.dumps([t, db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()]).encode())
        else:
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
        found[p.relative_to(out).as_posix()] = h.hexdigest()
    return found


def one(code: str, src: Path, out: Path, timer: str, evict: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory() as tmp:  # the working folder: not a source tree (`python -c` puts it first)
        into = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-P", str(HERE / "profile_rerun.py"), "--out", str(out), "--timer", timer,
                        "--results", str(into), *(["--evict"] if evict else [])],
                       check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL)
        rec = json.loads(into.read_text())[0]
        used = subprocess.run([sys.executable, "-c", "import pack_assets; print(pack_assets.__file__)"], env=env,
                              cwd=tmp, check=True, capture_output=True, text=True).stdout.strip()
    assert used.startswith(str(src)), (used, src)
    return {"code": code, "src": str(src), **rec}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--src", default=str(HERE.parent), help="this code's tree (default: this one; better a copy "
                    "that stays as it is while the runs go, e.g. `git archive HEAD pack_assets | tar -x -C DIR`)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--evict", action="store_true", help="profile_rerun.py's --evict")
    ap.add_argument("--results", help="a new file or folder (default: bench/results/profile_rerun_pairs_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    emit = Results(out, args.results, "profile_rerun_pairs")
    codes = [("baseline", Path(args.baseline_src)), ("this", Path(args.src))]
    first = None
    for i in range(args.pairs):
        for code, src in (codes if i % 2 == 0 else codes[::-1]):
            rec = one(code, src, out, args.timer, args.evict)
            files = folder_digest(out / "packed")
            first = first or files
            differing = sorted(n for n in set(files) | set(first) if files.get(n) != first.get(n) and n != UUID)
            emit({**rec, "pair": i, "output_files": len(files), "output_equal_to_first_run": not differing,
                  "differing": differing})


if __name__ == "__main__":
    main()
