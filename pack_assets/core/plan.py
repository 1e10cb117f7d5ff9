"""pack_plan stage: packs per media type near the lower bound, caps held, a seeded output order.

``make_plan`` takes one row per ok sample (id, media type, length, media count, vision tokens, media bytes)
and returns packs in training order, the dropped samples with their lengths, and the figures every plan
reports: packs vs the L1/L2 lower bounds, fill, samples per pack, drift over the run and, with a world size,
the Σℓ² (attention cost) balance of each group of W consecutive packs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from . import faults, incremental, store
from .binpack import ALGORITHMS, assign, lower_bounds, without
from .counting.profiles import ModelProfile, resolve_profile
from .counting.token_lengths import token_lengths_are_current
from .coverage import input_stats, left_since, tar_exists
from .cpad import padded, padded_stats
from .groups import make_groups
from .packgroup import pack_group
from .packs import IDS, Pack, PackTable, arrow_ints, from_batches, shard_name, shard_numbers
from .plancheck import check_plan
from .previous import changed_packs, current_lengths, numbers, prune_plan, read_plan
from .results import FilePath, Markdown
from .scan import manifest_is_current
from .settings import PlanConfig
from .split import row as split_row
from .split import split_overlong, split_stats

__all__ = ["ALGORITHMS", "Pack", "PlanConfig", "PlanResult", "assign", "lower_bounds", "make_plan"]


@dataclass
class PlanResult:
    packs: PackTable | list[Pack]  # a blend's plan: Pack objects (with datasets and copies)
    dropped: list[dict]
    stats: dict = field(default_factory=dict)
    fingerprint: str = ""


def drift(samples_per_pack: np.ndarray, window: int = 256) -> float:
    """max/min of mean samples per pack over windows of consecutive packs (1.0 = perfectly even)."""
    n = len(samples_per_pack)
    if n == 0:
        return 1.0
    if n < 2 * window:
        window = max(1, n // 4)
    k = n // window
    means = samples_per_pack[: k * window].reshape(k, window).mean(axis=1)
    return float(means.max() / means.min()) if means.min() > 0 else float("inf")


CHUNK = 1 << 16  # samples (or packs) turned into text at once: a plan's text is never all in memory


def fingerprint(config: PlanConfig, profile: str, ids: Sequence[str], lengths: Sequence[int] | np.ndarray) -> str:
    """The plan's inputs hashed: its settings, the profile, each sample's id and length (a line each, in
    order). Lines are hashed a chunk at a time, so no list of every length is made (memory at 10M samples)."""
    h = hashlib.sha256(json.dumps({"config": asdict(config), "profile": profile}, sort_keys=True).encode())
    lengths = np.asarray(lengths)
    for a in range(0, len(lengths), CHUNK):
        part = ids[a:a + CHUNK]
        part = part.tolist() if isinstance(part, np.ndarray) else part
        h.update("".join(f"{i}\t{n}\n" for i, n in zip(part, lengths[a:a + CHUNK].tolist())).encode())
    return h.hexdigest()[:16]


def config_fingerprint(config: PlanConfig, profile_fingerprint: str) -> str:
    """The packing settings and the model profile, without the data: what a pack's ``_meta`` names, so an
    output shard whose packs did not change stays byte-identical when other shards' samples change the plan."""
    settings = {k: v for k, v in asdict(config).items() if k != "incremental"}
    return hashlib.sha256(json.dumps([settings, profile_fingerprint], sort_keys=True).encode()).hexdigest()[:16]


DRIFT_WINDOW = 256


def _deal(units: list, key: np.ndarray, rng: np.random.Generator, per_window: int) -> list:
    """A seeded order in which every window of ``per_window`` units gets an even spread of ``key``:
    units ranked by key (random tie-break) are dealt round-robin to windows, each window then shuffled.
    This keeps samples-per-pack and media types from drifting across the run (a plain shuffle of BFD
    packs, whose sizes are very uneven, drifts by 1.3x over windows of 256)."""
    n = len(units)
    if n == 0:
        return []
    n_win = max(1, -(-n // per_window))
    ranked = np.lexsort((rng.random(n), key))
    out = []
    for w in rng.permutation(n_win).tolist():
        members = ranked[w::n_win]
        out += [units[j] for j in members[rng.permutation(len(members))].tolist()]
    return out


def _order(raw: list[tuple[str, np.ndarray, bool]], lengths: np.ndarray, config: PlanConfig,
           kinds=None) -> tuple[list, dict]:
    """Training order: packs dealt evenly over the run, or with a world size, groups of W·B packs of one media
    key (core/groups.py) balanced in Σℓ² and dealt whole, short groups last."""
    rng = np.random.default_rng(config.seed)
    w = config.group_size
    if w == 1:
        return _deal(raw, np.asarray([len(p[1]) for p in raw], dtype=np.float64), rng, DRIFT_WINDOW), {}
    groups, short = make_groups(raw, lengths, w, kinds)
    ratios = []
    for g in groups:
        c = np.asarray([(lengths[p[1]] ** 2).sum() for p in g], dtype=np.float64)
        if c.mean() > 0:
            ratios.append(c.max() / c.mean())
    spp = np.asarray([np.mean([len(p[1]) for p in g]) for g in groups], dtype=np.float64)
    out = [p for g in _deal(groups, spp, rng, max(1, DRIFT_WINDOW // w)) + short for p in g]
    return out, {"world_size": config.world_size, "group_size": w, "groups": len(groups) + len(short),
                 "cost_imbalance_mean": float(np.mean(ratios)) if ratios else 1.0,
                 "cost_imbalance_max": float(np.max(ratios)) if ratios else 1.0,
                 "incomplete_groups": len(short)}


def make_plan(
    sample_ids: list[str],
    media_types: list[str],
    lengths: np.ndarray,
    media_bytes: np.ndarray,
    config: PlanConfig,
    profile: str = "",
    n_media: np.ndarray | None = None,
    vision_tokens: np.ndarray | None = None,
) -> PlanResult:
    """Every input ends in exactly one pack or in ``dropped`` (with its length and a reason)."""
    t0 = time.perf_counter()
    n = len(sample_ids)
    if not isinstance(getattr(sample_ids, "dtype", None), type(IDS)):  # (`ok_lengths`' ids: each array has a
        sample_ids = np.asarray(sample_ids, dtype=IDS)  # StringDType of its own, which asarray(IDS) would copy)
    lengths = np.asarray(lengths, dtype=np.int64)
    media_bytes = np.asarray(media_bytes, dtype=np.int64)
    n_media = np.zeros(n, np.int64) if n_media is None else np.asarray(n_media, np.int64)
    vision_tokens = np.zeros(n, np.int64) if vision_tokens is None else np.asarray(vision_tokens, np.int64)
    mtypes = np.asarray(media_types, dtype=object)
    # what the packs hold once each sub-sample is padded (core/cpad.py; unpadded: the lengths, not a copy)
    plen = padded(lengths, config.multiple) if config.multiple > 1 else lengths
    kinds = None if config.pack_per_media_type else mtypes

    def drop_row(i: int, reason: str) -> dict:
        return {"sample_id": str(sample_ids[i]), "total_tokens": int(lengths[i]), "reason": reason}

    raw: list[tuple[str, np.ndarray, bool]] = []  # (media type, item indices, kept alone though overlong)
    dropped: list[dict] = []
    per_type: dict[str, dict] = {}
    for mt in (sorted(set(mtypes.tolist())) if config.pack_per_media_type else ["mixed"]):
        idx = np.flatnonzero(mtypes == mt) if config.pack_per_media_type else np.arange(n)
        groups, per_type[mt] = pack_group(idx, sample_ids, plen, n_media, vision_tokens, config, dropped, raw, mt,
                                          drop_row, kinds)
        raw += [(mt, g, False) for g in groups]
    ordered, balance = _order(raw, plen, config, kinds)
    del raw
    packs = PackTable.of_units(sample_ids, lengths, media_bytes, ordered)
    del ordered
    assign_shards(packs, config)
    stats = plan_stats(packs, dropped, per_type, balance, n, config)
    stats["seconds"] = time.perf_counter() - t0
    return PlanResult(packs, dropped, stats, fingerprint(config, profile, sample_ids, lengths))


def _figures(packs: PackTable | list[Pack]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(samples per pack, the members' lengths, each pack's total, overlong per pack, output shards) of a table or
    of Pack objects."""
    if isinstance(packs, PackTable):
        return (packs.sizes().astype(np.float64), packs.lens, packs.totals(), packs.overlong,
                len(np.unique(packs.shards)))
    return (np.asarray([len(p.sample_ids) for p in packs], dtype=np.float64),
            np.asarray([n for p in packs for n in p.sample_token_lens], dtype=np.int64),
            np.asarray([p.total_token_len for p in packs], dtype=np.int64),
            np.asarray([p.overlong for p in packs], dtype=bool), len({p.output_shard for p in packs}))


def plan_stats(packs: PackTable | list[Pack], dropped: list[dict], per_type: dict, balance: dict, n: int,
               config: PlanConfig) -> dict:
    spp, lens, totals, overlong, shards = _figures(packs)
    n_packs = len(packs)
    packed_tokens = int(totals.sum())
    stats = {
        "samples": n,
        "packs": n_packs,
        "dropped": len(dropped),
        "dropped_overlong": sum(d["reason"] == "overlong" for d in dropped),
        "overlong_kept_alone": int(overlong.sum()),
        "lower_bound": int(sum(v["lower_bound"] for v in per_type.values())),
        "lower_bound_l1": int(sum(v["l1"] for v in per_type.values())),
        "fill": packed_tokens / (n_packs * config.max_len) if n_packs else 0.0,
        "packed_tokens": packed_tokens,
        "padding_tokens": int((-totals % config.pad_multiple).sum()),
        **padded_stats(lens, n_packs, config),
        "mean_samples_per_pack": float(spp.mean()) if n_packs else 0.0,
        "max_samples_per_pack": int(spp.max()) if n_packs else 0,
        "drift": drift(spp),
        "output_shards": shards,
        "per_media_type": per_type,
        "algorithm": config.algorithm,
        "max_len": config.max_len,
        **({"balance": balance} if balance else {}),
    }
    stats["packs_over_bound"] = n_packs - stats["lower_bound"] - stats["overlong_kept_alone"]
    stats["efficiency"] = stats["fill"]
    return stats


def assign_shards(packs: PackTable | list[Pack], config: PlanConfig, first_shard: int = 0) -> None:
    table = isinstance(packs, PackTable)
    shards = shard_numbers(packs.media_bytes.tolist() if table else [p.media_bytes for p in packs],
                           config.max_packs_per_shard, config.target_shard_bytes, first_shard)
    if table:
        packs.shards = shards
        return
    for p, k in zip(packs, shards.tolist()):
        p.output_shard = shard_name(k)


def extend_plan(old_packs: PackTable, old_dropped: list[dict], new: PlanResult, config: PlanConfig,
                old_fingerprint: str) -> PlanResult:
    """Incremental packing: the previous packs and output shards stay as they are; the new samples' packs
    (planned on their own by ``make_plan``) are numbered after them and go into new output shards."""
    # after a prune the kept ids may have gaps: number the new packs after the highest, never into a gap
    _number_after(new.packs, 1 + int(old_packs.numbers.max()) if len(old_packs) else 0,
                  1 + int(old_packs.shards.max()) if len(old_packs) else 0, config)
    packs = old_packs.concat(new.packs)
    dropped = old_dropped + new.dropped
    stats = _extended_stats(new, config, packs.sizes(), int(packs.lens.sum()), len(np.unique(packs.shards)),
                            len(old_packs), len(dropped))
    return PlanResult(packs, dropped, stats, _joined(old_fingerprint, new.fingerprint))


def append_plan(base: incremental.Base, new: PlanResult, config: PlanConfig) -> PlanResult:
    """`extend_plan` of a stored plan none of whose samples changed, from its figures (`incremental.Base`): the
    same figures and fingerprint; the result holds the new packs and drops only (appended to the stored)."""
    _number_after(new.packs, base.next_number, base.next_shard, config)
    sizes = np.concatenate([base.sizes, new.packs.sizes()])
    stats = _extended_stats(new, config, sizes, base.packed_tokens + int(new.packs.lens.sum()),
                            base.output_shards + len(np.unique(new.packs.shards)), len(base.sizes),
                            len(base.dropped_ids) + len(new.dropped))
    return PlanResult(new.packs, new.dropped, stats, _joined(base.fingerprint, new.fingerprint))


def _number_after(packs: PackTable, number: int, shard: int, config: PlanConfig) -> None:
    packs.numbers = number + np.arange(len(packs), dtype=np.int64)
    assign_shards(packs, config, shard)


def _joined(old_fingerprint: str, new_fingerprint: str) -> str:
    return hashlib.sha256(f"{old_fingerprint}+{new_fingerprint}".encode()).hexdigest()[:16]


def _extended_stats(new: PlanResult, config: PlanConfig, sizes: np.ndarray, packed_tokens: int, shards: int,
                    kept: int, dropped: int) -> dict:
    """An extended plan's figures: the new part's, with the whole plan's counts, fill and drift."""
    spp = sizes.astype(np.float64)
    stats = dict(new.stats)
    stats.update(
        samples=int(sizes.sum()) + dropped,
        packs=len(sizes),
        new_packs=len(new.packs),
        kept_packs=kept,
        dropped=dropped,
        fill=packed_tokens / (len(sizes) * config.max_len) if len(sizes) else 0.0,
        packed_tokens=packed_tokens,
        mean_samples_per_pack=float(spp.mean()) if len(spp) else 0.0,
        max_samples_per_pack=int(spp.max()) if len(spp) else 0,
        drift=drift(spp),
        output_shards=shards,
        incremental=True,
    )
    stats["efficiency"] = stats["fill"]
    return stats


def plan_jsonl(plan: PlanResult, start: int = 0, stop: int | None = None) -> str:
    """pack_plan.jsonl's lines of packs ``start:stop`` (all by default)."""
    if isinstance(plan.packs, PackTable):
        return plan.packs.jsonl(start, stop)
    return "".join(json.dumps({"pack_id": p.pack_id, "media_type": p.media_type, "sample_ids": p.sample_ids,
                               "sample_token_lens": p.sample_token_lens, "total_token_len": p.total_token_len}) + "\n"
                   for p in plan.packs[start:stop])


def plan_jsonl_parts(plan: PlanResult) -> Iterator[str]:
    """pack_plan.jsonl a few thousand packs at a time (`store.atomic_write_text` takes the parts): the whole
    text, its lines and its bytes at once were three copies of it. The first part is made
    before the caller opens the file, so a failure in it leaves no temporary file behind."""
    step = max(1, CHUNK // 256)
    first = plan_jsonl(plan, 0, step)
    return itertools.chain([first], (plan_jsonl(plan, a, a + step) for a in range(step, len(plan.packs), step)))


# -- the stage: plan every counted shard into the catalog and pack_plan.jsonl -------------------------------


@dataclass(frozen=True)
class PlanInfo:
    """The catalog's plan_info row, typed: which plan, for which profile and shards, with which settings."""

    fingerprint: str
    profile: str
    profile_fingerprint: str
    model_dir: str | None
    shards: list[str]
    config: PlanConfig
    stats: dict
    trust_remote_code: bool = False  # the audit's recount builds the same processor
    chat_template_kwargs: str = ""  # ... and renders the template with the same variables

    @classmethod
    def load(cls, con) -> PlanInfo:
        d = store.read_plan_info(con)
        return cls(d["fingerprint"], d["profile"], d["profile_fingerprint"], d.get("model_dir"), d["shards"],
                   PlanConfig(**d["config"]), d["stats"], d.get("trust_remote_code", False),
                   d.get("chat_template_kwargs", ""))

    @classmethod
    def of(cls, fingerprint: str, profile: ModelProfile, shards: list[str], config: PlanConfig,
           stats: dict) -> PlanInfo:
        return cls(fingerprint, profile.name, profile.fingerprint, profile.model_dir, shards, config, stats,
                   profile.trust_remote_code, profile.chat_template_kwargs)

    def model_profile(self) -> ModelProfile:
        """The profile the plan was counted with, resolved again (the audit's recount)."""
        return resolve_profile(self.profile.split("@")[0], self.model_dir or None, self.trust_remote_code,
                               self.chat_template_kwargs)

    def as_dict(self) -> dict:
        return {**asdict(self), "config": asdict(self.config)}


@dataclass(frozen=True)
class PlanSummary:
    fingerprint: str
    plan_file: Path
    planning: str  # full, or incremental and what was kept
    stats: dict  # the planner's figures (make_plan / extend_plan)
    shards_planned: int
    shards_waiting: list[str]  # registered but not counted (yet): left for the next plan
    shards_removed: list[str]  # registered but their tar is gone: not planned
    violations: list[dict]  # check_plan on the stored plan

    def __getattr__(self, name: str):  # the planner's figures by name: summary.packs, summary.fill, ...
        try:
            return self.__dict__["stats"][name]
        except KeyError:
            raise AttributeError(name) from None

    def as_metadata(self) -> dict:
        rows = [f"| {mt} | {v['samples']} | {v['packs']} | {v['l2']} | {v['fill']:.2%} | {v['dropped']} |"
                for mt, v in sorted(self.stats["per_media_type"].items())]
        return {"dagster/row_count": self.packs, "packs": self.packs, "lower_bound": self.lower_bound,
                "packs_over_bound": self.packs_over_bound, "fill": float(self.fill), "dropped": self.dropped,
                "split": self.stats.get("split", 0),
                "fill_padded": float(self.stats.get("fill_padded", self.fill)),
                "mean_samples_per_pack": float(self.mean_samples_per_pack), "drift": float(self.drift),
                "shards": self.shards_planned, "shards_waiting": self.shards_waiting,
                "shards_removed": self.shards_removed, "planning": self.planning, "fingerprint": self.fingerprint,
                "per_media_type": Markdown("| media type | samples | packs | lower bound | fill | dropped |\n"
                                           "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows)),
                "plan_file": FilePath(self.plan_file), "dagster/column_schema": store.PACK_PLAN_SCHEMA}


def plannable(work: Path, shards: list[str], profile: ModelProfile, input_root: Path | None,
              allow_missing: bool) -> tuple[list[str], list[str], list[str]]:
    """(shards to plan, shards waiting for current counts, shards whose tar is gone)."""
    removed: list[str] = []
    if input_root is not None:
        removed = [s for s in shards if not tar_exists(input_root, s)]
        gone = set(removed)
        shards = [s for s in shards if s not in gone]
    infos = {s: store.read_shard_info(work, s) for s in shards}  # (read once for both)
    missing = [s for s in shards if not token_lengths_are_current(work, s, profile, infos[s])
               or (input_root is not None and manifest_is_current(input_root, work, s, infos[s]) is None)]
    if missing and not allow_missing:
        raise FileNotFoundError(f"{len(missing)} shard(s) have no current token_lengths for profile {profile.name}: "
                                f"{missing[:5]}")
    shards = [s for s in shards if s not in set(missing)]
    if not shards:
        raise FileNotFoundError("no shard has token lengths yet: materialize manifest and token_lengths first")
    return shards, missing, removed


def _kept_settings(con, config: PlanConfig, profile: ModelProfile) -> tuple[PlanInfo | None, str]:
    """The previous plan's info when an incremental plan may keep its packs, else (None, why not)."""
    if not store.has_plan(con):
        return None, "full plan: no previous plan"
    info = PlanInfo.load(con)
    if info.config.packing_key() != config.packing_key():
        return None, "full plan: packing settings changed since the previous plan"
    if info.profile_fingerprint != profile.fingerprint:
        return None, "full plan: the model profile changed since the previous plan"
    return info, ""


def _previous_plan(con, config: PlanConfig, info: PlanInfo):
    """The previous plan's packs, drops and fingerprint when an incremental plan may keep them, else
    (None, why not)."""
    dropped, batches = read_plan(con)
    packs = from_batches(batches)
    changed = changed_packs(con)
    asked = np.repeat(np.isin(packs.numbers, numbers(changed)), packs.sizes())
    current = current_lengths(con, packs.ids[packs.members[asked]].tolist() + [d["sample_id"] for d in dropped])
    packs, dropped, pruned = prune_plan(packs, dropped, current, changed)
    if config.group_size > 1 and pruned["packs_changed"]:  # a changed pack may leave its group (core/groups.py)
        return None, "full plan: packs changed, and a world size's groups of packs of one media type must hold"
    fp = info.fingerprint
    why = f"incremental: kept {len(packs)} packs"
    if pruned["packs_changed"] or pruned["samples_gone"] or pruned["samples_recounted"]:
        h = hashlib.sha256(fp.encode())  # the kept part differs from the previous plan: so does its fingerprint
        for a in range(0, len(packs), CHUNK // 16):
            h.update("".join(f"{p}|{','.join(ids)}\n" for p, _, ids, _, _ in packs.rows(a, a + CHUNK // 16)).encode())
        for d in dropped:
            h.update(f"{d['sample_id']}\n".encode())
        fp = h.hexdigest()[:16]
        why += (f", removed {pruned['samples_gone']} gone and {pruned['samples_recounted']} recounted sample(s) "
                f"from {pruned['packs_changed']} pack(s) ({pruned['packs_emptied']} left empty and removed); "
                "recounted samples are planned again as new")
    return (packs, dropped, fp, pruned), why


def _incremental(rows: dict[str, np.ndarray], previous, config: PlanConfig, profile: str) -> PlanResult:
    """The kept packs, plus the samples they do not hold planned on their own after them."""
    old_packs, old_dropped, old_fp, pruned = previous
    planned = set(old_packs.ids[old_packs.members].tolist()) | {d["sample_id"] for d in old_dropped}
    new = np.fromiter((sid not in planned for sid in rows["sample_ids"].tolist()), bool, len(rows["sample_ids"]))
    del planned
    fresh = make_plan(**{k: v[new] for k, v in rows.items()}, config=config, profile=profile)
    plan = extend_plan(old_packs, old_dropped, fresh, config, old_fp)
    plan.stats.update(pruned)
    gone = {d["sample_id"] for d in plan.dropped}
    kept = np.fromiter((sid not in gone for sid in rows["sample_ids"].tolist()), bool, len(rows["sample_ids"])) \
        if gone else np.ones(len(rows["sample_ids"]), bool)
    return _with_bound(plan, rows["lengths"], rows["media_types"], kept, config)


def _appended(con, base: incremental.Base, every: incremental.Lengths, config: PlanConfig, profile: str
              ) -> tuple[PlanResult, incremental.Base]:
    """`_incremental` of a stored plan none of whose samples changed (`incremental.appendable`), from ``every``
    ok sample's length and the rows of the new ones (`incremental.appended_rows`): neither the stored plan nor
    any other sample id read into Python. The result holds the new packs only; with ``base`` naming the shards
    the new samples were looked for in (the plan's check looks for a lost sample there)."""
    got = incremental.appended_rows(con, base, every)
    fresh = make_plan(**got.new, config=config, profile=profile)
    plan = append_plan(base, fresh, config)
    plan.stats.update(samples_gone=0, samples_recounted=0, packs_changed=0, packs_emptied=0)
    gone = got.of_new([d["sample_id"] for d in fresh.dropped]) if fresh.dropped else None
    return _with_bound(plan, every.lengths, every.codes, ~every.stored_drop, config, gone), \
        replace(base, changed=got.changed)


def _with_bound(plan: PlanResult, lengths: np.ndarray, kinds: np.ndarray, kept: np.ndarray, config: PlanConfig,
                gone: tuple[np.ndarray, np.ndarray] | None = None) -> PlanResult:
    """The extended plan's lower bound: over every planned sample not dropped (``kept``), per media type
    (``kinds``: each sample's media type, or its code). ``gone``: the lengths and kinds of more dropped samples,
    taken out of the kept ones' as values (the bound is one of the lengths' histogram: `binpack.lower_bounds`)."""
    lengths = padded(lengths, config.multiple)

    def of(k) -> int:
        mine = lengths[kept & (kinds == k)]
        if gone is not None:
            mine = without(mine, padded(gone[0][gone[1] == k], config.multiple))
        return lower_bounds(mine, config.capacity)[1]

    bound = sum(of(k) for k in set(kinds.tolist()))
    plan.stats.update(lower_bound=bound, packs_over_bound=plan.stats["packs"] - bound)
    return plan


def _append_base(con, info: PlanInfo | None, config: PlanConfig, profile: ModelProfile, plan_file: Path,
                 stamps: dict) -> incremental.Base | None:
    """The stored plan to append to (`incremental.appendable`), given its kept settings' ``info``, when no over-long
    sample splits (an append takes no pieces: `split_overlong` of the over-long samples alone)."""
    if info is None:
        return None
    base = incremental.appendable(con, store.read_plan_info(con), plan_file, config.pack_per_media_type, stamps)
    if base is None or config.overlong != "split":
        return base
    return None if split_overlong(con, ok_lengths(con, longer_than=config.capacity), config, profile)[1] else base


def _planned(con, config: PlanConfig, profile: ModelProfile, plan_file: Path, stamps: dict,
             on_lengths: Callable[[dict[str, np.ndarray]], None] | None
             ) -> tuple[PlanResult, str, incremental.Base | None, list]:
    """The plan (full, incremental, or appended to the stored one: then with its `incremental.Base`), why, and the
    over-long samples' pieces. ``on_lengths`` gets every ok sample's lengths and media types (`ok_lengths`'): for
    an incremental plan read alone first (`incremental.every_length`), before the stored plan is looked at."""
    info, why = _kept_settings(con, config, profile) if config.incremental else (None, "full plan")
    every = incremental.every_length(con, _OK_BATCH, SORT_MEMORY) if info is not None else None
    if every is not None and on_lengths is not None:
        on_lengths(every.sweep_rows())
    base = _append_base(con, info, config, profile, plan_file, stamps)
    rows, pieces, previous = None, [], None
    if base is not None:
        (plan, base), why = _appended(con, base, every, config, profile.name), \
            f"incremental: kept {len(base.sizes)} packs"
    else:
        rows = ok_lengths(con)
        if every is None and on_lengths is not None:
            on_lengths(rows)
        every = None  # (the sweep has them)
        rows, pieces = split_overlong(con, rows, config, profile)
        if info is not None:
            previous, why = _previous_plan(con, config, info)
        plan = make_plan(**rows, config=config, profile=profile.name) if previous is None \
            else _incremental(rows, previous, config, profile.name)
    if (base is not None or previous is not None) and plan.stats.get("balance", {}).get("incomplete_groups"):
        why = "full plan: the new samples' packs do not fill whole groups of a world size (core/groups.py)"
        plan, base = make_plan(**(ok_lengths(con) if rows is None else rows), config=config, profile=profile.name), None
    return plan, why, base, pieces


def _saved(con, work: Path, plan: PlanResult, base: incremental.Base | None, info: PlanInfo, pieces: list,
           config: PlanConfig, stamps: dict) -> list[dict]:
    """pack_plan.jsonl and the plan's tables written (or appended to, given the stored plan's ``base``), the plan
    checked (an append: its new packs and the whole plan's counts); once clean, the plan file recorded."""
    path = work / "pack_plan.jsonl"
    record = incremental.write_plan_file(path, plan_jsonl_parts(plan)) if base is None \
        else incremental.append_plan_file(path, base, plan_jsonl_parts(plan))
    batches, plan.packs = plan.packs.batches(), None  # the reader's alone: gone once pack_plan's rows are in
    store.save_plan(con, batches, plan.dropped, info.as_dict(), pieces=[split_row(p) for p in pieces],
                    multiple=config.multiple, append=base is not None)
    violations = check_plan(con, config, since=None if base is None else base.next_number,
                            changed=None if base is None else base.changed)
    if not violations:
        incremental.record_plan_file(con, record, stamps)
    return violations


_OK = "FROM token_lengths WHERE status = 'ok'"
_OK_BATCH = 1 << 17  # rows fetched at once
# DuckDB's memory for ok_lengths' sort by sample id, beyond which it spills to disk: what its allocator held for
# the sort stayed with the process through the plan (~80 B a sample under the catalog's 1GB: issue 41, 10M)
SORT_MEMORY = "256MB"


def ok_lengths(con, longer_than: int | None = None) -> dict[str, np.ndarray]:
    """make_plan's inputs, one entry per ok sample in sample id order, from the catalog (``longer_than``: of the
    samples of more tokens only). Fetched in batches of
    Arrow, not the whole result at once (held in DuckDB and again as numpy: docs/benchmarks.md, issue 41);
    the media types as codes into the few distinct ones, so each sample's is a shared str, not a str of its own;
    the ids in one NumPy string array (`packs.IDS`), each column filled in place (no second copy to join parts)."""
    ok = _OK if longer_than is None else f"{_OK} AND total_tokens > {int(longer_than)}"
    types = [r[0] for r in con.execute(f"SELECT DISTINCT media_type {ok} ORDER BY 1").fetchall() if r[0] is not None]
    n = con.execute(f"SELECT count(*) {ok}").fetchall()[0][0]
    result = con.sql(
        "SELECT sample_id AS sample_ids, list_position(?::VARCHAR[], media_type) - 1 AS media_types, "
        f"total_tokens AS lengths, media_bytes, n_images + n_videos AS n_media, vision_tokens {ok} "
        "ORDER BY sample_id", params=[types])
    names = ["sample_ids", "media_types", "lengths", "media_bytes", "n_media", "vision_tokens"]
    rows = {k: np.asarray([], IDS if k == "sample_ids" else np.int64) for k in names}
    at = 0
    with store.held_to(con, SORT_MEMORY):
        for batch in result.to_arrow_reader(_OK_BATCH):
            if any(c.null_count for c in batch.columns):  # (a NULL is never taken for 0)
                raise ValueError("token_lengths has an ok row with a NULL count: count its shard again (--force)")
            for name, col in zip(batch.schema.names, batch.columns):
                got = np.asarray(col.to_pylist(), dtype=IDS) if name == "sample_ids" else arrow_ints(col)
                if at == 0:
                    rows[name] = np.empty(n, got.dtype)
                rows[name][at:at + len(got)] = got
            at += batch.num_rows
    rows["media_types"] = np.asarray(types, dtype=object)[rows["media_types"]] if types else np.asarray([], object)
    return rows


@faults.names_full_disk(faults.WORK)
def run_plan(work: Path, shards: list[str], config: PlanConfig, profile: ModelProfile, allow_missing: bool = False,
             input_root: Path | None = None, on_lengths: Callable[[dict[str, np.ndarray]], None] | None = None,
             recursive: bool = True) -> PlanSummary:
    """Plan every given shard; with ``allow_missing``, plan the shards that have counts and report the
    others as waiting (a failed or unfinished shard does not stall the plan of the rest). Given the input
    root (recorded for the audit: core/coverage.py), a shard whose tar is gone is removed from the plan
    (``shards_removed``, with the previous plan's shards that left), and one whose tar changed since its scan
    waits for its rescan (its old counts are stale). ``on_lengths`` gets the planned samples'
    `ok_lengths` as soon as they are read (the what-if sweep starts aside from them)."""
    shards, missing, removed = plannable(work, shards, profile, input_root, allow_missing)
    work.mkdir(parents=True, exist_ok=True)
    with store.connect(work) as con:
        removed = left_since(con, removed, input_root)
        store.build_catalog(con, work, shards, profile.name)
        stamps = incremental.manifest_stamps(con)  # (before the catalog is read: `incremental.appendable`)
        # (the samples' rows go with `_planned`: the packs hold what they need of them, the rest goes before the saves)
        plan, why, base, pieces = _planned(con, config, profile, work / "pack_plan.jsonl", stamps, on_lengths)
        plan.stats.update(planning=why, shards_planned=len(shards), shards_waiting=missing, shards_removed=removed,
                          **input_stats(input_root, recursive), **split_stats(pieces))
        info = PlanInfo.of(plan.fingerprint, profile, shards, config, plan.stats)
        violations = _saved(con, work, plan, base, info, pieces, config, stamps)
    return PlanSummary(plan.fingerprint, work / "pack_plan.jsonl", why, plan.stats, len(shards), missing, removed,
                       violations)
