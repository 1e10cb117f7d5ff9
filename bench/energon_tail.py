"""The Energon index's tail at a large shape: index.sqlite made from synthetic shard indexes (the rows a writer
gives `energon.IndexRows`), timed in two parts: the rows of every shard but the last (`add`, which a pool's parent
now makes while the writers write the next shards) and what is left after the last shard (its rows, the table
indexes, the commit: `finish`). A scale check of the write stage's serial tail, not a timing of the stage.

    python bench/energon_tail.py --shards 200 --packs 200 --parts 26 --repeats 3 --results bench/results/x.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pack_assets.core.write.energon import IndexRows  # noqa: E402
from pack_assets.core.write.publish import Publish  # noqa: E402


def shard_index(s: int, packs: int, parts: int):
    """A shard's index as `layout.shard_index` gives it: per pack (key, offset, size), per member (pack, part, ...)."""
    samples, rows, pos = [], [], 0
    for i in range(packs):
        size = 1536 + parts * 16896
        samples.append((f"p{s:04d}x{i:05d}", pos, size))
        rows += [(i, "json" if j == 0 else f"{j - 1}.jpg", pos + 512 + j * 16896, 16384) for j in range(parts)]
        pos += size
    return samples, rows, pos


def once(root: Path, shards: int, packs: int, parts: int) -> dict:
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    names = [f"packed-{s:05d}.tar" for s in range(shards)]
    indexes = {n: shard_index(s, packs, parts) for s, n in enumerate(names)}
    t0 = time.perf_counter()
    with IndexRows(out, names) as rows, Publish() as publish:
        for n in names[:-1]:
            rows.add(n, indexes[n])
        t1 = time.perf_counter()
        rows.add(names[-1], indexes[names[-1]])
        rows.finish(publish)
        t2 = time.perf_counter()
    return {"rows_before_last_s": round(t1 - t0, 3), "after_last_s": round(t2 - t1, 3), "all_s": round(t2 - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--packs", type=int, default=200, help="packs (Energon samples) per shard")
    ap.add_argument("--parts", type=int, default=26, help="members per pack (its JSON document and media)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", help="a new file under bench/results")
    args = ap.parse_args()
    results = ResultsFile(args.results, "energon_tail")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [once(Path(tmp), args.shards, args.packs, args.parts) for _ in range(args.repeats)]
    for r in runs:
        print(r)
    results.write({"machine": machine(), "config": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
