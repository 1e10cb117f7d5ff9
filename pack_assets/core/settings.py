"""One settings type for a run: where data lives, how shards are scanned, how samples are packed.

Built once, by the CLI (flags and ``--config``) or by the Dagster resource (`defs/resources.py`), and passed
down typed. Defaults live here and in the two option types it holds (`ScanOptions`, `PlanConfig`), nowhere
else. Settings travel as one flat dict of plain values (the resource's fields, a ``--config`` file, a worker
process's arguments); `Settings.from_flat` routes each name to where it belongs and refuses unknown names.

Environment variables exist only for what a Dagster deployment cannot pass as run config:

| variable | read by | meaning |
|---|---|---|
| `PACK_ASSETS_INPUT`, `_WORK`, `_OUTPUT` | `definitions.py` | the resource's folders under `dagster dev` |
| `PACK_ASSETS_MAX_LEN`, `_PROFILE`, `_MODEL_DIR` | `definitions.py` | its packing defaults under `dagster dev` |
| `PACK_ASSETS_SENSOR_INTERVAL` | `defs/sensors.py` | seconds between new-shard checks (default 30; replanning 2×) |
| `PACK_ASSETS_LOCK_WAIT` | `core/safety.py` | seconds a single-writer step waits for the work lock (default 600) |
| `PACK_ASSETS_DUCKDB_MEMORY` | `core/store.py` | DuckDB's memory limit, shared by a process's connections (`1GB`) |
| `DAGSTER_HOME` | `runner/runenv.py` | the Dagster instance (`--dagster-home` overrides it) |
| `PACK_ASSETS_CACHE` | `core/counting/tokenizers.py` | tokenizer rank tables (else `$XDG_CACHE_HOME/pack_assets`) |
| `PACK_ASSETS_VIDEO_BUDGET_GB` | `core/counting/procount.py` | processor rule: GiB a sample's videos may take (8) |
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import labels
from .binpack import Caps, check_algorithm
from .chatkw import canonical
from .counting.profiles import DEFAULT_PROFILE, ModelProfile, resolve_profile
from .cpad import sample_multiple
from .safety import check_paths

AUDIT_SCOPES = ("all", "changed")
OVERLONG = ("drop", "split")  # what becomes of a sample longer than max_len (core/split.py)
SPLIT_IN_BLEND = ("overlong 'split' is not supported with a recipe (a blend draws copies of whole samples): "
                  "split the over-long samples of a single input, or drop them")
OUTPUT_MODES = ("copy", "index")

# PACK_ASSETS_* variable -> flat setting, for the resource under `dagster dev`
ENV = {
    "PACK_ASSETS_INPUT": "input_dir",
    "PACK_ASSETS_WORK": "work_dir",
    "PACK_ASSETS_OUTPUT": "output_dir",
    "PACK_ASSETS_MAX_LEN": "max_len",
    "PACK_ASSETS_PROFILE": "profile",
    "PACK_ASSETS_MODEL_DIR": "model_dir",
}


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """How the manifest stage reads a shard (core/scan.py): whether members are hashed, and the sizes past which
    a member, a record or a sample is refused."""

    hash_members: bool = True
    max_member_bytes: int = 4 << 30
    max_json_bytes: int = 64 << 20
    max_media_per_sample: int = 1024


@dataclass(frozen=True)
class PlanConfig:
    """How samples are packed (core/plan.py, core/blend.py): capacity, algorithm and seed, caps per pack, padding,
    output shard sizes, the world size the order is balanced for, and which tokens train."""

    max_len: int = 8192
    algorithm: str = "bfd"
    seed: int = 0
    pack_per_media_type: bool = True
    max_samples_per_pack: int = 0
    max_media_per_pack: int = 0
    max_vision_tokens_per_pack: int = 0
    pad_multiple: int = 1
    # context parallelism (core/cpad.py): each sub-sample padded to a multiple of 2*cp (x tp with sequence
    # parallelism), or of an explicit sample_multiple; packs are planned on the padded lengths
    cp_size: int = 1
    tp_size: int = 1
    sequence_parallel: bool = False
    sample_multiple: int = 0  # 0: from cp_size, tp_size and sequence_parallel
    keep_overlong: bool = False
    # groups of world_size * micro_batch_size consecutive packs share one media type (core/groups.py)
    world_size: int = 1
    micro_batch_size: int = 1
    target_shard_bytes: int = 256 << 20
    max_packs_per_shard: int = 1000
    incremental: bool = False  # keep the previous plan's packs; new samples go into new packs and shards
    # which tokens train (core/labels.py): a policy name, or JSON of dataset -> name; recorded in _meta
    label_policy: str = "all"
    # an over-long multi-turn sample: "drop" (a dropped row with its length) or "split" into pieces cut at
    # assistant-turn boundaries (core/split.py), each carrying at most split_context tokens of earlier turns
    overlong: str = "drop"
    split_context: int = 2048

    def packing_key(self) -> dict:
        """The settings a kept pack depends on: an incremental plan needs them unchanged."""
        d = asdict(self)
        for k in ("incremental", "seed", "target_shard_bytes", "max_packs_per_shard", "label_policy"):
            d.pop(k)
        return d

    def __post_init__(self):
        object.__setattr__(self, "label_policy", labels.canonical(self.label_policy))
        if self.max_len <= 0:
            raise ValueError(f"max_len must be positive, got {self.max_len}")
        check_algorithm(self.algorithm)
        if not 1 <= self.pad_multiple <= self.max_len:
            raise ValueError(f"pad_multiple must be in [1, max_len], got {self.pad_multiple}")
        if self.world_size < 1 or self.micro_batch_size < 1:
            raise ValueError(f"world_size and micro_batch_size must be >= 1, got {self.world_size}, "
                             f"{self.micro_batch_size}")
        if self.overlong not in OVERLONG:
            raise ValueError(f"overlong {self.overlong!r}: expected one of {', '.join(OVERLONG)}")
        if self.overlong == "split" and self.keep_overlong:
            raise ValueError("overlong 'split' and keep_overlong exclude each other: choose one")
        if self.split_context < 0:
            raise ValueError(f"split_context must be >= 0, got {self.split_context}")
        if not 1 <= self.multiple <= self.max_len:
            raise ValueError(f"the sub-sample multiple {self.multiple} (cp_size, tp_size, sample_multiple) must be "
                             f"in [1, max_len]")

    @property
    def multiple(self) -> int:
        """What each sub-sample's length is padded to a multiple of (1: no padding)."""
        return sample_multiple(self.cp_size, self.tp_size, self.sequence_parallel, self.sample_multiple)

    @property
    def group_size(self) -> int:
        """Consecutive packs that share one media type: the packs of one optimizer micro-step on all ranks."""
        return self.world_size * self.micro_batch_size

    @property
    def capacity(self) -> int:
        """Tokens a pack may hold so that, padded to ``pad_multiple``, it still fits ``max_len``."""
        cap = self.max_len // self.pad_multiple * self.pad_multiple
        return cap // self.multiple * self.multiple  # a sum of padded sub-samples is a multiple of it

    @property
    def caps(self) -> Caps:
        return Caps(self.max_samples_per_pack, self.max_media_per_pack, self.max_vision_tokens_per_pack)


@dataclass(frozen=True)
class Settings:
    input_dir: str = "demo_data/shards"
    work_dir: str = "work"
    output_dir: str = "packed"
    profile: str = DEFAULT_PROFILE
    model_dir: str = ""  # a local HF checkpoint folder; overrides `profile`
    trust_remote_code: bool = False  # let transformers run a --model-dir's own processor code (auto_map)
    # extra chat template variables (enable_thinking, ...): JSON text of a mapping; a mapping is taken too
    chat_template_kwargs: str = ""
    recursive: bool = True  # shards in subfolders of the input too
    audit_scope: str = "all"  # "changed": re-read only output shards new or changed since the last clean audit
    check_samples: int = 0  # the audit also recounts this many samples per shard with the real processor (drift)
    write_workers: int = 0  # 0: one per core, when the output is large enough to pay for the processes
    output_mode: str = "copy"  # "index": packs name byte ranges in the source shards instead of copying media
    recipe: str = ""  # a recipe YAML (core/recipe.py): its datasets replace input_dir; one output per epoch
    scan: ScanOptions = field(default_factory=ScanOptions)
    plan: PlanConfig = field(default_factory=PlanConfig)

    def __post_init__(self):
        object.__setattr__(self, "chat_template_kwargs", canonical(self.chat_template_kwargs))
        if self.audit_scope not in AUDIT_SCOPES:
            raise ValueError(f"audit scope {self.audit_scope!r}: expected one of {', '.join(AUDIT_SCOPES)}")
        if self.output_mode not in OUTPUT_MODES:
            raise ValueError(f"output mode {self.output_mode!r}: expected one of {', '.join(OUTPUT_MODES)}")
        if self.recipe and self.plan.overlong == "split":
            raise ValueError(SPLIT_IN_BLEND)
        if self.plan.label_policy.startswith("{"):  # a policy per dataset: the recipe's datasets, read only then
            labels.check_datasets(self.plan.label_policy,
                                  [d.name for d in self.blend().datasets] if self.recipe else None)

    @property
    def input_root(self) -> Path:
        return Path(self.input_dir).resolve()

    @property
    def work(self) -> Path:
        return Path(self.work_dir).resolve()

    @property
    def out(self) -> Path:
        return Path(self.output_dir).resolve()

    @property
    def sources(self):
        """Where the shards are: the input folder, or a recipe's roots (dataset name -> folder), the form
        `store.source_tar` and `store.find_sources` take."""
        return self.blend().roots if self.recipe else self.input_root

    def blend(self):
        """The recipe this run follows (read from its file), or None."""
        from .recipe import load

        return load(self.recipe) if self.recipe else None

    def check_paths(self) -> None:
        """Refuse overlapping input/work/output folders (and with a recipe, missing or overlapping dataset
        inputs) before anything is written."""
        if self.recipe:
            self.blend().check_paths(self.work, self.out)
        else:
            check_paths(self.input_root, self.work, self.out)

    def model_profile(self) -> ModelProfile:
        return resolve_profile(self.profile, self.model_dir or None, self.trust_remote_code, self.chat_template_kwargs)

    def flat(self) -> dict:
        """Every setting by name, plain values: the resource's fields, a ``--config`` file's keys."""
        top = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NESTED}
        return {**top, **dataclasses.asdict(self.scan), **dataclasses.asdict(self.plan)}

    @classmethod
    def from_flat(cls, values: dict) -> Settings:
        """Settings from flat names (unknown names refused, the rest defaulted). With a ``recipe``, every name
        the recipe sets (its seed, mode and further settings) takes the recipe's value unless ``values`` holds
        something other than the default for it: a CLI flag or a Launchpad field that was changed wins."""
        if values.get("recipe"):
            from .recipe import load

            values = dict(values)
            for name, value in load(values["recipe"]).flat().items():
                if name not in values or values[name] == DEFAULTS.get(name):
                    values[name] = value
        parts: dict[str, dict] = {"": {}, "scan": {}, "plan": {}}
        for name, value in values.items():
            home = _HOME.get(name)
            if home is None:
                raise ValueError(f"unknown setting {name!r}; known: {', '.join(sorted(_HOME))}")
            _check_type(name, value)
            parts[home][name] = value
        return cls(**parts[""], scan=ScanOptions(**parts["scan"]), plan=PlanConfig(**parts["plan"]))


_KINDS = {bool: "true or false", int: "an integer", str: "a string"}
# settings kept as canonical JSON text that a config file or recipe may also give as a mapping
# (template variables; a label policy per dataset)
_MAPPING_OK = frozenset({"chat_template_kwargs", "label_policy"})


def _check_type(name: str, value) -> None:
    """A value of its default's type (a ``--config`` file's "8192" or 1 for a flag is refused by name here,
    not deep in a stage or in the resource's validation)."""
    want = type(DEFAULTS[name])
    ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
    ok = ok or (name in _MAPPING_OK and isinstance(value, dict))
    if not ok:
        kind = _KINDS.get(want, want.__name__) + (" or a mapping" if name in _MAPPING_OK else "")
        raise ValueError(f"setting {name!r} must be {kind}, got {value!r}")


def env_overrides(env: dict[str, str] | None = None) -> dict:
    """The flat settings the ``PACK_ASSETS_*`` variables set."""
    env = os.environ if env is None else env
    out: dict = {}
    for var, name in ENV.items():
        if env.get(var):
            out[name] = int(env[var]) if name == "max_len" else env[var]
    return out


_NESTED = ("scan", "plan")
_HOME = {
    **{f.name: "" for f in dataclasses.fields(Settings) if f.name not in _NESTED},
    **{f.name: "scan" for f in dataclasses.fields(ScanOptions)},
    **{f.name: "plan" for f in dataclasses.fields(PlanConfig)},
}
DEFAULTS = Settings().flat()
