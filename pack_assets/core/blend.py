"""A recipe's plan: several datasets, each repeated, packed together, one complete plan per epoch.

Epoch k's plan is a function of (the counted samples, the packing settings, the recipe's repeats and seed, k)
only: `make_blend_plan` draws each dataset's copies for k (`recipe.copies`), permutes the copies with the
epoch's seed (so the grouping differs per epoch: `mixfill`'s seeded order, BFD's ties), packs all datasets
together per media type (the planner's `pack_group`, near the lower bound), and orders the packs so that
every window of 256 packs holds each dataset's share of tokens and an even number of samples per pack
(`_deal_blend`, a greedy walk that keeps every prefix in proportion). Nothing depends on another epoch, so
epoch k is planned alone; the same inputs give the same plan, and a trainer resuming at (epoch k, pack j)
reads the same data.

On disk, epoch k has its own catalog and plan under ``<work>/epoch-<k:03d>/`` (views over the shared per-shard
Parquet of ``<work>``) and its own complete, Energon-loadable output folder ``<output>/epoch-<k:03d>/``; the
writer and the audit run on it unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import store
from .counting.profiles import ModelProfile
from .coverage import input_stats, left_since
from .cpad import padded
from .groups import make_groups
from .plan import (
    DRIFT_WINDOW,
    Pack,
    PlanConfig,
    PlanInfo,
    PlanResult,
    PlanSummary,
    assign_shards,
    fingerprint,
    ok_lengths,
    pack_group,
    plan_jsonl,
    plan_stats,
    plannable,
)
from .plancheck import pack_checks
from .recipe import Recipe, blend_seed, copies, dataset_of, expected_copies
from .results import FilePath, Markdown, summed
from .settings import SPLIT_IN_BLEND

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


@dataclass(frozen=True)
class _Copies:
    """An epoch's draw: every copy of an ok sample, in the epoch's seeded order (``item``: the row of ``rows``
    it copies; ``copy``: its number among that sample's copies), with its row's values."""
    ids: np.ndarray  # every row's sample id
    names: list[str]  # the datasets, in recipe order
    ds_idx: np.ndarray  # every row's dataset (index into names)
    n_copies: np.ndarray  # every row's copies this epoch
    item: np.ndarray
    copy: np.ndarray
    lengths: np.ndarray
    mtypes: np.ndarray
    media_bytes: np.ndarray
    n_media: np.ndarray
    vision: np.ndarray


def _draw(rows: dict[str, np.ndarray], repeats: dict[str, float], seed: int, epoch: int,
          rng: np.random.Generator) -> _Copies:
    """Each dataset's copies for the epoch (`recipe.copies`), permuted by ``rng``: bin packing's ties then
    fall differently each epoch."""
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
        n_copies[m] = copies(ids[m].tolist(), repeats[name], seed, name, epoch)
    item = np.repeat(np.arange(len(ids)), n_copies)
    copy = np.arange(len(item)) - np.repeat(np.cumsum(n_copies) - n_copies, n_copies)
    perm = rng.permutation(len(item))
    item, copy = item[perm], copy[perm]
    return _Copies(ids, names, ds_idx, n_copies, item, copy, np.asarray(rows["lengths"], dtype=np.int64)[item],
                   np.asarray(rows["media_types"], dtype=object)[item],
                   np.asarray(rows["media_bytes"], dtype=np.int64)[item],
                   np.asarray(rows["n_media"], dtype=np.int64)[item],
                   np.asarray(rows["vision_tokens"], dtype=np.int64)[item])


def _pack_copies(c: _Copies, config: PlanConfig, epoch: int) -> tuple[list, list[dict], dict[str, dict]]:
    """All datasets' copies packed together per media type (the planner's `pack_group`): the packs (media
    type, copy indices, overlong), the dropped copies (with dataset, epoch and copy) and the figures per type."""
    def drop_row(i: int, reason: str) -> dict:
        return {"sample_id": c.ids[c.item[i]], "total_tokens": int(c.lengths[i]), "reason": reason,
                "dataset": c.names[c.ds_idx[c.item[i]]], "epoch": epoch, "copy": int(c.copy[i])}

    raw: list = []
    dropped: list[dict] = []
    per_type: dict[str, dict] = {}
    plen = padded(c.lengths, config.multiple)  # packed on padded lengths (context parallelism, core/cpad.py)
    kinds = None if config.pack_per_media_type else c.mtypes
    for mt in (sorted(set(c.mtypes.tolist())) if config.pack_per_media_type else ["mixed"]):
        idx = np.flatnonzero(c.mtypes == mt) if config.pack_per_media_type else np.arange(len(c.item))
        groups, per_type[mt] = pack_group(idx, None, plen, c.n_media, c.vision, config, dropped, raw, mt,
                                          drop_row, kinds)
        raw += [(mt, g, False) for g in groups]
    return raw, dropped, per_type


def _ordered_packs(c: _Copies, raw: list, rng: np.random.Generator, epoch: int,
                   config: PlanConfig) -> tuple[list[Pack], np.ndarray]:
    """The packs in output order (`_deal_blend`; with a world size, whole groups of W·B packs of one media key,
    core/groups.py, short groups last) and their tokens per dataset in that order."""
    d = len(c.names)

    def tokens_of(items: np.ndarray) -> np.ndarray:
        return np.bincount(c.ds_idx[c.item[items]], weights=c.lengths[items], minlength=d)

    full, short = ([[u] for u in raw], []) if config.group_size == 1 else make_groups(
        raw, padded(c.lengths, config.multiple), config.group_size, None if config.pack_per_media_type else c.mtypes)
    unit_tokens = np.zeros((len(full), d))
    for k, grp in enumerate(full):
        unit_tokens[k] = sum(tokens_of(u[1]) for u in grp)
    spp = np.asarray([np.mean([len(u[1]) for u in grp]) for grp in full], dtype=np.float64)
    mt_names = sorted({grp[0][0] for grp in full})
    media = np.asarray([mt_names.index(grp[0][0]) for grp in full], dtype=np.int64)
    ordered = [u for k in _deal_blend(unit_tokens, spp, media, rng).tolist() for u in full[k]]
    ordered += [u for grp in short for u in grp]
    packs: list[Pack] = []
    for k, (mt, items, over) in enumerate(ordered):
        lens = c.lengths[items].tolist()
        src = c.item[items]
        packs.append(Pack(f"p{k:08d}", mt, c.ids[src].tolist(), lens, int(sum(lens)),
                          media_bytes=int(c.media_bytes[items].sum()), overlong=bool(over),
                          datasets=[c.names[j] for j in c.ds_idx[src].tolist()], copies=c.copy[items].tolist(),
                          epoch=epoch))
    return packs, np.asarray([tokens_of(u[1]) for u in ordered]).reshape(len(ordered), d)


def make_blend_plan(rows: dict[str, np.ndarray], repeats: dict[str, float], config: PlanConfig, epoch: int,
                    profile: str = "") -> PlanResult:
    """Epoch ``epoch`` of the blend: ``rows`` as `plan.ok_lengths` gives them (sample ids ``<dataset>/...``),
    ``repeats`` per dataset in recipe order, ``config.seed`` the recipe's seed. Every drawn copy ends in
    exactly one pack or in ``dropped`` (with dataset, epoch and copy)."""
    t0 = time.perf_counter()
    seed = blend_seed(config.seed, "epoch", epoch)
    rng = np.random.default_rng(seed)
    c = _draw(rows, repeats, config.seed, epoch, rng)
    raw, dropped, per_type = _pack_copies(c, dataclasses.replace(config, seed=seed % (2**31)), epoch)
    packs, tokens = _ordered_packs(c, raw, rng, epoch, config)
    assign_shards(packs, config)
    stats = plan_stats(packs, dropped, per_type, {}, len(c.item), config)
    stats["blend"] = blend_stats(tokens, c.names, repeats, c.ds_idx, c.n_copies, dropped, stats, epoch, config.seed)
    stats["seconds"] = time.perf_counter() - t0
    h = hashlib.sha256(json.dumps([fingerprint(config, profile, c.ids, rows["lengths"]), repeats,
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


# -- the plan's own invariants (plancheck.check_plan with repeats) -----------------------------------------------


def check_blend(con, config: PlanConfig, repeats: dict[str, float]) -> list[dict]:
    """Every (sample, copy) at most once across packs and drops; each ok sample drawn ⌊r⌋ or ⌊r⌋ + 1 times,
    copies numbered 0..c-1; per dataset the draw adds up to ⌊r⌋·n + round(frac·n); nothing else planned;
    the packs' own limits."""
    drawn = """(SELECT sample_id, dataset, copy FROM pack_members
                UNION ALL SELECT sample_id, dataset, copy FROM dropped)"""
    dup, unknown = con.execute(
        f"""SELECT (SELECT count(*) - count(DISTINCT (sample_id, copy)) FROM {drawn}),
                   (SELECT count(*) FROM {drawn}
                      WHERE sample_id NOT IN (SELECT sample_id FROM samples WHERE status = 'ok'))"""
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
    packs = summed("packs")
    lower_bound = summed("lower_bound")
    packs_over_bound = summed("packs_over_bound")

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
                rows.append(f"| {b['epoch']} | {name} | {v['repeat']} | {v['samples']} | {v['copies']} | "
                            f"{v['packed']} | {v['dropped']} | {v['share']:.2%} | {v['window_share_error']:.1%} |")
        return {"dagster/row_count": self.packs, "epochs": len(self.epochs), "packs": self.packs,
                "lower_bound": self.lower_bound, "packs_over_bound": self.packs_over_bound, "fill": float(self.fill),
                "drift": max(float(e.drift) for e in self.epochs),
                "worst_window_share_error": max(e.stats["blend"]["worst_window_share_error"] for e in self.epochs),
                "fingerprint": self.fingerprint, "shards_waiting": self.shards_waiting,
                "per_dataset": Markdown("| epoch | dataset | repeat | samples | copies | packed | dropped | "
                                        "token share | worst window share error |\n"
                                        "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
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
        store.save_plan(con, [vars(p) for p in plan.packs], plan.dropped, info.as_dict(), blend=True,
                        multiple=cfg.multiple)
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
    if config.overlong == "split":
        raise ValueError(SPLIT_IN_BLEND)
    shards, missing, removed = plannable(work, shards, profile, recipe.roots, allow_missing)
    work.mkdir(parents=True, exist_ok=True)
    todo = list(range(recipe.epochs)) if epochs is None else epochs
    return BlendPlanSummary([plan_epoch(work, shards, config, profile, recipe, k, missing, removed, recursive)
                             for k in todo], work)
