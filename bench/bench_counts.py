"""Samples/s of the two counting rules on one core: `python bench/bench_counts.py [--model-dir DIR] [-n N]`.

Synthetic multi-turn samples (system, 1-2 images of a few repeated sizes, tools on every 4th); the first
pass is the cold figure (processor rule: every size new to the cache), the second the warm one.
``--one-image``: the issue's yardstick instead, one image and ~400 text tokens per sample. ``--family F``
(internvl, llava-onevision, gemma3): the checkpoint folder the tests use (tests/fixtures/models), unpacked
to a temp folder. A ``tokenizers`` family with the chunk -> count cache (Gemma 3) starts each pass with it
empty; ``--no-chunk-cache`` runs every text through the tokenizer (the rule before it). ``--backend
tokenizers``: a byte-level BPE (Qwen) off tiktoken, through the cache. ``--zipf``: the
one-image samples' words from a 50k pseudo-word Zipf vocabulary (k // 4 words: ~the same tokens, pseudo-words being
rarer pieces).
``--pan-and-scan``: the folder's preprocessor_config.json with ``do_pan_and_scan: true`` (Gemma 3; four of the
five bench sizes get 2 crops each, 512x512 none).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile  # noqa: E402

from pack_assets.core.counting.profiles import resolve_profile  # noqa: E402
from pack_assets.core.counting.tokens import TokenCounter  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a thing up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def samples(n: int, seed: int = 0) -> list[tuple[list[dict], list, list]]:
    rng = random.Random(seed)
    sizes = [[640, 480], [1024, 768], [1280, 720], [512, 512], [800, 600]]
    words = "the a cat dog sat on mat red blue image shows large small tree house car".split()
    out = []
    for i in range(n):
        k = rng.randint(0, 2)
        def text():
            return {"type": "text", "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 80)))}

        msgs = [{"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
                {"role": "user", "content": [{"type": "image"}] * k + [text()]},
                {"role": "assistant", "content": [text()]},
                {"role": "user", "content": [text()]},
                {"role": "assistant", "content": [text()]}]
        if i % 4 == 0:
            msgs[0]["tools"] = TOOLS
        out.append((msgs, [rng.choice(sizes) for _ in range(k)], []))
    return out


def zipf_words(n_words: int = 50_000, s: float = 1.1, seed: int = 7) -> tuple[list[str], list[float]]:
    """A vocabulary of pseudo-words (2-12 letters, some capitalized or with punctuation) and Zipf cumulative
    weights: text whose distinct words keep coming, as natural text's do (the chunk cache's hard case)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words, seen = [], set()
    while len(words) < n_words:
        w = "".join(rng.choice(letters) for _ in range(rng.randint(2, 12)))
        w = w.capitalize() if rng.random() < 0.1 else w
        w = w + rng.choice(".,;:!?") if rng.random() < 0.08 else w
        if w not in seen:
            seen.add(w)
            words.append(w)
    cum, total = [], 0.0
    for r in range(1, n_words + 1):
        total += 1 / r**s
        cum.append(total)
    return words, cum


def one_image_samples(n: int, seed: int = 0, zipf: bool = False) -> list[tuple[list[dict], list, list]]:
    """One image of a few repeated sizes + ~400 text tokens (system, two turns each way); ``zipf``: words
    from a 50k pseudo-word Zipf vocabulary instead of 16 words."""
    rng = random.Random(seed)
    sizes = [[640, 480], [1024, 768], [1280, 720], [512, 512], [800, 600]]
    if zipf:
        vocab, cum = zipf_words()
        text = lambda k: {"type": "text", "text": " ".join(rng.choices(vocab, cum_weights=cum, k=k // 4))}  # noqa: E731
    else:
        words = "the a cat dog sat on mat red blue image shows large small tree house car".split()
        text = lambda k: {"type": "text", "text": " ".join(rng.choice(words) for _ in range(k))}  # noqa: E731
    return [([{"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
              {"role": "user", "content": [{"type": "image"}, text(rng.randint(60, 100))]},
              {"role": "assistant", "content": [text(rng.randint(140, 180))]},
              {"role": "user", "content": [text(rng.randint(20, 40))]},
              {"role": "assistant", "content": [text(rng.randint(90, 130))]}], [rng.choice(sizes)], [])
            for _ in range(n)]


def family_dir(family: str) -> str:
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from family_fixtures import materialize

    return str(materialize(Path(tempfile.mkdtemp(prefix="bench-counts-")), (family,))[family])


def pan_and_scan_dir(folder: str) -> str:
    """A copy of a Gemma 3 folder with pan-and-scan on (the other pan_and_scan_* keys as they are)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="bench-counts-pas-")) / Path(folder).name
    shutil.copytree(folder, d)
    cfg = json.loads((d / "preprocessor_config.json").read_text(encoding="utf-8"))
    (d / "preprocessor_config.json").write_text(json.dumps({**cfg, "do_pan_and_scan": True}), encoding="utf-8")
    return str(d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="qwen3-vl")
    ap.add_argument("--model-dir")
    ap.add_argument("--family", help="internvl | llava-onevision | gemma3: the test fixtures' folder")
    ap.add_argument("--one-image", action="store_true", help="1 image + ~400 text tokens per sample")
    ap.add_argument("--zipf", action="store_true", help="with --one-image: 50k pseudo-words, Zipf-drawn")
    ap.add_argument("--no-chunk-cache", action="store_true",
                    help="every text through the tokenizer (the rule before the chunk -> count cache)")
    ap.add_argument("--pan-and-scan", action="store_true",
                    help="Gemma 3 (--family gemma3 or --model-dir): the folder with do_pan_and_scan on")
    ap.add_argument("--backend", default="auto", choices=("auto", "tiktoken", "tokenizers"),
                    help="tokenizers: a byte-level BPE off tiktoken, through the chunk -> count cache")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--label", default="", help="what code this is (e.g. a commit), kept in the results file")
    ap.add_argument("--results", help="a new file or folder (default: a new bench/results/counts_<UTC>.json)")
    a = ap.parse_args()
    dest = ResultsFile(a.results, "counts")
    model_dir = family_dir(a.family) if a.family else a.model_dir
    if a.pan_and_scan:
        if not model_dir:
            ap.error("--pan-and-scan needs --family gemma3 or --model-dir")
        model_dir = pan_and_scan_dir(model_dir)
    counter = TokenCounter(resolve_profile(a.profile, model_dir), backend=a.backend,
                          chunk_cache=not a.no_chunk_cache)
    data = one_image_samples(a.n, zipf=a.zipf) if a.one_image else samples(a.n)
    if counter.backend != "processor":
        counter.lengths([""])  # builds the tokenizer (lazy) outside the timed passes
    chunks = counter.chunks if counter.backend != "processor" else None
    run = {"label": a.label, "profile": counter.profile.name, "backend": counter.backend, "n": a.n,
           "chunk_cache": chunks is not None,
           "shape": ("one-image-zipf" if a.zipf else "one-image") if a.one_image else "mixed",
           "pan_and_scan": a.pan_and_scan,
           "load": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
           "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"}
    for label in ("cold", "warm"):
        if chunks is not None:  # each pass starts with an empty chunk cache: the warm pass is no replay
            chunks.clear()
            misses_before = chunks.misses
        t0 = time.perf_counter()
        res = list(counter.count_many(data))
        dt = time.perf_counter() - t0
        bad = sum(isinstance(r, Exception) for r in res)
        run[f"{label}_samples_per_s"] = round(a.n / dt, 1)
        print(f"{counter.profile.name} [{counter.backend}{', chunk cache' if chunks else ''}] {label}: "
              f"{a.n / dt:,.0f} samples/s ({a.n} in {dt:.2f} s, {bad} rejected)")
    if chunks is not None:
        run["chunk_misses_last_pass"] = chunks.misses - misses_before
    ok = [r for r in res if isinstance(r, dict)]
    run["mean_text_tokens"] = round(sum(r["text_tokens"] for r in ok) / max(1, len(ok)))
    run["mean_total_tokens"] = round(sum(r["total_tokens"] for r in ok) / max(1, len(ok)))
    print(f"mean per sample: {run['mean_text_tokens']} text tokens, {run['mean_total_tokens']} in all")
    dest.write([run])  # the shape of the older files, which held several runs


if __name__ == "__main__":
    main()
