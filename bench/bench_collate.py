"""Host memory of PackCollator on long packs: by default (the packing as seq_idx / cu_seqlens / a padding mask)
nothing grows with L², a dense mask (block_mask=True) does.

Each measurement runs in a fresh subprocess: B encoded text packs of L tokens (sub-samples of 300-3,000
tokens), collated once; reported: the peak of Python/numpy allocations during the call (tracemalloc; the
collator builds its arrays in numpy and hands them to torch without a copy) and the growth of the process's
peak RSS (ru_maxrss, which also sees torch's own allocations, i.e. the dense mask). Results to a new file:

    .venv/bin/python bench/bench_collate.py [FILE or FOLDER]   # default: a new bench/results/collate_masks_<UTC>.json
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultsFile, machine  # noqa: E402

_CHILD = r"""
import json, resource, sys, tracemalloc
import numpy as np
import torch
from pack_assets.reader import PackCollator

B, L, dense = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "dense"
rng = np.random.default_rng(0)
packs = []
for p in range(B):
    lens = []
    while sum(lens) < L:
        lens.append(int(min(rng.integers(300, 3000), L - sum(lens))))
    packs.append({"input_ids": rng.integers(0, 150000, L), "labels": rng.integers(0, 150000, L),
                  "loss_weights": np.ones(L, np.float32), "mm_token_type_ids": np.zeros(L, np.int64),
                  "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                  "position_ids": np.concatenate([np.arange(k) for k in lens]),
                  "visual_order": [[] for _ in lens], "images": [[] for _ in lens], "videos": [[] for _ in lens]})
collate = PackCollator(pad_id=0, block_mask=dense)
PackCollator(pad_id=0)(packs[:1])  # imports and first-call costs outside the measurement (no mask: no L² peak)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
batch = collate(packs)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"B": B, "L": L, "mask": "dense" if dense else "default", "tracemalloc_peak_mib": peak / 2**20,
                  "rss_peak_growth_mib": (rss1 - rss0) / 1024, "keys": sorted(batch),
                  "largest_tensor_elements": max(v.numel() for v in batch.values() if hasattr(v, "numel"))}))
"""


def run(B: int, L: int, mask: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(B), str(L), mask], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(out: ResultsFile) -> None:
    rows = [run(4, L, "default") for L in (2048, 4096, 8192, 16384)]
    rows += [run(4, L, "dense") for L in (2048, 4096, 8192)]  # 4 x 16k dense would be 1 GiB of bool
    for r in rows:
        print(
            f"B={r['B']} L={r['L']:>6} {r['mask']:>7}: tracemalloc peak {r['tracemalloc_peak_mib']:8.2f} MiB, "
            f"RSS peak growth {r['rss_peak_growth_mib']:8.1f} MiB, "
            f"largest tensor {r['largest_tensor_elements']:,} elements"
        )
    default = {r["L"]: r for r in rows if r["mask"] == "default"}
    dense = {r["L"]: r for r in rows if r["mask"] == "dense"}
    doc = {
        "machine": machine(),
        "conditions": "shared machine, provisional; one subprocess per row",
        "rows": rows,
        "default_peak_ratio_16k_vs_8k": default[16384]["tracemalloc_peak_mib"] / default[8192]["tracemalloc_peak_mib"],
        "dense_rss_ratio_8k_vs_4k": dense[8192]["rss_peak_growth_mib"] / max(dense[4096]["rss_peak_growth_mib"], 1e-9),
    }
    out.write(doc)
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))


if __name__ == "__main__":
    main(ResultsFile(sys.argv[1] if len(sys.argv) > 1 else None, "collate_masks"))
