"""Helpers for the benchmark scripts: big synthetic shards and timing of reference commands."""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def drop_caches_hint() -> None:
    """Page cache cannot be dropped without privileges everywhere; every figure is measured warm."""


def make_shards(root: Path, n_shards: int, per_shard: int, image_kb: int = 16, seed: int = 0, images: int = 1) -> list[Path]:
    """Image-text samples with unique small JPEGs (plus padding bytes to reach the size), fast to make."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = []
    for i in range(32):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        base.append(buf.getvalue())
    pad_to = image_kb * 1024
    paths = []
    for s in range(n_shards):
        path = root / f"part-{s:05d}.tar"
        if path.exists():
            paths.append(path)
            continue
        tmp = path.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tf:
            for j in range(per_shard):
                key = f"{s:05d}{j:06d}"
                words = " ".join(["describe the image in detail please"] * int(rng.integers(2, 60)))
                parts = ["jpg"] if images == 1 else [f"{m}.jpg" for m in range(images)]
                rec = {"conversations": [{"from": "human", "value": "<image>\n" * images + words},
                                         {"from": "gpt", "value": words}], "images": parts}
                data = json.dumps(rec).encode()
                ti = tarfile.TarInfo(f"{key}.json")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
                for part in parts:
                    img = base[(j + len(part)) % 32]
                    # JPEG ignores bytes after EOI: unique, valid images of the target size
                    img = img + rng.bytes(max(0, pad_to - len(img)))
                    ti = tarfile.TarInfo(f"{key}.{part}")
                    ti.size = len(img)
                    tf.addfile(ti, io.BytesIO(img))
        tmp.replace(path)
        paths.append(path)
    return paths
