"""Samples/s of the two counting rules on one core: `python bench/bench_counts.py [--model-dir DIR] [-n N]`.

Synthetic multi-turn samples (system, 1-2 images of a few repeated sizes, tools on every 4th); the first
pass is the cold figure (processor rule: every size new to the cache), the second the warm one.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

from pack_assets.core.profiles import resolve_profile
from pack_assets.core.tokens import TokenCounter

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a thing up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def samples(n: int, seed: int = 0) -> list[tuple[list[dict], list, list]]:
    rng = random.Random(seed)
    sizes = [[640, 480], [1024, 768], [1280, 720], [512, 512], [800, 600]]
    words = "the a cat dog sat on mat red blue image shows large small tree house car".split()
    out = []
    for i in range(n):
        k = rng.randint(0, 2)
        text = lambda: {"type": "text", "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 80)))}  # noqa: E731
        msgs = [{"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
                {"role": "user", "content": [{"type": "image"}] * k + [text()]},
                {"role": "assistant", "content": [text()]},
                {"role": "user", "content": [text()]},
                {"role": "assistant", "content": [text()]}]
        if i % 4 == 0:
            msgs[0]["tools"] = TOOLS
        out.append((msgs, [rng.choice(sizes) for _ in range(k)], []))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="qwen3-vl")
    ap.add_argument("--model-dir")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--label", default="", help="what code this is (e.g. a commit), kept in the results file")
    ap.add_argument("--results", help="append the figures to this JSON file (a list of runs)")
    a = ap.parse_args()
    counter = TokenCounter(resolve_profile(a.profile, a.model_dir))
    data = samples(a.n)
    run = {"label": a.label, "profile": counter.profile.name, "backend": counter.backend, "n": a.n,
           "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"}
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        res = list(counter.count_many(data))
        dt = time.perf_counter() - t0
        bad = sum(isinstance(r, Exception) for r in res)
        run[f"{label}_samples_per_s"] = round(a.n / dt, 1)
        print(f"{counter.profile.name} [{counter.backend}] {label}: {a.n / dt:,.0f} samples/s ({a.n} in {dt:.2f} s, "
              f"{bad} rejected)")
    if a.results:
        path = Path(a.results)
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(runs + [run], indent=1) + "\n")


if __name__ == "__main__":
    main()
