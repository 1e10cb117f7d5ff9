"""A recipe's plan: several datasets, each repeated, packed together, one complete plan per epoch.

Epoch k's plan is a function of (the counted samples, the packing settings, the recipe's repeats and seed, k)
only: `make_blend_plan` draws each dataset's copies for k (`recipe.copies`), permutes the copies with the
epoch's seed (so the grouping differs per epoch: `mixfill`'s seeded order, BFD's ties), packs all datasets
together per media type (the planner's `_pack_group`, near the lower bound), and orders the packs so that
every window of 256 packs holds each dataset's share of tokens and an even number of samples per pack
(`_deal_blend`, a greedy walk that keeps every prefix in proportion). Nothing depends on another epoch, so
epoch k is planned alone; the same inputs give the same plan, and a trainer resuming at (epoch k, pack j)
reads the same data.

On disk, epoch k has its own catalog and plan under ``<work>/epoch-<k:03d>/`` (views over the shared per-shard
Parquet of ``<work>``) and its own complete, Energon-loadable output folder ``<output>/epoch-<k:03d>/``; the
writer and the audit run on it unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import store
from .coverage import input_stats, left_since
from .plan import (DRIFT_WINDOW, Pack, PlanConfig, PlanInfo, PlanResult, PlanSummary, _assign_shards, _pack_group,
                   _plan_stats, fingerprint, ok_lengths, pack_checks, plan_jsonl, plannable)
from .profiles import ModelProfile
from .recipe import Recipe, blend_seed, copies, dataset_of, expected_copies
from .results import AuditResult, FilePath, Markdown

SHARE_TOLERANCE = 0.10  # each dataset's token share per window within ±10 % (relative) of its global share
DRIFT_LIMIT = 1.25


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:03d}"


def epoch_work(work: Path, epoch: int) -> Path:
    return work / epoch_name(epoch)


# -- the planner ------------------------------------------------------------------------------------------


def windows(n: int, window: int = DRIFT_WINDOW) -> list[tuple[int, int]]:
    """Consecutive windows of ``window`` packs in output order (fewer than two: four windows, as `plan.drift`
    does); a remainder shorter than a window joins the last window, so every pack is in one."""
    if n == 0:
        return []
    if n < 2 * window:
        window = max(1, n // 4)
    k = max(1, n // window)
    return [(i * window, (i + 1) * window if i < k - 1 else n) for i in range(k)]


def share_errors(tokens: np.ndarray, window: int = DRIFT_WINDOW) -> np.ndarray:
    """Per dataset (columns of ``tokens``: packs × datasets, in output order), the worst relative error of its
    share of a window's tokens against its share of all tokens (0 for a dataset with no tokens)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if tokens.size == 0:
        return np.zeros(tokens.shape[1] if tokens.ndim == 2 else 0)
    total = tokens.sum(axis=0)
    share = total / max(total.sum(), 1.0)
    worst = np.zeros(tokens.shape[1])
    for a, b in windows(len(tokens), window):
        w = tokens[a:b].sum(axis=0)
        err = np.abs(w / max(w.sum(), 1.0) - share) / np.where(share > 0, share, 1.0)
        worst = np.maximum(worst, np.where(share > 0, err, 0.0))
    return worst


_MAX_KINDS = 256


def _deal_blend(tokens: np.ndarray, spp: np.ndarray, media: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A seeded output order (pack indices) whose every prefix holds each dataset's tokens and the samples
    per pack in proportion, so every window does too. Each pack is a vector (tokens per dataset, samples),
    scaled by the mean pack; packs are pooled by kind (media type and the quartile of each coordinate), each
    pool in a seeded random order; step by step, the head of the pool that brings the running sum closest to
    (packs so far × the mean pack) goes next. A window's error is then a few packs' worth of any one dataset,
    wherever the window starts. Stratified dealing as in `plan._deal`, ranked by one key, balances that key
    but not a dataset that packs mostly as filler (bench/bench_blend.py: 12-25 % against 1-2 % for this)."""
    n, d = tokens.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    x = np.concatenate([tokens, spp[:, None]], axis=1).astype(np.float64)
    mean = x.mean(axis=0)
    x /= np.where(mean > 0, mean, 1.0)
    # quartiles by rank, not by value: one outlier pack (hundreds of tiny samples) must not put all others in
    # one level, which left the walk a handful of mixed pools to choose from and windows 12 % off at 1M
    # each step scans every pool: 4 levels per coordinate up to 3 datasets (4^4 kinds), fewer with more
    # datasets so the kinds stay near _MAX_KINDS (8 datasets at 4 levels: 4^9 pools, mostly of one pack)
    q = max(1, min(4, round(_MAX_KINDS ** (1 / (d + 1)))))
    levels = np.empty(x.shape, dtype=np.int64)
    for j in range(d + 1):
        levels[np.argsort(x[:, j], kind="stable"), j] = np.arange(n) * q // n
    kind = np.unique(np.concatenate([levels, media[:, None]], axis=1), axis=0, return_inverse=True)[1].ravel()
    pools = [rng.permutation(np.flatnonzero(kind == k)).tolist() for k in range(int(kind.max()) + 1)]
    heads = np.asarray([p[-1] for p in pools], dtype=np.int64)
    target = x.mean(axis=0)
    running = np.zeros(d + 1)
    out = np.empty(n, dtype=np.int64)
    for m in range(n):
        live = np.flatnonzero(heads >= 0)
        gap = running + x[heads[live]] - (m + 1) * target
        k = int(live[np.einsum("ij,ij->i", gap, gap).argmin()])
        p = pools[k].pop()
        out[m] = p
        running += x[p]
        heads[k] = pools[k][-1] if pools[k] else -1
    return out


def make_blend_plan(rows: dict[str, np.ndarray], repeats: dict[str, float], config: PlanConfig, epoch: int,
                    profile: str = "") -> PlanResult:
    """Epoch ``epoch`` of the blend: ``rows`` as `plan.ok_lengths` gives them (sample ids ``<dataset>/...``),
    ``repeats`` per dataset in recipe order, ``config.seed`` the recipe's seed. Every drawn copy ends in
    exactly one pack or in ``dropped`` (with dataset, epoch and copy)."""
    if config.world_size > 1:
        raise ValueError("world_size > 1 is not supported with a recipe yet: its balanced groups of W packs and the "
                         "blend's per-window dataset shares are two orders; plan with world_size 1")
    t0 = time.perf_counter()
    ids = np.asarray(rows["sample_ids"], dtype=object)
    names = list(repeats)
    ds_of = np.asarray([dataset_of(s) for s in ids.tolist()], dtype=object)
    unknown = sorted(set(ds_of.tolist()) - set(names))
    if unknown:
        raise ValueError(f"samples of dataset(s) {unknown} are not in the recipe ({', '.join(names)})")
    ds_idx = np.zeros(len(ids), dtype=np.int64)
    n_copies = np.zeros(len(ids), dtype=np.int64)
    for j, name in enumerate(names):
        m = np.flatnonzero(ds_of == name)
        ds_idx[m] = j
        n_copies[m] = copies(ids[m].tolist(), repeats[name], config.seed, name, epoch)
    item = np.repeat(np.arange(len(ids)), n_copies)
    copy = np.arange(len(item)) - np.repeat(np.cumsum(n_copies) - n_copies, n_copies)
    seed = blend_seed(config.seed, "epoch", epoch)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(item))  # this epoch's grouping: bin packing's ties fall differently each epoch
    item, copy = item[perm], copy[perm]
    lengths = np.asarray(rows["lengths"], dtype=np.int64)[item]
    mtypes = np.asarray(rows["media_types"], dtype=object)[item]
    media_bytes = np.asarray(rows["media_bytes"], dtype=np.int64)[item]
    n_media = np.asarray(rows["n_media"], dtype=np.int64)[item]
    vision = np.asarray(rows["vision_tokens"], dtype=np.int64)[item]
    cfg = dataclasses.replace(config, seed=seed % (2**31))

    def drop_row(i: int, reason: str) -> dict:
        return {"sample_id": ids[item[i]], "total_tokens": int(lengths[i]), "reason": reason,
                "dataset": names[ds_idx[item[i]]], "epoch": epoch, "copy": int(copy[i])}

    raw: list = []
    dropped: list[dict] = []
    per_type: dict[str, dict] = {}
    for mt in (sorted(set(mtypes.tolist())) if config.pack_per_media_type else ["mixed"]):
        idx = np.flatnonzero(mtypes == mt) if config.pack_per_media_type else np.arange(len(item))
        groups, per_type[mt] = _pack_group(idx, None, lengths, n_media, vision, cfg, dropped, raw, mt, drop_row)
        raw += [(mt, g, False) for g in groups]
    d = len(names)
    unit_tokens = np.zeros((len(raw), d))
    for u, (_, items, _) in enumerate(raw):
        unit_tokens[u] = np.bincount(ds_idx[item[items]], weights=lengths[items], minlength=d)
    spp = np.asarray([len(u[1]) for u in raw], dtype=np.float64)
    mt_names = sorted({u[0] for u in raw})
    media = np.asarray([mt_names.index(u[0]) for u in raw], dtype=np.int64)
    order = _deal_blend(unit_tokens, spp, media, rng)
    packs: list[Pack] = []
    for k, u in enumerate(order.tolist()):
        mt, items, over = raw[u]
        lens = lengths[items].tolist()
        src = item[items]
        packs.append(Pack(f"p{k:08d}", mt, ids[src].tolist(), lens, int(sum(lens)),
                          media_bytes=int(media_bytes[items].sum()), overlong=bool(over),
                          datasets=[names[j] for j in ds_idx[src].tolist()], copies=copy[items].tolist(), epoch=epoch))
    _assign_shards(packs, config)
    stats = _plan_stats(packs, dropped, per_type, {}, len(item), config)
    stats["blend"] = blend_stats(unit_tokens[order], names, repeats, ds_idx, n_copies, dropped, stats, epoch,
                                 config.seed)
    stats["seconds"] = time.perf_counter() - t0
    h = hashlib.sha256(json.dumps([fingerprint(config, profile, ids.tolist(), rows["lengths"].tolist()), repeats,
                                   epoch]).encode()).hexdigest()[:16]
    return PlanResult(packs, dropped, stats, h)


def blend_stats(tokens: np.ndarray, names: list[str], repeats: dict[str, float], ds_idx: np.ndarray,
                n_copies: np.ndarray, dropped: list[dict], stats: dict, epoch: int, seed: int) -> dict:
    """The blend's figures: per dataset its samples, draw, packed and dropped copies, token share and worst
    window share error; the run's drift and packs over the lower bound, each against its target."""
    errors = share_errors(tokens)
    total = tokens.sum(axis=0)
    share = total / max(total.sum(), 1.0)
    per = {}
    for j, name in enumerate(names):
        n_ok = int((ds_idx == j).sum())
        drawn = int(n_copies[ds_idx == j].sum())
        n_drop = sum(d["dataset"] == name for d in dropped)
        per[name] = {"repeat": repeats[name], "samples": n_ok, "copies": drawn, "packed": drawn - n_drop,
                     "dropped": n_drop, "tokens": int(total[j]), "share": float(share[j]),
                     "window_share_error": float(errors[j])}
    bound = stats["lower_bound"]
    over = stats["packs_over_bound"] / bound if bound else 0.0
    worst = max((v["window_share_error"] for v in per.values()), default=0.0)
    return {"epoch": epoch, "seed": seed, "repeats": repeats, "datasets": per, "window": DRIFT_WINDOW,
            "worst_window_share_error": worst, "share_ok": worst <= SHARE_TOLERANCE,
            "drift": stats["drift"], "drift_ok": stats["drift"] <= DRIFT_LIMIT,
            "packs_over_bound_fraction": over, "bound_ok": over <= 0.001}


# -- the plan's own invariants (plan.check_plan with repeats) -----------------------------------------------


def check_blend(con, config: PlanConfig, repeats: dict[str, float]) -> list[dict]:
    """Every (sample, copy) at most once across packs and drops; each ok sample drawn ⌊r⌋ or ⌊r⌋ + 1 times,
    copies numbered 0..c-1; per dataset the draw adds up to ⌊r⌋·n + round(frac·n); nothing else planned;
    the packs' own limits."""
    drawn = """(SELECT sample_id, dataset, copy FROM pack_members UNION ALL SELECT sample_id, dataset, copy FROM dropped)"""
    dup, unknown = con.execute(
        f"""SELECT (SELECT count(*) - count(DISTINCT (sample_id, copy)) FROM {drawn}),
                   (SELECT count(*) FROM {drawn} WHERE sample_id NOT IN (SELECT sample_id FROM samples WHERE status = 'ok'))"""
    ).fetchone()
    found: list[tuple[str, int, str]] = [
        ("duplicate_sample", dup, f"{dup} (sample, copy) pair(s) planned more than once"),
        ("unknown_sample", unknown, f"{unknown} planned copies of samples that are not ok samples of the catalog")]
    ok = dict(con.execute("SELECT split_part(shard, '/', 1), count(*) FROM samples WHERE status = 'ok' "
                          "GROUP BY 1").fetchall())
    got = dict(con.execute(f"SELECT dataset, count(*) FROM {drawn} GROUP BY 1").fetchall())
    for name in sorted(set(ok) | set(got)):
        want = expected_copies(ok.get(name, 0), repeats[name]) if name in repeats else 0
        if got.get(name, 0) != want:
            found.append(("lost_sample", 1, f"dataset {name}: {got.get(name, 0)} copies planned, the draw "
                          f"(repeat {repeats.get(name)} of {ok.get(name, 0)} samples) gives {want}"))
    bad = con.execute(
        f"""SELECT count(*) FROM (SELECT s.sample_id, split_part(s.shard, '/', 1) AS dataset, count(d.copy) AS c,
                                         coalesce(max(d.copy), -1) AS top
                                  FROM samples s LEFT JOIN {drawn} d USING (sample_id)
                                  WHERE s.status = 'ok' GROUP BY 1, 2) x
            JOIN (SELECT unnest(?) AS dataset, unnest(?) AS r) rr USING (dataset)
            WHERE x.top <> x.c - 1 OR x.c < floor(rr.r) OR x.c > floor(rr.r) + 1""",
        [list(repeats), [float(v) for v in repeats.values()]]).fetchone()[0]
    found.append(("lost_sample", bad, f"{bad} sample(s) drawn other than floor(repeat) or floor(repeat) + 1 times, "
                                      "or with copies not numbered 0..c-1"))
    return [{"check": c, "detail": d} for c, n, d in found + pack_checks(con, config) if n]


# -- the stage: plan each epoch into its own catalog ----------------------------------------------------------


@dataclass(frozen=True)
class BlendPlanSummary:
    """Every epoch's PlanSummary; the figures the CLI prints, over all epochs."""

    epochs: list[PlanSummary]
    work: Path

    @property
    def packs(self) -> int:
        return sum(e.packs for e in self.epochs)

    @property
    def lower_bound(self) -> int:
        return sum(e.lower_bound for e in self.epochs)

    @property
    def packs_over_bound(self) -> int:
        return sum(e.packs_over_bound for e in self.epochs)

    @property
    def fill(self) -> float:
        return sum(e.packed_tokens for e in self.epochs) / max(1, sum(e.packs * e.max_len for e in self.epochs))

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256("|".join(e.fingerprint for e in self.epochs).encode()).hexdigest()[:16]

    @property
    def plan_file(self) -> Path:
        return self.epochs[0].plan_file.parent.parent

    @property
    def violations(self) -> list[dict]:
        return [{**v, "epoch": k} for k, e in enumerate(self.epochs) for v in e.violations]

    @property
    def shards_waiting(self) -> list[str]:
        return self.epochs[0].shards_waiting

    @property
    def shards_removed(self) -> list[str]:
        return self.epochs[0].shards_removed

    def as_metadata(self) -> dict:
        rows = []
        for e in self.epochs:
            b = e.stats["blend"]
            for name, v in b["datasets"].items():
                rows.append(f"| {b['epoch']} | {name} | {v['repeat']} | {v['samples']} | {v['copies']} | {v['packed']} | "
                            f"{v['dropped']} | {v['share']:.2%} | {v['window_share_error']:.1%} |")
        return {"dagster/row_count": self.packs, "epochs": len(self.epochs), "packs": self.packs,
                "lower_bound": self.lower_bound, "packs_over_bound": self.packs_over_bound, "fill": float(self.fill),
                "drift": max(float(e.drift) for e in self.epochs),
                "worst_window_share_error": max(e.stats["blend"]["worst_window_share_error"] for e in self.epochs),
                "fingerprint": self.fingerprint, "shards_waiting": self.shards_waiting,
                "per_dataset": Markdown("| epoch | dataset | repeat | samples | copies | packed | dropped | token share "
                                        "| worst window share error |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
                                        + "\n".join(rows)),
                "plan_folder": FilePath(self.work), "dagster/column_schema": store.BLEND_PACK_PLAN_SCHEMA}


def plan_epoch(work: Path, shards: list[str], config: PlanConfig, profile: ModelProfile, recipe: Recipe, epoch: int,
               waiting: list[str] = (), removed: list[str] = (), recursive: bool = True) -> PlanSummary:
    """Plan one epoch into ``<work>/epoch-<k>/`` (its catalog, pack_plan.jsonl), from the counted shards alone."""
    edir = epoch_work(work, epoch)
    edir.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.replace(config, incremental=False)  # the seed is the recipe's, through Settings
    with store.connect(edir) as con:
        removed = left_since(con, list(removed), recipe.roots)
        store.build_catalog(con, work, shards, profile.name)
        rows = ok_lengths(con)
        plan = make_blend_plan(rows, recipe.repeats, cfg, epoch, profile.name)
        why = f"blend epoch {epoch} of {recipe.epochs}: {len(recipe.datasets)} dataset(s), full plan"
        plan.stats.update(planning=why, shards_planned=len(shards), shards_waiting=list(waiting),
                          shards_removed=removed, **input_stats(recipe.roots, recursive))
        store.atomic_write_text(edir / "pack_plan.jsonl", blend_jsonl(plan))
        info = PlanInfo.of(plan.fingerprint, profile, shards, cfg, plan.stats)
        store.save_plan(con, [vars(p) for p in plan.packs], plan.dropped, info.as_dict(), blend=True)
        violations = check_blend(con, cfg, recipe.repeats)
    return PlanSummary(plan.fingerprint, edir / "pack_plan.jsonl", why, plan.stats, len(shards), list(waiting),
                       list(removed), violations)


def blend_jsonl(plan: PlanResult) -> str:
    """plan_jsonl's rows with each member's dataset and copy and the epoch."""
    return "".join(json.dumps({**json.loads(line), "datasets": p.datasets, "copies": p.copies, "epoch": p.epoch}) + "\n"
                   for line, p in zip(plan_jsonl(plan).splitlines(), plan.packs))


def run_blend_plan(work: Path, shards: list[str], config: PlanConfig, profile: ModelProfile, recipe: Recipe,
                   epochs: list[int] | None = None, allow_missing: bool = False,
                   recursive: bool = True) -> BlendPlanSummary:
    """Plan the given epochs (default: all) of the recipe over its counted shards (keys ``<dataset>/<shard>``)."""
    shards, missing, removed = plannable(work, shards, profile, recipe.roots, allow_missing)
    work.mkdir(parents=True, exist_ok=True)
    todo = list(range(recipe.epochs)) if epochs is None else epochs
    return BlendPlanSummary([plan_epoch(work, shards, config, profile, recipe, k, missing, removed, recursive)
                             for k in todo], work)


# -- write and audit every epoch -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BlendWriteSummary:
    epochs: list  # WriteSummary per epoch
    output_dir: Path
    retired: list = dataclasses.field(default_factory=list)  # epoch folders past the recipe's epochs, emptied

    @property
    def shards(self) -> int:
        return sum(e.shards for e in self.epochs)

    @property
    def written(self) -> int:
        return sum(e.written for e in self.epochs)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.epochs)

    @property
    def foreign_files(self) -> list[str]:
        return [f for e in self.epochs for f in e.foreign_files]

    def as_metadata(self) -> dict:
        return {"dagster/row_count": sum(e.packs for e in self.epochs), "epochs": len(self.epochs),
                "output_shards": self.shards, "written": self.written,
                "skipped": sum(e.skipped for e in self.epochs), "bytes": self.bytes,
                "dagster/uri": FilePath(self.output_dir), "epoch_folders": [str(e.output_dir) for e in self.epochs],
                "retired_epoch_folders": [str(p) for p in self.retired]}


def retire_epochs(out_dir: Path, epochs: int) -> list[Path]:
    """The output folders of epochs the recipe no longer has (its `epochs` went down): their files the tool
    wrote are deleted, as an earlier plan's shards are, so a trainer globbing ``epoch-*`` finds no stale
    epoch; files the tool did not write stay, and so does a folder that holds any."""
    from . import owned

    retired = []
    for d in sorted(out_dir.glob("epoch-[0-9][0-9][0-9]")):
        if not d.is_dir() or int(d.name.split("-")[1]) < epochs or (before := owned.load(d)) is None:
            continue
        owned.finish(d, set(), before)
        (d / owned.RECORD).unlink(missing_ok=True)
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()  # only empty folders
        with contextlib.suppress(OSError):
            d.rmdir()
        retired.append(d)
    return retired


def run_blend_write(work: Path, recipe: Recipe, out_dir: Path, workers: int = 0, progress=None,
                    mode: str = "copy") -> BlendWriteSummary:
    """Every epoch written to ``<output>/epoch-<k>/``, copy or index mode (an index records every dataset's
    folder: ``core/indexmode.py``)."""
    from .write import run_write, run_write_index

    writer = run_write_index if mode == "index" else run_write
    written = [writer(epoch_work(work, k), recipe.roots, out_dir / epoch_name(k), workers, progress)
               for k in range(recipe.epochs)]
    return BlendWriteSummary(written, out_dir, retire_epochs(out_dir, recipe.epochs))


def run_blend_audit(work: Path, recipe: Recipe, out_dir: Path, scope: str = "all", check_samples: int = 0,
                    progress=None) -> AuditResult:
    """Every epoch audited (its report in ``<work>/epoch-<k>/audit_report.md``); one result over all of them:
    violations tagged with their epoch, totals summed, per dataset per epoch, and a blend report beside them.
    ``progress``: as `audit.audit`'s, epoch by epoch."""
    from .audit import run_audit

    results = [run_audit(epoch_work(work, k), out_dir / epoch_name(k), scope=scope, check_samples=check_samples,
                          progress=progress)
               for k in range(recipe.epochs)]
    total = AuditResult()
    for k, r in enumerate(results):
        total.violations += [{**v, "epoch": k} for v in r.violations]
    keys = ("samples_read", "packed", "dropped", "rejected", "packs_read", "output_shards", "output_shards_trusted",
            "media_members_checked", "media_bytes_checked")
    # the source samples are the same in every epoch: counted once; copies packed and dropped add up over epochs
    total.stats = {k: sum(r.stats.get(k, 0) for r in results) for k in keys}
    total.stats.update(samples_read=results[0].stats["samples_read"], rejected=results[0].stats["rejected"],
                       per_epoch={k: r.stats["per_dataset"] for k, r in enumerate(results)},
                       blend={k: r.stats.get("blend", {}) for k, r in enumerate(results)})
    total.waiting = results[0].waiting
    total.stats.update(verdict=total.verdict, shards_waiting=total.waiting, violations=len(total.violations))
    total.report = work / "blend_report.md"
    total.plots = results[0].plots
    store.atomic_write_text(total.report, blend_report(recipe, results))
    return total


def blend_report(recipe: Recipe, results: list[AuditResult]) -> str:
    lines = ["# pack_assets blend audit", "",
             f"Recipe `{recipe.path}`: {len(recipe.datasets)} dataset(s), {recipe.epochs} epoch(s), seed {recipe.seed}. "
             f"Verdicts: {', '.join(f'epoch {k} {r.verdict}' for k, r in enumerate(results))}; each epoch's full report "
             f"is `{epoch_name(0)}/audit_report.md` and so on.", ""]
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
                     f"{c['packed']} | {c['dropped']} | {p.get('share', 0):.2%} | {p.get('window_share_error', 0):.2%} |")
    if b:
        lines += ["", f"Windows of {b['window']} packs in output order: worst token share error "
                  f"{b['worst_window_share_error']:.2%} (target ≤ {SHARE_TOLERANCE:.0%}: {'ok' if b['share_ok'] else 'MISSED'}); "
                  f"samples-per-pack drift {b['drift']:.3f} (target ≤ {DRIFT_LIMIT}: {'ok' if b['drift_ok'] else 'MISSED'}); "
                  f"packs over the lower bound {b['packs_over_bound_fraction']:.3%} (target ≤ 0.1 %: "
                  f"{'ok' if b['bound_ok'] else 'MISSED'})."]
    return lines
