"""Run settings as one configurable resource (editable in the Launchpad, set by the CLI)."""


import dataclasses
import os
from pathlib import Path

import dagster as dg

from ..core.plan import PlanConfig
from ..core.profiles import DEFAULT_PROFILE, ModelProfile, resolve_profile
from ..core.safety import check_paths, lock_wait, work_lock
from ..core.scan import ScanOptions


class PackSettings(dg.ConfigurableResource):
    """Where data lives and how to pack it. Defaults come from ``PACK_ASSETS_*`` variables when set."""

    input_dir: str = "demo_data/shards"
    work_dir: str = "work"
    output_dir: str = "packed"
    max_len: int = 8192
    profile: str = DEFAULT_PROFILE
    model_dir: str = ""
    algorithm: str = "bfd"
    seed: int = 0
    max_samples_per_pack: int = 0
    max_media_per_pack: int = 0
    max_vision_tokens_per_pack: int = 0
    pad_multiple: int = 1
    keep_overlong: bool = False
    world_size: int = 1
    incremental: bool = False
    audit_scope: str = "all"  # "changed": re-read only output shards new or changed since the last clean audit
    target_shard_bytes: int = 256 << 20
    max_packs_per_shard: int = 1000
    hash_members: bool = True
    max_member_bytes: int = 4 << 30
    max_json_bytes: int = 64 << 20
    max_media_per_sample: int = 1024
    write_workers: int = 0
    recursive: bool = True

    @property
    def input_root(self) -> Path:
        return Path(self.input_dir).resolve()

    @property
    def work(self) -> Path:
        return Path(self.work_dir).resolve()

    @property
    def out(self) -> Path:
        return Path(self.output_dir).resolve()

    def check_paths(self) -> None:
        """Refuse overlapping input/work/output folders before anything is written (core.safety)."""
        check_paths(self.input_root, self.work, self.out)

    def work_lock(self, context, step: str):
        """The work folder's lock for a single-writer step: waits (logged) up to PACK_ASSETS_LOCK_WAIT
        seconds for another run; re-entrant, so a CLI run that already holds it goes straight in."""
        return work_lock(self.work, f"dagster run {context.run.run_id[:8]} ({step})", wait=lock_wait(),
                         log=context.log.warning)

    def model_profile(self) -> ModelProfile:
        return resolve_profile(self.profile, self.model_dir or None)

    def plan_config(self) -> PlanConfig:
        return PlanConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PlanConfig)
                             if f.name != "pack_per_media_type"})

    def scan_options(self) -> ScanOptions:
        return ScanOptions(hash_members=self.hash_members, max_member_bytes=self.max_member_bytes,
                           max_json_bytes=self.max_json_bytes, max_media_per_sample=self.max_media_per_sample)


def settings_from_env() -> PackSettings:
    env = os.environ
    fields = {
        "input_dir": env.get("PACK_ASSETS_INPUT"),
        "work_dir": env.get("PACK_ASSETS_WORK"),
        "output_dir": env.get("PACK_ASSETS_OUTPUT"),
        "max_len": int(env["PACK_ASSETS_MAX_LEN"]) if env.get("PACK_ASSETS_MAX_LEN") else None,
        "profile": env.get("PACK_ASSETS_PROFILE"),
        "model_dir": env.get("PACK_ASSETS_MODEL_DIR"),
    }
    return PackSettings(**{k: v for k, v in fields.items() if v is not None})
