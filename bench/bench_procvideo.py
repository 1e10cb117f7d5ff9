"""Samples/s per core of the processor rule on video samples (issue 18, item 3), warm and cold, beside the fast
rule on the same samples.

    PYTHONPATH=. taskset -c 1 python bench/bench_procvideo.py [-n 2000] [--cold 60] \
        [--results bench/results/procvideo_<label>.json]

Samples: one video and ~100 words each (system, user with the video, assistant answer), counted from the
manifest's video metadata (frames, fps, width, height, duration; nothing decoded). "warm": the videos take 8
metadata (real data with repeated clip formats and lengths), counted after one pass over them; "cold": every
sample a metadata never seen (``--cold`` of them: each runs the processor's video path on blank stand-in
frames and the whole-call self-check). "whole call": ``ProcessorCounter.count`` per sample (the processor
call, its video processor memoized), the way before the direct path. Models (the test fixtures' folders):
Qwen3-VL (its published video config: fps 2), InternVL3-2B-hf and LLaVA-OneVision (a copy with
``do_sample_frames: true, num_frames: 8``: the folders as converted keep every frame). torch + torchvision
needed (the `processor` extra). One tokenizer thread (RAYON_NUM_THREADS=1): figures per core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from common import ResultsFile  # noqa: E402

ROUNDS = 3
WORDS = ("the a cat dog sat on mat red blue video shows large small tree house car river city chart table "
         "figure left right top bottom person holding cup moves").split()
POOL = [(300, 30.0, 640, 360), (750, 25.0, 1280, 720), (150, 30.0, 224, 224), (1800, 30.0, 640, 480),
        (240, 24.0, 854, 480), (600, 30.0, 320, 240), (125, 25.0, 1920, 1080), (900, 29.97, 480, 270)]


def folders(tmp: Path) -> dict[str, Path]:
    from family_fixtures import materialize, video_variant

    from pack_assets.core.counting.profiles import bundled_tokenizer_file

    q = tmp / "Qwen3-VL-8B-Instruct"
    shutil.copytree(ROOT / "tests" / "fixtures" / "models" / "Qwen3-VL-8B-Instruct", q)
    shutil.copy(bundled_tokenizer_file(), q / "tokenizer.json")
    fam = materialize(tmp, ("internvl", "llava-onevision"))
    return {"qwen3-vl": q, "internvl (num_frames 8)": video_variant(fam["internvl"], "internvl", "num_frames_8"),
            "llava-onevision (num_frames 8)": video_variant(fam["llava-onevision"], "llava-onevision", "num_frames_8")}


def meta(frames: int, fps: float, w: int, h: int) -> dict:
    return {"frames": frames, "fps": fps, "width": w, "height": h, "duration": frames / fps}


def samples(n: int, cold: bool, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(100))
        if cold:  # a new length each sample (sizes and rates from the pool): 2 to 40 s
            _, fps, w, h = POOL[i % len(POOL)]
            m = meta(int(fps * 2) + 7 * i + 1, fps, w, h)
        else:
            m = meta(*POOL[rng.randrange(len(POOL))])
        msgs = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "video"},
                                             {"type": "text", "text": f"What happens? {words[:200]}"}]},
                {"role": "assistant", "content": [{"type": "text", "text": words}]}]
        out.append((msgs, [], [m]))
    return out


def rate(fn, items) -> float:
    t = time.perf_counter()
    fn(items)
    return len(items) / (time.perf_counter() - t)


def run(n: int, n_cold: int) -> dict:
    from pack_assets.core.counting.procount import ProcessorCounter
    from pack_assets.core.counting.profiles import processor_profile, profile_from_model_dir
    from pack_assets.core.counting.tokens import TokenCounter

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in folders(Path(tmp)).items():
            warm = samples(n, cold=False)
            row: dict = {}
            counter = ProcessorCounter(processor_profile(folder))
            first = list(counter.count_many(warm))  # one pass: every metadata seen (and self-checked)
            errors = sum(isinstance(r, Exception) for r in first)
            rounds = [rate(lambda xs, c=counter: list(c.count_many(xs)), warm) for _ in range(ROUNDS)]
            row["processor_warm"] = statistics.median(rounds)
            row["processor_warm_rounds"] = rounds
            sub = warm[: max(50, n // 10)]
            row["whole_call_warm"] = statistics.median(
                [rate(lambda xs, c=counter: [c.count(*x) for x in xs], sub) for _ in range(ROUNDS)])
            again = list(counter.count_many(sub))
            whole = [counter.count(*x) for x in sub]
            row["warm_equal_to_whole_call"] = again == whole
            row["fallbacks"], row["errors_in_warm_pass"] = counter.fallbacks, errors
            cold_counter = ProcessorCounter(processor_profile(folder))
            cold_counter._video_reps.clear()
            cold = samples(n_cold, cold=True, seed=1)
            t = time.perf_counter()
            cold_out = list(cold_counter.count_many(cold))
            row["processor_cold"] = n_cold / (time.perf_counter() - t)
            row["cold_samples"] = n_cold
            row["cold_errors"] = sum(isinstance(r, Exception) for r in cold_out)
            fast_profile = profile_from_model_dir(folder)
            if fast_profile.rule == "fast":
                fast = TokenCounter(fast_profile)
                fast_out = list(fast.count_many(warm))
                row["fast_warm"] = statistics.median([rate(lambda xs, f=fast: list(f.count_many(xs)), warm)
                                                      for _ in range(ROUNDS)])
                row["processor_equal_to_fast"] = [r["total_tokens"] for r in first] == \
                    [r["total_tokens"] for r in fast_out]
                row["processor_cold_equal_to_fast"] = [getattr(r, "get", lambda k, r=r: r.reason)("total_tokens")
                                                       for r in cold_out] == \
                    [getattr(r, "get", lambda k, r=r: r.reason)("total_tokens") for r in fast.count_many(cold)]
            out[name] = row
            print(name, json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()
                                    if k != "processor_warm_rounds"}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=60)
    ap.add_argument("--label", default="")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/procvideo_<UTC>.json)")
    args = ap.parse_args()
    dest = ResultsFile(args.results, "procvideo")
    import torch
    import transformers

    res = {"label": args.label, "n": args.n, "rounds": ROUNDS,
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                       "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(),
                       "affinity": sorted(os.sched_getaffinity(0))},
           "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip(),
           "models": run(args.n, args.cold)}
    res["machine"]["loadavg_end"] = os.getloadavg()
    try:
        res["machine"]["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                           if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    dest.write(res)


if __name__ == "__main__":
    main()
