"""What the user reads: the plan's what-if sweep and audit_report.md, with their PNG plots (matplotlib
figures drawn by Agg: no display, no pyplot)."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import drawing, safety
from .aside import run_aside
from .blend import DRIFT_LIMIT, SHARE_TOLERANCE, epoch_name
from .cpad import padded
from .plan import PlanConfig, PlanInfo
from .recipe import Recipe
from .results import AuditResult, Markdown, png_data_uri
from .store import atomic_write_text
from .sweep import simulate

WHAT_IF = "what_if.json"


# Fixed margins in inches instead of tight_layout, which lays every text out once more before the PNG is
# drawn; sized for these plots' tick labels, axis labels and titles.
MARGIN_IN = {"left": 0.85, "right": 0.3, "bottom": 0.5, "top": 0.3}


class _Figures:
    """The two pyplot calls the plots use, on bare `matplotlib.figure.Figure`s (PNG through Agg): pyplot's
    import (backends, widgets, colorbar) and its figure manager buy nothing for files."""

    @staticmethod
    def subplots(nrows: int = 1, ncols: int = 1, figsize=(6.4, 4.8), left_in: float | None = None):
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        (w, h), m = figsize, {**MARGIN_IN, **({"left": left_in} if left_in else {})}
        fig.subplots_adjust(left=m["left"] / w, right=1 - m["right"] / w, bottom=m["bottom"] / h,
                            top=1 - m["top"] / h, wspace=0.28)
        return fig, fig.subplots(nrows, ncols)

    @staticmethod
    def close(fig=None) -> None:
        """Nothing to release: no pyplot figure manager holds the figure."""


plt = None  # the figure maker (_Figures), set at the first plot; tests swap it for a stand-in


def _plt():
    """The figure maker, matplotlib imported at the first plot: processes that never plot (shard and audit
    workers, `--help`) do not pay its import."""
    global plt
    if plt is None:
        plt = _Figures
    return plt


def _plain_log(axis, base: int = 10) -> None:
    """Plain numbers (100, 2048) on a log axis: matplotlib's default 10^k labels go through mathtext, whose
    parser is built anew in each process that plots."""
    from matplotlib.ticker import LogFormatter

    axis.set_major_formatter(LogFormatter(base=base))
    axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    _plt().close(fig)


def _hist(values, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts and edges, binned where the values are: `_bars` draws them as `ax.hist(values, bins)` would."""
    return np.histogram(np.asarray(values), bins=bins)


def _bars(ax, hist: tuple[np.ndarray, np.ndarray], **kw) -> None:
    counts, edges = hist
    ax.hist(edges[:-1], bins=edges, weights=counts, **kw)


def draw_lengths(data: dict, path: Path) -> None:
    fig, ax = _plt().subplots(figsize=(6, 3.2))
    for mt, n, hist in data["groups"]:
        _bars(ax, hist, alpha=0.55, label=f"{mt} ({n})", log=True)
    ax.axvline(data["max_len"], color="k", ls="--", lw=1, label=f"max_len {data['max_len']}")
    _plain_log(ax.yaxis)
    ax.set_xlabel("tokens per sample")
    ax.set_ylabel("samples")
    ax.legend(fontsize=7)
    ax.set_title("Sample length per media type")
    _save(fig, path)


def draw_fill(data: dict, path: Path) -> None:
    fig, (a, b) = _plt().subplots(1, 2, figsize=(8, 3.2))
    _bars(a, data["fill"])
    a.set_xlabel("pack fill (tokens / max_len)")
    a.set_ylabel("packs")
    a.set_title("Fill per pack")
    if len(data["drift"]):
        b.plot(data["drift"])
    b.set_xlabel("pack (output order)")
    b.set_ylabel(f"samples / pack (mean of {data['window']})")
    b.set_title("Drift over the run")
    _save(fig, path)


def draw_reasons(rows: list[tuple], path: Path) -> None:
    fig, ax = _plt().subplots(figsize=(6, max(2.0, 0.6 + 0.3 * len(rows))),  # room for the reason names
                              left_in=0.25 + 0.065 * max((len(r[0]) for r in rows), default=4))
    ax.barh([r[0] for r in rows][::-1], [r[1] for r in rows][::-1])
    ax.set_xlabel("rows")
    ax.set_title("Rejection reasons")
    _save(fig, path)


def audit_figures(con, work: Path, max_len: int, pool: Executor | None = None) -> dict[str, drawing.Drawn]:
    """The report's three figures, asked for as soon as the plan is known (``pool``'s processes draw them while
    the audit reads the outputs back); `write_report` waits for them."""
    plots = work / "plots"
    # each media type's lengths as one numpy column, not a Python int per sample (10M of them at 10M samples)
    lens = [(mt, con.execute("SELECT total_tokens FROM token_lengths WHERE status='ok' "
                             "AND media_type IS NOT DISTINCT FROM ?", [mt]).fetchnumpy()["total_tokens"])
            for (mt,) in con.execute("SELECT DISTINCT media_type FROM token_lengths WHERE status='ok' ORDER BY 1"
                                     ).fetchall()]
    fills = np.asarray([r[0] for r in con.execute("SELECT total_token_len FROM pack_plan ORDER BY pack_id").fetchall()])
    spp = np.asarray([r[0] for r in con.execute("SELECT len(sample_ids) FROM pack_plan ORDER BY pack_id").fetchall()])
    w = max(1, min(256, len(spp) // 8)) if len(spp) else 0
    reasons = con.execute("SELECT reason, count(*) FROM rejected GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 15").fetchall()
    return {
        "lengths": drawing.draw(pool, draw_lengths, {"groups": [(mt, len(v), _hist(v, 60)) for mt, v in lens],
                                               "max_len": max_len}, plots / "lengths.png"),
        "fill": drawing.draw(pool, draw_fill, {"fill": _hist(fills / max_len if len(fills) else [], 40), "window": w,
                                         "drift": np.convolve(spp, np.ones(w) / w, mode="valid") if w else []},
                             plots / "fill.png"),
        "reasons": drawing.draw(pool, draw_reasons, reasons, plots / "reasons.png"),
    }


def write_report(con, work: Path, result: AuditResult, info: PlanInfo, figures: dict[str, drawing.Drawn]) -> dict:
    plots = {k: d.wait() for k, d in figures.items()}
    reasons = figures["reasons"].data
    lines = [*_verdict(result, info), *_totals(result.stats), *_fill(info.stats), *_blend(result.stats),
             *_per_shard(result.stats),
             *_what_if(read_what_if(work, info.fingerprint)), *_waiting(info.stats),
             *_rejections(con, reasons), *_dropped(con), "", "## Violations", ""]
    lines += [f"- **{v['check']}**: {v['detail']}" for v in result.violations[:200]] or ["None: every check passed."]
    text = "\n".join(lines) + "\n"
    atomic_write_text(work / "audit_report.md", text)
    return {"path": str(work / "audit_report.md"), "markdown": text, "plots": {k: str(v) for k, v in plots.items()}}


def _verdict(result: AuditResult, info: PlanInfo) -> list[str]:
    waiting = result.waiting
    return [
        "# pack_assets audit report",
        "",
        f"**Verdict: {result.verdict}** ({len(result.violations)} violation(s)); "
        f"plan `{info.fingerprint}`, profile `{info.profile}`, max_len {info.config.max_len}, "
        f"algorithm `{info.config.algorithm}`.",
        "",
        *([f"**INCOMPLETE: {len(waiting)} shard(s) in the input were not counted** (never registered, still "
           "waiting for their counts, or changed since their scan), so they are in no pack and were not audited: "
           f"{', '.join(waiting[:50])}{' ...' if len(waiting) > 50 else ''}. "
           "Run them (`pack-assets run`, the sensor, or their partitions), then plan and audit again.", ""]
          if waiting else []),
    ]


def _totals(stats: dict) -> list[str]:
    return [
        "## Totals (read back from the output shards)",
        "",
        "| samples read | packed | dropped | rejected | split (into pieces) | packs | output shards | "
        "media members re-hashed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {stats['samples_read']} | {stats['packed']} | {stats['dropped']} | {stats['rejected']} | "
        f"{stats.get('split', 0)} ({stats.get('split_pieces', 0)}) | "
        f"{stats['packs_read']} | {stats['output_shards']} | {stats['media_members_checked']} |",
        "",
        "Samples read = packed + dropped + rejected + split; a split sample's pieces (cut at assistant turns, "
        "`overlong: split`) are each packed like a sample and all read back.",
        "",
        *([f"{stats['output_shards_trusted']} output shard(s) unchanged since the last clean audit were re-read "
           "whole and hashed: their bytes are the ones it passed (the file digest it recorded), so they were not "
           "checked member by member again; their planned packs are counted as read.", ""]
          if stats.get("output_shards_hashed") else
          [f"{stats['output_shards_trusted']} output shard(s) unchanged since the last clean audit were not read "
           "again (audit scope `changed`); their planned packs are counted as read.", ""]
          if stats.get("output_shards_trusted") else []),
        *([f"{stats['processor_checked']} sample(s) recounted with the model's real processor "
           f"({stats['processor']}, setting `check_samples`); each difference is a `processor_mismatch` violation.",
           ""] if "processor_checked" in stats else []),
    ]


def _fill(plan_stats: dict) -> list[str]:
    lines = ["## Fill vs the lower bound", "",
             "| media type | samples | packs | lower bound (L2) | over bound | fill | dropped |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mt, v in sorted(plan_stats["per_media_type"].items()):
        lines.append(f"| {mt} | {v['samples']} | {v['packs']} | {v['l2']} | {v['over_bound']} | {v['fill']:.2%} | "
                     f"{v['dropped']} |")
    balance = plan_stats.get("balance")
    return lines + [
        f"| **all** | {plan_stats['samples']} | {plan_stats['packs']} | {plan_stats['lower_bound']} | "
        f"{plan_stats['packs_over_bound']} | {plan_stats['fill']:.2%} | {plan_stats['dropped']} |",
        "",
        f"Samples per pack: mean {plan_stats['mean_samples_per_pack']:.2f}, max {plan_stats['max_samples_per_pack']}; "
        f"drift (max/min of windowed means) {plan_stats['drift']:.3f}."
        + (f" World size {balance['world_size']}: Σℓ² max/mean per group {balance['cost_imbalance_mean']:.3f} "
           f"(worst {balance['cost_imbalance_max']:.3f})." if balance else "")
        + (f" Context parallelism: each sub-sample padded to a multiple of {plan_stats['sample_multiple']}; the "
           f"bounds are on padded lengths, fill with that padding {plan_stats['fill_padded']:.2%}."
           if plan_stats.get("sample_multiple", 1) > 1 else ""),
        "",
        "![lengths](plots/lengths.png)",
        "",
        "![fill](plots/fill.png)",
    ]


def _blend(stats: dict) -> list[str]:
    if "per_dataset" not in stats:
        return []
    return ["", f"## Per dataset (blend epoch {stats.get('blend', {}).get('epoch', 0)})", "", *blend_lines(stats)]


def _per_shard(stats: dict) -> list[str]:
    lines = ["", "## Per source shard", "", "| shard | read | packed | dropped | rejected | split (into pieces) |",
             "|---|---:|---:|---:|---:|---:|"]
    for shard, c in stats["per_shard"].items():
        lines.append(f"| {shard} | {c.get('read', 0)} | {c.get('packed', 0)} | {c.get('dropped', 0)} | "
                     f"{c.get('rejected', 0)} | {c.get('split', 0)} ({c.get('pieces', 0)}) |")
    return lines


def _what_if(sim: WhatIf | None) -> list[str]:
    if sim is None:
        return []
    return ["", "## What if (other max lengths and algorithms, same samples)", "",
            "| max length | algorithm | packs | lower bound | fill | dropped | mean / max samples per pack |",
            "|---:|---|---:|---:|---:|---:|---|",
            *(f"| {r['max_len']} | {r['algorithm']} | {r['packs']} | {r['lower_bound']} | {r['efficiency']:.2%} | "
              f"{r['dropped']} | {r['mean_samples_per_pack']:.1f} / {r['max_samples_per_pack']} |"
              for r in sim.results),
            "", f"Recommended max length: **{sim.recommended_max_len}** (the smallest with ≥ 98 % fill and "
            "≤ 0.1 % dropped).", "", "![lengths](plots/length_distribution.png)", "",
            "![fill vs max length](plots/fill_vs_max_len.png)"]


def _waiting(plan_stats: dict) -> list[str]:
    waiting = plan_stats.get("shards_waiting")
    if not waiting:
        return []
    return ["", f"**{len(waiting)} registered shard(s) were not counted yet and are not in this plan** (they join "
            f"the next one): {', '.join(waiting[:20])}"]


def _rejections(con, reasons: list[tuple]) -> list[str]:
    lines = ["", "## Rejections", ""]
    if not reasons:
        return lines + ["None."]
    examples = {r[0]: r[1:] for r in con.execute(
        "SELECT reason, any_value(shard), any_value(key), any_value(detail) FROM rejected GROUP BY 1 ORDER BY 1"
    ).fetchall()}
    lines += ["| reason | rows | example (shard / key) | detail |", "|---|---:|---|---|"]
    for reason, n in reasons:
        shard, key, detail = examples.get(reason, ("", "", ""))
        lines.append(f"| `{reason}` | {n} | {shard} / {key} | {str(detail)[:120].replace('|', '/')} |")
    return lines + ["", "![reasons](plots/reasons.png)"]


def _dropped(con) -> list[str]:
    dropped = con.execute("SELECT sample_id, total_tokens FROM dropped ORDER BY total_tokens DESC LIMIT 20").fetchall()
    n_dropped = con.execute("SELECT count(*) FROM dropped").fetchone()[0]
    return ["", f"## Dropped ({n_dropped}, longest first)", "", *([f"- `{sid}`: {n} tokens" for sid, n in dropped]
                                                                  or ["None."])]


CDF_POINTS = 2048  # points of a drawn CDF: more than the figure's pixels


def _length_distribution(groups: dict[str, np.ndarray], max_lens: list[int]) -> dict:
    """What `draw_distribution` shows of these lengths (per group: histogram and CDF points)."""
    shown = {}
    for name, lens in sorted(groups.items()):
        lens = np.sort(np.asarray(lens))
        at = np.unique(np.linspace(0, len(lens) - 1, min(len(lens), CDF_POINTS)).astype(np.int64))
        shown[name] = {"hist": _hist(lens, 60), "x": lens[at], "cdf": (at + 1) / max(1, len(lens))}
    return {"groups": shown, "max_lens": max_lens}


def _fill_vs_max_len(sim: dict) -> dict:
    """What `draw_fill_vs_max_len` shows of a sweep."""
    return {"fill": {alg: sorted((r["max_len"], r["efficiency"]) for r in sim["results"] if r["algorithm"] == alg)
                     for alg in sorted({r["algorithm"] for r in sim["results"]})},
            "recommended": sim["recommended_max_len"]}


def plot_simulation(lengths: np.ndarray, sim: dict, folder: Path, media_lengths: dict | None = None,
                    pool: Executor | None = None) -> dict:
    """Length histogram + CDF (per media type when given) and fill vs max length per algorithm, drawn
    (`drawing.draw`, by ``pool`` when given): the two files' paths."""
    drawn = {
        "length_distribution": drawing.draw(pool, draw_distribution, _length_distribution(
            media_lengths or {"all": lengths}, sorted({r["max_len"] for r in sim["results"]})),
            folder / "length_distribution.png"),
        "fill_vs_max_len": drawing.draw(pool, draw_fill_vs_max_len, _fill_vs_max_len(sim),
                                        folder / "fill_vs_max_len.png"),
    }
    return {k: str(d.wait()) for k, d in drawn.items()}


def draw_distribution(data: dict, path: Path) -> None:
    fig, (a, b) = _plt().subplots(1, 2, figsize=(8, 3.2))
    for name, g in data["groups"].items():
        _bars(a, g["hist"], alpha=0.55, label=name, log=True)
        b.plot(g["x"], g["cdf"], label=name)
    for m in data["max_lens"]:
        b.axvline(m, color="grey", lw=0.6, ls=":")
    a.set_xlabel("tokens per sample")
    a.set_title("Length histogram")
    b.set_xlabel("tokens per sample")
    b.set_title("CDF")
    b.set_xscale("log")
    _plain_log(a.yaxis)
    _plain_log(b.xaxis)
    a.legend(fontsize=7)
    _save(fig, path)


def draw_fill_vs_max_len(data: dict, path: Path) -> None:
    fig, ax = _plt().subplots(figsize=(6, 3.2))
    for alg, points in data["fill"].items():
        ax.plot([m for m, _ in points], [f for _, f in points], marker="o", label=alg)
    ax.axvline(data["recommended"], color="k", ls="--", lw=1, label="recommended")
    ax.set_xscale("log", base=2)
    _plain_log(ax.xaxis, base=2)
    ax.set_xlabel("max length")
    ax.set_ylabel("fill")
    ax.set_title("Fill vs max length")
    ax.legend(fontsize=7)
    _save(fig, path)


@dataclass(frozen=True)
class WhatIf:
    """The current samples planned at other max lengths and with other algorithms."""

    plan_fingerprint: str  # the plan it was made beside: the report shows it only with that plan
    results: list[dict]
    recommended_max_len: int
    plots: dict[str, str]

    def table(self) -> str:
        return ("| max length | algorithm | packs | bound | fill | dropped |\n|---:|---|---:|---:|---:|---:|\n"
                + "\n".join(f"| {r['max_len']} | {r['algorithm']} | {r['packs']} | {r['lower_bound']} | "
                            f"{r['efficiency']:.2%} | {r['dropped']} |" for r in self.results))

    def as_metadata(self) -> dict:
        plots = "\n\n".join(f"![{k}]({png_data_uri(Path(v))})" for k, v in self.plots.items())
        return {"what_if": Markdown(f"{self.table()}\n\nRecommended max length: {self.recommended_max_len}\n\n{plots}"),
                "recommended_max_len": self.recommended_max_len}


class WhatIfBeside:
    """The what-if sweep beside a plan (what the pack_plan asset shows with it): `start` is `plan.run_plan`'s
    ``on_lengths``, so the sweep starts from the lengths the plan reads while the plan goes on; `finish` waits
    for it and records it for the plan's fingerprint. ``pool``: where the sweep and its figures run
    (`start_what_if`)."""

    def __init__(self, work: Path, config: PlanConfig, pool: Executor | None = None) -> None:
        self.work, self.config, self.pool = work, config, pool
        self._finish: Callable[[str], WhatIf] | None = None

    def start(self, rows: dict[str, np.ndarray]) -> None:
        self._finish = start_what_if(self.work, self.config, rows, self.pool)

    def finish(self, plan_fingerprint: str) -> WhatIf:
        return self._finish(plan_fingerprint)


def _max_lens(config: PlanConfig) -> list[int]:
    return sorted({config.max_len // 4, config.max_len // 2, config.max_len, config.max_len * 2})


def _sweep_drawn(held: dict[str, np.ndarray] | Path, config: PlanConfig, path: Path) -> dict:
    """The sweep, and its fill figure drawn where it was simulated (one hand-off, not two); on the lengths the
    plan packs (each padded to the context-parallel multiple, core/cpad.py)."""
    lengths = _lengths_held(held)["lengths"]
    lengths = padded(lengths, config.multiple) if config.multiple > 1 else lengths
    sim = simulate(lengths, _max_lens(config), sorted({config.algorithm, "bfd", "next_fit"}), config.caps,
                   seed=config.seed)
    draw_fill_vs_max_len(_fill_vs_max_len(sim), path)
    return sim


def _distribution_drawn(held: dict[str, np.ndarray] | Path, max_lens: list[int], path: Path) -> None:
    draw_distribution(_length_distribution(_by_media_type(_lengths_held(held)), max_lens), path)


def _by_media_type(held: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    lengths, codes, types = held["lengths"], held["codes"], held["types"].tolist()
    if len(types) == 1:  # (no copy of every length)
        return {types[0]: lengths}
    return {mt: lengths[codes == k] for k, mt in enumerate(types)} or {"all": lengths}


def _lengths_held(held: dict[str, np.ndarray] | Path) -> dict[str, np.ndarray]:
    """The sweep's lengths (and each one's media type as a code into ``types``), given as arrays or as the file
    `start_what_if` saved them in."""
    if isinstance(held, Path):
        with np.load(held) as z:
            return {k: z[k] for k in z.files}
    return held


def _held_for(rows: dict[str, np.ndarray], at: Path, pool: Executor | None) -> dict[str, np.ndarray] | Path:
    """The lengths of ``rows`` and their media types as codes; for a pool, saved to ``at`` (its helper reads them
    there): handed over as arrays, the command's process kept them (for a broken pool's fallback) and their
    pickles while the plan went on, a few hundred MB at 10M samples (issue 41)."""
    mtypes = rows["media_types"]
    types = sorted(set(mtypes.tolist()))
    codes = np.zeros(len(mtypes), np.int8 if len(types) < 128 else np.int32)
    for k, mt in enumerate(types[1:], 1):
        codes[mtypes == mt] = k
    held = {"lengths": rows["lengths"], "codes": codes, "types": np.asarray(types, dtype=str)}
    if pool is None:
        return held
    at.parent.mkdir(parents=True, exist_ok=True)
    with open(at, "wb") as f:
        np.savez(f, **held)
    return at


def start_what_if(work: Path, config: PlanConfig, rows: dict[str, np.ndarray], pool: Executor | None = None
                  ) -> Callable[[str], WhatIf]:
    """The what-if sweep over ``rows`` (`plan.ok_lengths`): max lengths around the configured one (¼×–2×), the
    configured algorithm against bfd and next_fit, with its figure, and the length distribution's figure,
    each a job for ``pool`` (else done now) while the plan goes on; returns what then waits for them and
    writes ``what_if.json`` for the plan's fingerprint."""
    plots = {name: work / "plots" / f"{name}.png" for name in ("length_distribution", "fill_vs_max_len")}
    # drawn under temporary names while the plan goes on, in place once it is made (a failed plan leaves the
    # last figures with the last what_if.json)
    drawn_at = {name: path.with_name(f".{path.stem}.what-if.png") for name, path in plots.items()}
    held = _held_for(rows, work / "plots" / ".lengths.what-if.npz", pool)
    sweep = run_aside(pool, _sweep_drawn, held, config, drawn_at["fill_vs_max_len"])
    distribution = run_aside(pool, _distribution_drawn, held, _max_lens(config), drawn_at["length_distribution"])

    def finish(plan_fingerprint: str) -> WhatIf:
        try:
            sim = sweep.result()
            distribution.result()
        finally:
            if isinstance(held, Path):
                held.unlink(missing_ok=True)
        for name, path in plots.items():
            safety.replace(drawn_at[name], path)
        what_if = WhatIf(plan_fingerprint, sim["results"], sim["recommended_max_len"],
                         {name: str(path) for name, path in plots.items()})
        atomic_write_text(work / WHAT_IF, json.dumps(asdict(what_if)))
        return what_if

    return finish


def read_what_if(work: Path, plan_fingerprint: str) -> WhatIf | None:
    try:
        what_if = WhatIf(**json.loads((work / WHAT_IF).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return what_if if what_if.plan_fingerprint == plan_fingerprint else None


# -- a blend's report: per dataset, each epoch's and all epochs' ------------------------------------------


def blend_report(recipe: Recipe, results: list[AuditResult]) -> str:
    lines = ["# pack_assets blend audit", "",
             f"Recipe `{recipe.path}`: {len(recipe.datasets)} dataset(s), {recipe.epochs} epoch(s), "
             f"seed {recipe.seed}. Verdicts: {', '.join(f'epoch {k} {r.verdict}' for k, r in enumerate(results))}; "
             f"each epoch's full report is `{epoch_name(0)}/audit_report.md` and so on.", ""]
    for k, r in enumerate(results):
        lines += [f"## Epoch {k}", "", *blend_lines(r.stats), ""]
    return "\n".join(lines) + "\n"


def blend_lines(stats: dict) -> list[str]:
    """The audit's per-dataset table and the proportion figures (core/report.py prints it in each epoch's report)."""
    b = stats.get("blend") or {}
    lines = ["| dataset | source samples | rejected | ok | repeat | copies drawn (⌊r⌋·ok + seeded share) | packed | "
             "dropped | token share | worst window share error |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in stats.get("per_dataset", {}).items():
        p = b.get("datasets", {}).get(name, {})
        lines.append(f"| {name} | {c['read']} | {c['rejected']} | {c['ok']} | {c['repeat']} | {c['expected']} | "
                     f"{c['packed']} | {c['dropped']} | {p.get('share', 0):.2%} | "
                     f"{p.get('window_share_error', 0):.2%} |")
    if b:
        lines += ["", f"Windows of {b['window']} packs in output order: worst token share error "
                  f"{b['worst_window_share_error']:.2%} (target ≤ {SHARE_TOLERANCE:.0%}: "
                  f"{'ok' if b['share_ok'] else 'MISSED'}); samples-per-pack drift {b['drift']:.3f} "
                  f"(target ≤ {DRIFT_LIMIT}: {'ok' if b['drift_ok'] else 'MISSED'}); "
                  f"packs over the lower bound {b['packs_over_bound_fraction']:.3%} (target ≤ 0.1 %: "
                  f"{'ok' if b['bound_ok'] else 'MISSED'})."]
    return lines
