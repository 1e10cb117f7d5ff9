"""The copy-bound regime: a byte-heavy set (100–300 KB photos, some videos) through `pack-assets run`, next to
`cat`, `sha256sum` and `cp` of the same bytes, plus what decoding every image and running the processor
would cost instead of reading headers.

    python bench/bench_bytes.py --gb 20 --out bench/out/bytes

Checks free disk first (source + output + a transient `cp` copy ≈ 3 × the set; the copy is deleted before
the run). Prints JSON lines and writes them to <out>/results.json and to a new results file (--results; default
bench/results/bytes_<UTC>.json).
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import run  # noqa: E402
from common import Results, machine, make_heavy_shards, require_free, timed  # noqa: E402


def decode_baseline(shard: Path, n: int) -> dict:
    """Per image: header-only size + token rule (what the pipeline does) vs full decode + the transformers
    Qwen-VL image processor (what a count-by-processing tool does), on the same ``n`` images."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from pack_assets.core.counting.profiles import PROFILE_DIR, load_profile
    from pack_assets.core.counting.vision import image_tokens
    from pack_assets.core.media import probe_image

    images = []
    with tarfile.open(shard) as tf:
        for m in tf:
            if m.name.endswith((".jpg", ".webp")):
                images.append((m.name.rsplit(".", 1)[1], tf.extractfile(m).read()))
                if len(images) == n:
                    break
    rule = load_profile("qwen3-vl").image
    proc = Qwen2VLImageProcessorPil.from_pretrained(PROFILE_DIR / "qwen3-vl")
    t0 = time.perf_counter()
    header = [image_tokens(*probe_image(data[:16384], ext), rule) for ext, data in images]
    header_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    decoded = []
    for _, data in images:
        with Image.open(io.BytesIO(data)) as im:
            out = proc(images=[im.convert("RGB")], return_tensors="np")
        decoded.append(int(out["image_grid_thw"].prod()) // rule.merge_size**2)
    decode_s = time.perf_counter() - t0
    return {"images": len(images), "header_us_per_image": round(header_s / len(images) * 1e6, 1),
            "decode_process_ms_per_image": round(decode_s / len(images) * 1e3, 2),
            "ratio": round(decode_s / header_s), "same_counts": header == decoded}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=20.0)
    ap.add_argument("--shard-mb", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--sample-images", type=int, default=200)
    ap.add_argument("--out", default="bench/out/bytes")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/bytes_<UTC>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    emit = Results(out, args.results, "bytes")
    out.mkdir(parents=True, exist_ok=True)
    target = int(args.gb * 1e9)
    inp = out / "shards"
    have = sum(p.stat().st_size for p in inp.glob("*.tar")) if inp.exists() else 0
    require_free(out, 3 * target - have)
    t0 = time.perf_counter()
    paths = make_heavy_shards(inp, target, args.shard_mb << 20)
    files = [str(p) for p in paths]
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d"), "generate_s": round(time.perf_counter() - t0, 1),
          "bytes": sum(p.stat().st_size for p in paths), "shards": len(paths)})
    cp_dest = out / "cp"
    shutil.rmtree(cp_dest, ignore_errors=True)
    cp_dest.mkdir()
    emit({"cat_s": round(timed("cat " + " ".join(files) + " > /dev/null", shell=True), 1),
          "sha256sum_s": round(timed(["sha256sum", *files]), 1),
          "sha256sum_2proc_s": round(timed("printf '%s\\n' " + " ".join(files) + " | xargs -P 2 -n 1 sha256sum",
                                           shell=True), 1),
          "cp_s": round(timed(["cp", *files, str(cp_dest)]), 1)})
    shutil.rmtree(cp_dest, ignore_errors=True)
    cp_dest.mkdir()  # the writer fsyncs every output shard; cp does not unless asked
    emit({"cp_sync_s": round(timed(f"cp {' '.join(files)} {cp_dest} && sync", shell=True), 1)})
    shutil.rmtree(cp_dest, ignore_errors=True)

    for d in ("work", "packed", "dagster_home"):
        shutil.rmtree(out / d, ignore_errors=True)
    exe = str(Path(sys.executable).parent / "pack-assets")
    cmd = [exe, "run", "--input", str(inp), "--max-len", str(args.max_len), "--work", str(out / "work"),
           "--output", str(out / "packed"), "--dagster-home", str(out / "dagster_home"), "--json"]
    seconds, summary, peak = run(cmd)
    emit({"full_run_s": round(seconds, 1), "stage_seconds": summary["stage_seconds"], "peak_rss_bytes": peak,
          **{k: summary[k] for k in ("samples", "packed", "dropped", "rejected", "packs", "lower_bound", "fill",
                                     "violations", "output_shards")}})

    import duckdb

    with duckdb.connect(str(out / "work" / "pack_assets.duckdb"), read_only=True) as con:
        media = dict(con.execute("select media_type, count(*) from samples group by 1").fetchall())
        n_images = con.execute("select coalesce(sum(n_images), 0) from samples").fetchone()[0]
    base = decode_baseline(paths[0], args.sample_images)
    emit({"samples_by_media_type": media, "image_members": int(n_images), **base,
          "all_images_decode_process_min": round(n_images * base["decode_process_ms_per_image"] / 1e3 / 60, 1),
          "all_images_header_s": round(n_images * base["header_us_per_image"] / 1e6, 1)})


if __name__ == "__main__":
    main()
