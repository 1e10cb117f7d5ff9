"""Samples/s of the two counting rules on one core: `python bench/bench_counts.py [--model-dir DIR] [-n N]`.

Synthetic multi-turn samples (system, 1-2 images of a few repeated sizes, tools on every 4th); the first
pass is the cold figure (processor rule: every size new to the cache), the second the warm one.
"""

from __future__ import annotations

import argparse
import random
import time

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
    a = ap.parse_args()
    counter = TokenCounter(resolve_profile(a.profile, a.model_dir))
    data = samples(a.n)
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        res = list(counter.count_many(data))
        dt = time.perf_counter() - t0
        bad = sum(isinstance(r, Exception) for r in res)
        print(f"{counter.profile.name} [{counter.backend}] {label}: {a.n / dt:,.0f} samples/s ({a.n} in {dt:.2f} s, "
              f"{bad} rejected)")


if __name__ == "__main__":
    main()
