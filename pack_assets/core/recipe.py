"""A recipe: several datasets, each repeated (up- or down-sampled), packed as one blend for several epochs.

    datasets:
      - {name: llava, input: /data/llava, repeat: 1.0}
      - {name: ocr,   input: /data/ocr,   repeat: 2.5}   # 2 copies of every sample + a seeded half
      - {name: agent, input: /data/agent, label_policy: last_turn}   # which tokens train (core/labels.py)
    max_len: 16384
    profile: qwen2.5-vl
    epochs: 2
    seed: 0
    mode: copy        # or: index (Settings.output_mode)

Every other key is a flat setting name (`Settings.from_flat`: max_len, profile, algorithm, work_dir, ...).
A relative ``input`` is resolved against the recipe file's folder. Pure: no Dagster, no writes.

A dataset's shards are keyed ``<dataset>/<shard>`` (partitions, manifest folders, sample ids), so datasets
never collide and ``store.source_tar`` finds a shard's tar through `Recipe.roots`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .safety import UnsafePaths, check_paths

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RECIPE_KEYS = ("datasets", "epochs", "seed", "mode")
DATASET_KEYS = ("name", "input", "repeat", "label_policy")
BLEND_ALGORITHM = "mixfill"


class RecipeError(ValueError):
    """A recipe that cannot be run, with what to fix."""


@dataclass(frozen=True)
class Dataset:
    name: str
    input: str
    repeat: float = 1.0
    label_policy: str = ""  # which tokens train (core/labels.py); "" = the recipe's `label_policy`


@dataclass(frozen=True)
class Recipe:
    datasets: tuple[Dataset, ...]
    epochs: int = 1
    seed: int = 0
    mode: str = "copy"
    settings: dict = field(default_factory=dict)  # further flat settings (max_len, profile, ...)
    path: str = ""  # the file it was read from

    def __post_init__(self):
        if not self.datasets:
            raise RecipeError("a recipe needs at least one dataset under `datasets:`")
        seen: set[str] = set()
        for d in self.datasets:
            if not isinstance(d.name, str) or not NAME.match(d.name):
                raise RecipeError(f"dataset name {d.name!r}: use letters, digits, '_', '-', '.' (it prefixes the "
                                  "dataset's shard keys and sample ids)")
            if d.name in seen:
                raise RecipeError(f"dataset name {d.name!r} appears twice")
            seen.add(d.name)
            if isinstance(d.repeat, bool) or not isinstance(d.repeat, (int, float)) or not math.isfinite(d.repeat) \
                    or d.repeat < 0:
                raise RecipeError(f"dataset {d.name!r}: repeat must be a number >= 0, got {d.repeat!r}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise RecipeError(f"epochs must be an integer >= 1, got {self.epochs!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise RecipeError(f"seed must be an integer, got {self.seed!r}")
        for key in ("input_dir", "seed", "output_mode", "incremental"):
            if key in self.settings:
                raise RecipeError(f"{key!r} is not a recipe key: a recipe names its inputs under `datasets:`, its "
                                  "seed as `seed:`, its output mode as `mode:`, and always plans every epoch anew")

    @property
    def roots(self) -> dict[str, str]:
        """Dataset name -> its input folder (what `store.source_tar` resolves ``<dataset>/<shard>`` keys by)."""
        return {d.name: d.input for d in self.datasets}

    @property
    def repeats(self) -> dict[str, float]:
        return {d.name: float(d.repeat) for d in self.datasets}

    def flat(self) -> dict:
        """The run's flat settings: the recipe's own (seed, mode, the recipe path) over its further settings.
        A blend packs with `mixfill` unless the recipe names an algorithm: BFD packs a dataset of short samples
        apart (its tail packs hold nothing else), so one such pack in a window of 256 moves that dataset's
        share by tens of percent; `mixfill` spreads every dataset over the packs like `mix` and stays within
        +0.1 % of the bound where `mix` is 0.2-0.5 % over it on small blends (bench/bench_blend*.py)."""
        out = {"algorithm": BLEND_ALGORITHM, **self.settings, "seed": self.seed, "output_mode": self.mode,
               "recipe": self.path}
        if any(d.label_policy for d in self.datasets):  # one policy per dataset, the recipe's where none is set
            default = self.settings.get("label_policy") or "all"
            out["label_policy"] = {d.name: d.label_policy or default for d in self.datasets}
        return out

    def check_paths(self, work: Path, output: Path) -> None:
        """Every input exists; no input overlaps another, the work folder or the output (core/safety)."""
        for d in self.datasets:
            if not Path(d.input).is_dir():
                raise RecipeError(f"dataset {d.name!r}: input folder {d.input} does not exist")
        for d in self.datasets:
            check_paths(Path(d.input), work, output)
            for o in self.datasets:
                a, b = Path(d.input).resolve(), Path(o.input).resolve()
                if o is not d and (a == b or b in a.parents):
                    raise UnsafePaths(f"dataset {d.name!r} ({a}) lies inside or is dataset {o.name!r}'s input ({b}): "
                                      "its shards would be read twice")


def parse(data: object, path: str = "", base: Path | None = None) -> Recipe:
    """A Recipe from the YAML's mapping; unknown keys in a dataset are refused here, unknown settings by
    `Settings.from_flat` when the run's settings are built."""
    if not isinstance(data, dict):
        raise RecipeError(f"{path or 'recipe'}: expected a mapping with `datasets:`, got {type(data).__name__}")
    raw = data.get("datasets")
    if not isinstance(raw, list):
        raise RecipeError(f"{path or 'recipe'}: `datasets:` must be a list of {{name, input, repeat}}")
    datasets = []
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise RecipeError(f"datasets[{i}]: expected {{name, input, repeat}}, got {d!r}")
        unknown = sorted(set(d) - set(DATASET_KEYS))
        if unknown:
            raise RecipeError(f"datasets[{i}]: unknown key(s) {unknown}; known: {', '.join(DATASET_KEYS)}")
        if "name" not in d or "input" not in d:
            raise RecipeError(f"datasets[{i}]: `name` and `input` are required")
        inp = Path(str(d["input"])).expanduser()
        if base is not None and not inp.is_absolute():
            inp = base / inp
        datasets.append(Dataset(d["name"], str(inp.resolve()), d.get("repeat", 1.0), d.get("label_policy", "")))
    rest = {k: v for k, v in data.items() if k not in RECIPE_KEYS}
    return Recipe(tuple(datasets), data.get("epochs", 1), data.get("seed", 0), data.get("mode", "copy"), rest, path)


def load(path: str | Path) -> Recipe:
    import yaml

    p = Path(path).expanduser().resolve()
    try:
        text = p.read_text()
    except OSError as e:
        raise RecipeError(f"recipe {path}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {path}: not valid YAML: {e}") from None
    return parse(data, str(p), p.parent)


def dataset_of(shard: str) -> str:
    """The dataset a ``<dataset>/<shard>`` key belongs to."""
    return shard.split("/", 1)[0]


def blend_seed(seed: int, *parts: object) -> int:
    """A 64-bit seed from the recipe seed and names (dataset, epoch): independent draws per dataset and epoch."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, (seed, *parts))).encode()).digest()[:8], "little")


def copies(sample_ids: list[str] | np.ndarray, repeat: float, seed: int, dataset: str, epoch: int) -> np.ndarray:
    """How many times each sample is used in ``epoch``: ⌊repeat⌋, plus one for exactly round(frac · n) of them
    (halves up) chosen by a seeded hash of (seed, dataset, epoch, sample id). By hash, not by position: a sample's draw
    does not move when a shard is added to its dataset, and other datasets never change it."""
    n = len(sample_ids)
    base = int(math.floor(repeat))
    out = np.full(n, base, dtype=np.int64)
    extra = _share(repeat - base, n)
    if extra:
        salt = f"{seed}|{dataset}|{epoch}|".encode()
        keys = np.fromiter((int.from_bytes(hashlib.blake2b(salt + str(s).encode(), digest_size=8).digest(), "little")
                            for s in sample_ids), dtype=np.uint64, count=n)
        out[np.argsort(keys, kind="stable")[:extra]] += 1
    return out


def expected_copies(n_ok: int, repeat: float) -> int:
    """What `copies` sums to for a dataset of ``n_ok`` samples (what the audit checks the outputs against)."""
    base = int(math.floor(repeat))
    return base * n_ok + _share(repeat - base, n_ok)


def _share(frac: float, n: int) -> int:
    """round(frac · n), halves up (Python's round would take 4.5 to 4 and 5.5 to 6)."""
    return int(math.floor(frac * n + 0.5))
