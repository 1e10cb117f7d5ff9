"""The parts of a one-new-shard rerun's write and audit stages that session 55 changed, timed alone, this code's
against a baseline's (each in its own process, alternating), on a set a rerun left (bench_e2e.py's --out after
profile_rerun.py) or a catalog alone (synth_catalog.py's work folder's parent):

    python -P bench/rerun_write_parts.py --out <set> --baseline-src /work/wt/base55 --src <this tree> --rounds 5

Per round and code, each timed as wall and process CPU seconds (DuckDB's threads included):
- ``claim`` (where the set has an output folder): whether the planned names of the output folder are the
  writer's (`owned._foreign`, what `owned.claim` checks), its files dropped from the page cache first
  (posix_fadvise, these files only);
- ``digest``: `record.shard_digests` with the writer's record less the newest output shard (the one a rerun
  after an append computes);
- ``expectations``: `expected.shard_expectations` of the newest output shard, not staged (how a rerun's audit
  reads its one new shard);
- ``publish``: a batch of ``--files`` small files (4 KB, as a 1M set's 59 ``.tar.idx`` and its metadata) published
  over files that already hold the same bytes, in a scratch folder under the set.
Nothing of the set is written but that scratch folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, machine  # noqa: E402

PART = r"""
import json, os, sys, time
from pathlib import Path
from pack_assets.core import expected, owned, store
from pack_assets.core.write import publish, record
out, files = Path(sys.argv[1]), int(sys.argv[2])
work, packed = out / "work", out / "packed"

def timed(f):
    w, c = time.perf_counter(), time.process_time()
    f()
    return [round(time.perf_counter() - w, 4), round(time.process_time() - c, 4)]

def evict(folder):
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

found = {}
with store.connect(work, read_only=True) as con:
    names = [r[0] for r in con.execute("SELECT DISTINCT output_shard FROM pack_plan ORDER BY 1").fetchall()]
    if packed.is_dir():  # as owned.claim checks: the baseline's claim passed no `unchanged` on
        planned = owned.planned_files(names)
        unchanged = record.left_as_written(work, packed) if "unchanged" in owned.claim.__code__.co_varnames else None
        recorded = owned.load(packed) or {}
        evict(packed)
        found["claim"] = timed(lambda: owned._foreign(packed, planned, recorded, *([unchanged] if unchanged else [])))
    rec = record.load_record(work)
    if rec is None:  # a catalog without a write (synth_catalog.py): the record the write would leave
        digests, keys = record.shard_digests(con, None)
        rec = {"digest_format": record.DIGEST_FORMAT, "digests": {n: d[0] for n, d in digests.items()},
               "digest_keys": keys}
    rec = {**rec, "digests": {n: d for n, d in rec["digests"].items() if n != names[-1]}}
    found["digest"] = timed(lambda: record.shard_digests(con, rec))
    found["expectations"] = timed(lambda: expected.shard_expectations(con, names[-1]))
folder = out / "publish_scratch"
folder.mkdir(exist_ok=True)
data = {folder / f"f{i:03d}.idx": os.urandom(4096) for i in range(files)}
with publish.Publish() as batch:  # the files in place first
    for p, d in data.items():
        batch.write(p, d)
    batch.commit()
def again():
    with publish.Publish() as batch:
        for p, d in data.items():
            batch.write(p, d)
        batch.commit()
found["publish"] = timed(again)
print(json.dumps(found))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=65)
    ap.add_argument("--results", help="a new file or folder (default: bench/results/rerun_write_parts_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    emit = Results(out, args.results, "rerun_write_parts")
    codes = [("baseline", args.baseline_src), ("this", args.src)]
    runs: dict[str, list[dict]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:  # the working folder: not a source tree (`python -c` puts it first)
        for i in range(args.rounds):
            for code, src in (codes if i % 2 == 0 else codes[::-1]):
                done = subprocess.run([sys.executable, "-c", PART, str(out), str(args.files)], cwd=tmp, check=True,
                                      env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True)
                runs[code].append(json.loads(done.stdout.strip().splitlines()[-1]))
    median = {code: {part: [round(statistics.median(r[part][k] for r in rs), 4) for k in (0, 1)]
                     for part in rs[0]} for code, rs in runs.items()}
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "load1": round(os.getloadavg()[0], 2),
          "rounds": args.rounds, "files": args.files, "codes": dict(codes),
          "median_wall_cpu_s": median, "runs": runs})


if __name__ == "__main__":
    main()
