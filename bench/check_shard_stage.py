"""The shard stage's files of two work folders are the same: every shard's manifest (samples, members, rejected,
the shard row without its timing) and token counts, row for row. Run the stage with one code into one folder
and with another into a second (e.g. main and a branch on the same input), then:

    python bench/check_shard_stage.py <work A> <work B> [--profile qwen3-vl]

Exit 0 when they match, 1 (naming the first difference of each file) when not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq

_TIMING = {"seconds"}  # a scan's own wall time: never the same twice


def _table(path: Path) -> list[dict]:
    rows = pq.read_table(path).to_pylist()
    return [{k: v for k, v in r.items() if k not in _TIMING} for r in rows]


def _files(work: Path, profile: str) -> dict[str, Path]:
    out = {}
    for sub in (work / "manifest", work / "token_lengths" / profile):
        for p in sorted(sub.glob("*/*.parquet")):
            out[str(p.relative_to(work))] = p
    return out


def compare(a: Path, b: Path, profile: str) -> list[str]:
    fa, fb = _files(a, profile), _files(b, profile)
    problems = [f"only in {a}: {k}" for k in sorted(fa.keys() - fb.keys())]
    problems += [f"only in {b}: {k}" for k in sorted(fb.keys() - fa.keys())]
    for k in sorted(fa.keys() & fb.keys()):
        ra, rb = _table(fa[k]), _table(fb[k])
        if len(ra) != len(rb):
            problems.append(f"{k}: {len(ra)} rows against {len(rb)}")
            continue
        diff = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
        if diff is not None:
            problems.append(f"{k}: row {diff} differs:\n  {ra[diff]}\n  {rb[diff]}")
    if not fa:
        problems.append(f"no manifest or token files under {a}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--profile", default="qwen3-vl")
    args = ap.parse_args()
    problems = compare(args.a, args.b, args.profile)
    n = len(_files(args.a, args.profile))
    print("\n".join(problems) if problems else f"same: {n} files")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
