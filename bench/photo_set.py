"""The realistic small set of issue 41: image-text samples whose JPEGs are 200-1024 px a side and ~140 KB each.

    python bench/photo_set.py --out bench/out/photos --shards 4 --per-shard 1500

A pool of 64 photos (smooth colour fields plus sensor-like noise, JPEG quality 90) at random sizes; each
sample's copy made unique and brought to 90-170 KB by bytes after the JPEG's end marker (decoders stop
there, so the size a model sees is the photo's). Deterministic for a seed; existing shards are kept.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import _photo  # noqa: E402


def photo_pool(rng: np.random.Generator, n: int = 64) -> list[bytes]:
    pool = []
    for _ in range(n):
        w, h = (int(x) for x in rng.integers(200, 1025, 2))
        buf = io.BytesIO()
        _photo(w, h, float(rng.uniform(2, 6)), rng).save(buf, format="JPEG", quality=90)
        pool.append(buf.getvalue())
    return pool


def make_photo_shards(root: Path, n_shards: int, per_shard: int, seed: int = 41) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = photo_pool(rng)
    paths = []
    for s in range(n_shards):
        path = root / f"part-{s:05d}.tar"
        paths.append(path)
        if path.exists():
            continue
        tmp, srng = path.with_suffix(".tmp"), np.random.default_rng([seed, s])
        with tarfile.open(tmp, "w") as tf:
            for j in range(per_shard):
                key = f"{s:05d}{j:06d}"
                words = " ".join(["describe the photo in detail please"] * int(srng.integers(2, 60)))
                rec = {"conversations": [{"from": "human", "value": "<image>\n" + words},
                                         {"from": "gpt", "value": words}], "images": ["jpg"]}
                img = pool[int(srng.integers(len(pool)))]
                img = img + srng.bytes(max(0, int(srng.integers(90, 171)) * 1024 - len(img)) or 8)
                for name, data in (("json", json.dumps(rec).encode()), ("jpg", img)):
                    ti = tarfile.TarInfo(f"{key}.{name}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        tmp.replace(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/out/photos")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=41)
    args = ap.parse_args()
    paths = make_photo_shards(Path(args.out), args.shards, args.per_shard, args.seed)
    print(json.dumps({"shards": len(paths), "bytes": sum(p.stat().st_size for p in paths)}))


if __name__ == "__main__":
    main()
