"""Helpers for the benchmark scripts: big synthetic shards and timing of reference commands."""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
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


RESULTS = Path(__file__).resolve().parent / "results"


class ResultsFile:
    """The one way a bench script writes its results file: a results file is never overwritten, a new run adds
    one. ``given`` names the file (refused if it exists, as the run starts, before anything is measured), or a
    folder, or nothing: then a new ``<stem>_<UTC date-time>.json`` in it, or in bench/results. The run may
    write its own file again as records come in; a file of that name that appears meanwhile stops it."""

    def __init__(self, given: str | Path | None, stem: str) -> None:
        path = Path(given) if given else RESULTS
        if path.is_dir() or str(given).endswith("/"):
            path = path / f"{stem}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
        if path.exists():
            raise SystemExit(f"{path} exists: a results file is never overwritten; name a new file or a folder")
        self.path, self.written = path, False

    def write(self, doc: object) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        try:
            if self.written:
                tmp.replace(self.path)
            else:
                os.link(tmp, self.path)  # makes the name only where none exists: never an overwrite
                self.written = True
        except FileExistsError:
            raise SystemExit(f"{self.path} appeared during the run: a results file is never overwritten") from None
        finally:
            tmp.unlink(missing_ok=True)
        return self.path


class Results:
    """Records printed as JSON lines and kept after each one, so a long run that dies keeps what it measured:
    in the scratch <out>/results.json (rewritten; bench/plots.py reads it) and in a new results file
    (``ResultsFile``: ``results`` a file, a folder or nothing for a new name under bench/results)."""

    def __init__(self, out: Path, results: str | None, stem: str) -> None:
        self.scratch, self.file, self.records = out / "results.json", ResultsFile(results, stem), []

    def __call__(self, rec: dict) -> None:
        self.records.append(rec)
        print(json.dumps(rec), flush=True)
        self.save()

    def save(self) -> None:
        self.scratch.write_text(json.dumps(self.records, indent=1))
        self.file.write(self.records)


def require_free(path: Path, need_bytes: float) -> None:
    """Stop before generating data that would fill the disk (bench sets run to tens of GB)."""
    while not path.exists():
        path = path.parent
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise SystemExit(f"need {need_bytes / 1e9:.1f} GB free under {path}, have {free / 1e9:.1f} GB")


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def yardstick(files: list[str]) -> dict:
    """Issue 41's yardstick: `cat` then `sha256sum` of the files, seconds each (after the `cat`, the page cache
    holds what it can)."""
    return {"cat_s": round(timed("cat " + " ".join(files) + " > /dev/null", shell=True), 1),
            "sha256sum_s": round(timed(["sha256sum", *files]), 1)}


def hashlib_seconds(files: list) -> float:
    """Seconds for Python's hashlib.sha256 over each file in 1 MiB reads (the hashing floor of a scan)."""
    t0 = time.perf_counter()
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return time.perf_counter() - t0


def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache, so a run starts with none of its files cached (root
    only: where it is refused the figures are measured with whatever the cache holds). Returns whether it did."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def make_shards(root: Path, n_shards: int, per_shard: int, image_kb: int = 16, seed: int = 0,
                images: int = 1, max_words: int = 60) -> list[Path]:
    """Image-text samples with unique small JPEGs (plus padding bytes to reach the size), fast to make.
    ``images=0``: text-only samples; ``max_words`` bounds each turn's length (in repeats of a 6-word phrase)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = []
    for _ in range(32):
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
                words = " ".join(["describe the image in detail please"] * int(rng.integers(2, max_words)))
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


def _photo(w: int, h: int, amp: float, rng) -> Image.Image:
    """Smooth colour fields plus sensor-like noise: JPEGs of realistic size for their resolution."""
    low = rng.integers(0, 255, (h // 32 + 1, w // 32 + 1, 3), dtype=np.uint8)
    arr = np.asarray(Image.fromarray(low).resize((w, h), Image.BICUBIC)).astype(np.int16)
    arr += rng.normal(0, amp, (h, w, 3)).astype(np.int16)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def make_heavy_shards(root: Path, target_bytes: int, shard_bytes: int = 1 << 30, seed: int = 0) -> list[Path]:
    """A byte-heavy set: ~60 % one photo, 25 % 2–4 photos, 10 % text, 5 % one MPEG-4 video per sample; photos
    are 100–300 KB JPEG/WebP at 640–1280 px (a pool, each copy made unique after its end marker), videos
    0.1–0.7 MB. Shards of ~``shard_bytes`` until ``target_bytes``; existing shards are kept."""
    from pack_assets.core.demo import video_bytes

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    photos: list[tuple[str, bytes]] = []
    for w, h, amp in [(800, 600, 8), (800, 600, 16), (1024, 768, 4), (1024, 768, 8), (1024, 768, 12),
                      (1280, 960, 4), (1280, 960, 6), (768, 1024, 8), (960, 1280, 4), (640, 480, 16)]:
        for _ in range(4):
            buf = io.BytesIO()
            _photo(w, h, amp, rng).save(buf, format="JPEG", quality=88)
            if 100 << 10 <= len(buf.getvalue()) <= 300 << 10:
                photos.append(("jpg", buf.getvalue()))
    for w, h in [(1024, 768), (1280, 960)]:
        buf = io.BytesIO()
        _photo(w, h, 12, rng).save(buf, format="WEBP", quality=85)
        photos.append(("webp", buf.getvalue()))
    videos = [video_bytes(frames, w, h, 8, seed=i) for i, (frames, w, h) in
              enumerate([(48, 320, 240), (96, 480, 360), (64, 640, 480), (160, 480, 360)])]
    paths, total, s = [], 0, 0
    while total < target_bytes:
        path = root / f"part-{s:05d}.tar"
        if not path.exists():
            tmp, n, rng = path.with_suffix(".tmp"), 0, np.random.default_rng([seed, s])
            with tarfile.open(tmp, "w") as tf:
                while tf.offset < shard_bytes:
                    key, u = f"{s:05d}{n:07d}", rng.random()
                    n += 1
                    words = " ".join(["describe what you see and explain why"] * int(rng.integers(2, 80)))
                    media: list[tuple[str, bytes]] = []
                    if u < 0.05:
                        media = [("mp4", videos[int(rng.integers(len(videos)))])]
                        rec = {"conversations": [{"from": "human", "value": "<video>\n" + words},
                                                 {"from": "gpt", "value": words}], "video": "mp4"}
                    elif u < 0.15:
                        rec = {"conversations": [{"from": "human", "value": words}, {"from": "gpt", "value": words}]}
                    else:
                        k = 1 if u < 0.75 else int(rng.integers(2, 5))
                        for m in range(k):
                            ext, img = photos[int(rng.integers(len(photos)))]
                            unique = (s << 32 | n).to_bytes(8, "little") + m.to_bytes(2, "little")
                            media.append((f"{m}.{ext}", img + unique))
                        rec = {"conversations": [{"from": "human", "value": "<image>\n" * k + words},
                                                 {"from": "gpt", "value": words}], "images": [p for p, _ in media]}
                    for name, data in [("json", json.dumps(rec).encode()), *media]:
                        ti = tarfile.TarInfo(f"{key}.{name}")
                        ti.size = len(data)
                        tf.addfile(ti, io.BytesIO(data))
            tmp.replace(path)
        paths.append(path)
        total += path.stat().st_size
        s += 1
    return paths
