"""Samples/s per core of the processor rule (issue 18, item 3), warm and cold, beside the fast rule.

    PYTHONPATH=. taskset -c 0 python bench/bench_processor.py [-n 2000] [--results bench/results/processor_<label>.json]

Samples: one image and ~400 text tokens each (system, user with the image, assistant answer). "warm": the
images take 8 sizes, counted after one pass over them (real data with repeated sizes); "cold": every sample
a size never seen (n/5 of them; each one runs the processor's image path and the whole-call self-check). Models: Gemma 3
(tests/fixtures/models/gemma-3-4b-it, decompressed into a temp folder) and Qwen3-VL (the fixture configs +
the bundled tokenizer) counted by the processor rule and, on the same samples, by the fast rule. Also, in
the same run: the whole processor call per sample (the rule before this change) and the tokenizer alone on
the expanded texts (the floor of any exact rule that runs that tokenizer). One thread for the tokenizer
(RAYON_NUM_THREADS=1): figures per core. Where the processor's tokenizer takes the chunk -> count cache
(Gemma 3), each round also runs the direct path without it (``processor_warm_no_chunk_cache``), the cache
emptied before each round.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
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

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # per-core figures: the tokenizer's batch call on one thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile  # noqa: E402

ROUNDS = 3
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "models"
WORDS = ("the a cat dog sat on mat red blue image shows large small tree house car river city chart table "
         "figure left right top bottom person holding cup").split()


def gemma_folder(tmp: Path) -> Path:
    d = tmp / "gemma-3-4b-it"
    d.mkdir()
    for f in (FIXTURES / "gemma-3-4b-it").iterdir():
        data = f.read_bytes()
        name = f.stem if f.suffix in (".xz", ".gz") else f.name
        (d / name).write_bytes(lzma.decompress(data) if f.suffix == ".xz" else
                               gzip.decompress(data) if f.suffix == ".gz" else data)
    return d


def qwen_folder(tmp: Path) -> Path:
    from pack_assets.core.counting.profiles import bundled_tokenizer_file

    d = tmp / "Qwen3-VL-8B-Instruct"
    shutil.copytree(FIXTURES / "Qwen3-VL-8B-Instruct", d)
    shutil.copy(bundled_tokenizer_file(), d / "tokenizer.json")
    return d


ZIPF = False  # --zipf: words from bench_counts' 50k pseudo-word Zipf vocabulary (k // 4 of them per k words)


def samples(n: int, warm: bool, seed: int = 0) -> list[tuple[list[dict], list, list]]:
    rng = random.Random(seed)
    pool = [[640, 480], [1024, 768], [1280, 720], [512, 512], [800, 600], [1920, 1080], [720, 1280], [336, 336]]
    out = []
    if ZIPF:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_counts import zipf_words

        vocab, cum = zipf_words()
    for i in range(n):
        if ZIPF:
            words = lambda k: " ".join(rng.choices(vocab, cum_weights=cum, k=k // 4))  # noqa: E731
        else:
            words = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
        size = rng.choice(pool) if warm else [300 + i % 997, 200 + (i * 7919) % 1201]  # every pair distinct
        msgs = [{"role": "system", "content": [{"type": "text", "text": "You are a careful assistant."}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words(120)}]},
                {"role": "assistant", "content": [{"type": "text", "text": words(260)}]}]
        out.append((msgs, [size], []))
    return out


def rate(counter, data) -> tuple[float, list]:
    t0 = time.perf_counter()
    res = list(counter.count_many(data))
    return len(data) / (time.perf_counter() - t0), res


def bench_model(name: str, folder: Path, n: int, fast: bool) -> dict:
    from pack_assets.core.counting.counters import counter_for
    from pack_assets.core.counting.profiles import processor_profile, profile_from_model_dir
    from pack_assets.core.counting.tokens import TokenCounter

    t0 = time.perf_counter()
    tc = counter_for(processor_profile(folder))
    load = time.perf_counter() - t0
    pc = tc
    warm, cold = samples(n, True), samples(max(50, n // 5), False, seed=1)
    out = {"model": name, "processor": type(pc.processor).__name__, "n": n, "n_cold": len(cold),
           "load_seconds": round(load, 2)}
    rate(tc, warm[:200])  # each of the 8 sizes seen once
    out["processor_cold"], _ = rate(tc, cold)
    texts = [pc._prepare(*item)[0] for item in warm]  # the expanded texts, media runs folded
    quarter = warm[: n // 4]
    rounds = {"processor_warm": [], "processor_warm_no_chunk_cache": [], "whole_call_warm": [], "tokenizer_only": []}
    chunks = pc.chunks
    out["chunk_cache"] = chunks is not None
    for _ in range(ROUNDS):  # in turn, so a change in the machine's load hits all alike
        if chunks is not None:
            chunks.clear()  # each round starts empty: no replay of the last round's chunks
        r, res_warm = rate(tc, warm)
        rounds["processor_warm"].append(r)
        pc.chunks = None  # every text through the tokenizer: the direct path before the chunk cache
        r, res_plain = rate(tc, warm)
        rounds["processor_warm_no_chunk_cache"].append(r)
        pc.chunks = chunks
        out["chunk_cache_equal_to_plain"] = out.get("chunk_cache_equal_to_plain", True) and res_plain == res_warm
        pc._direct = False  # the whole processor call per sample: the rule as it was before
        r, res_whole = rate(tc, quarter)
        rounds["whole_call_warm"].append(r)
        pc._direct = True
        t0 = time.perf_counter()
        for i in range(0, len(texts), 256):
            pc.tokenizer(texts[i:i + 256], **pc._text_kwargs)
        rounds["tokenizer_only"].append(len(texts) / (time.perf_counter() - t0))
    out.update({k: statistics.median(v) for k, v in rounds.items()})
    out["rounds"] = {k: [round(x, 1) for x in v] for k, v in rounds.items()}
    out["warm_over_whole_call"] = round(statistics.median(
        a / b for a, b in zip(rounds["processor_warm"], rounds["whole_call_warm"])), 2)
    out["chunk_cache_speedup"] = round(statistics.median(
        a / b for a, b in zip(rounds["processor_warm"], rounds["processor_warm_no_chunk_cache"])), 2)
    out["warm_over_tokenizer_only"] = round(statistics.median(
        a / b for a, b in zip(rounds["processor_warm"], rounds["tokenizer_only"])), 2)
    out["direct_counts"], out["self_check_failures"] = pc.direct_counts, pc.fallbacks
    out["warm_equal_to_whole_call"] = res_warm[: n // 4] == res_whole
    if fast:
        fc = TokenCounter(profile_from_model_dir(folder))
        rate(fc, warm[:200])
        out["fast_cold"], _ = rate(fc, cold)
        fast_rounds, ratios = [], []
        for _ in range(ROUNDS):
            r, res_fast = rate(fc, warm)
            p, _ = rate(tc, warm)
            fast_rounds.append(r)
            ratios.append(r / p)
        out["fast_warm"] = statistics.median(fast_rounds)
        out["fast_over_processor_warm"] = round(statistics.median(ratios), 2)
        out["processor_equal_to_fast"] = [r["total_tokens"] for r in res_warm] == [r["total_tokens"] for r in res_fast]
    tokens = [r["total_tokens"] for r in res_warm]
    out["mean_tokens"] = round(sum(tokens) / len(tokens), 1)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}  # noqa: RET504


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--label", default="")
    ap.add_argument("--zipf", action="store_true", help="text from a 50k pseudo-word Zipf vocabulary")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/processor_<UTC>.json)")
    a = ap.parse_args()
    dest = ResultsFile(a.results, "processor")
    global ZIPF
    ZIPF = a.zipf
    load = os.getloadavg()
    run = {"label": a.label, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                                       f"Python {platform.python_version()}",
           "cpus_allowed": sorted(os.sched_getaffinity(0)), "loadavg_start": [round(x, 2) for x in load],
           "command": " ".join(["python", *sys.argv]), "text": "zipf" if a.zipf else "28 words", "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder, fast in (("gemma3", gemma_folder(Path(tmp)), False),
                                   ("qwen3-vl", qwen_folder(Path(tmp)), True)):
            r = bench_model(name, folder, a.n, fast)
            run["models"].append(r)
            print(json.dumps(r), flush=True)
    run["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    run["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({k: v for k, v in run.items() if k != "models"}))
    dest.write([run])  # the shape of the older files, which held several runs


if __name__ == "__main__":
    main()
