"""The plan's small per-shard checks while the kept output shards are hashed: by threads of this process (as
`EarlyDigests` did until session 45) or by another process (as it does now), on a set bench_e2e.py left.

    python bench/bench_digest_beside.py --out <bench_e2e's --out> --rounds 4

Each round and way: the page cache dropped (root), the checks run once (their small files back in the cache,
as the command's start-up leaves them), then the output shards hashed with 4 threads and meanwhile the checks
timed: `token_lengths_are_current` and `manifest_is_current` of every shard, five times over (what the plan's
`plannable` does once per shard). Records the checks' seconds, and once their seconds with nothing beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, drop_caches, machine  # noqa: E402

from pack_assets.core import filedigest  # noqa: E402
from pack_assets.core.counting.token_lengths import token_lengths_are_current  # noqa: E402
from pack_assets.core.scan import manifest_is_current  # noqa: E402
from pack_assets.core.settings import Settings  # noqa: E402

OTHER = ("import sys; from concurrent.futures import ThreadPoolExecutor; from pack_assets.core import filedigest; "
         "list(ThreadPoolExecutor(4).map(filedigest.identified_digest, sys.argv[1:]))")


def checks(settings: Settings, shards: list[str]) -> float:
    profile = settings.model_profile()
    t = time.perf_counter()
    for _ in range(5):
        for k in shards:
            token_lengths_are_current(settings.work, k, profile)
            manifest_is_current(settings.input_root, settings.work, k)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="bench_e2e.py's --out")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/digest_beside_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    settings = Settings(input_dir=str(out / "shards"), work_dir=str(out / "work"), output_dir=str(out / "packed"))
    shards = sorted(p.name[:-4] for p in (out / "shards").glob("part-*.tar"))
    files = sorted((out / "packed").glob("packed-*.tar"))
    emit = Results(out, args.results, "digest_beside")
    checks(settings, shards)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "shards": len(shards), "output_shards": len(files),
          "checks_alone_s": round(checks(settings, shards), 2), "load1": round(os.getloadavg()[0], 2)})
    for r in range(args.rounds):
        for way in ("threads", "process"):
            if not drop_caches():
                raise SystemExit("dropping the page cache needs root")
            checks(settings, shards)
            if way == "threads":
                with ThreadPoolExecutor(4) as pool:
                    hashing = [pool.submit(filedigest.identified_digest, f) for f in files]
                    time.sleep(0.5)
                    took = checks(settings, shards)
                    for f in hashing:
                        f.result()
            else:
                proc = subprocess.Popen([sys.executable, "-c", OTHER, *map(str, files)])
                time.sleep(0.5)
                took = checks(settings, shards)
                proc.wait()
            emit({"round": r, "hashing_by": way, "checks_s": round(took, 2), "load1": round(os.getloadavg()[0], 2)})


if __name__ == "__main__":
    main()
