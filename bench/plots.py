"""Draws the benchmark figures for docs/benchmarks.md from the results the bench scripts wrote.

    python bench/plots.py --scale bench/out/scale/results.json --bytes bench/out/bytes/results.json --out docs/img
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = ["manifest+token_lengths", "pack_plan", "packed_shards", "audit_report"]


def _merged(path: Path) -> dict:
    merged: dict = {}
    for rec in json.loads(path.read_text()):
        merged.update(rec)
    return merged


def plot_scale(results: list[dict], dest: Path) -> None:
    runs = [r for r in results if "factor" in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["samples"] / 1000 for r in runs]
    bottom = [0.0] * len(runs)
    for stage in STAGES:
        vals = [r["stage_seconds"].get(stage, 0) for r in runs]
        ax1.bar([f"{r['factor']}×\n{r['samples']:,}" for r in runs], vals, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_ylabel("seconds (wall, 2 cores)")
    ax1.set_title("pack-assets run by stage")
    ax1.legend(fontsize=8)
    ax2.plot(xs, [r["full_run_s"] for r in runs], "o-", label="measured")
    k = runs[0]["full_run_s"] / xs[0]
    ax2.plot(xs, [k * x for x in xs], "--", color="grey", label="linear from 1×")
    ax2.set_xlabel("thousand samples")
    ax2.set_ylabel("seconds")
    ax2.set_title("total vs input size")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def plot_bytes(res: dict, dest: Path) -> None:
    gb = res["bytes"] / 1e9
    rows = [("cat", res["cat_s"]), ("sha256sum (1 proc)", res["sha256sum_s"]),
            ("sha256sum (2 procs)", res["sha256sum_2proc_s"]), ("cp", res["cp_s"])]
    if "cp_sync_s" in res:
        rows.append(("cp + sync", res["cp_sync_s"]))
    n_ref = len(rows)
    rows += [(f"pack-assets: {s}", res["stage_seconds"][s]) for s in STAGES]
    rows.append(("pack-assets: whole run", res["full_run_s"]))
    fig, ax = plt.subplots(figsize=(9, 4))
    names, secs = zip(*rows)
    colors = ["#999999"] * n_ref + ["#1f77b4"] * len(STAGES) + ["#d62728"]
    ax.barh(names[::-1], secs[::-1], color=colors[::-1])
    for i, (name, s) in enumerate(zip(names[::-1], secs[::-1])):
        # the plan reads token counts, not media bytes: a GB/s figure would mislead
        rate = "" if name.endswith("pack_plan") or not s else f" ({gb / s:.2f} GB/s)"
        ax.text(s, i, f" {s:.0f} s{rate}", va="center", fontsize=8)
    ax.set_xlabel(f"seconds for the same {gb:.1f} GB")
    ax.set_title("byte-heavy set: pipeline stages next to the physical limits")
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=Path)
    ap.add_argument("--bytes", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scale:
        plot_scale(json.loads(args.scale.read_text()), args.out / "scaling.png")
    if args.bytes:
        plot_bytes(_merged(args.bytes), args.out / "bytes.png")


if __name__ == "__main__":
    main()
