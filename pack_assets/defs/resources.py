"""Run settings as one configurable resource (editable in the Launchpad, set by the CLI), and the IO manager
of the stages' summaries."""

import dagster as dg

from ..core.safety import lock_wait, work_lock
from ..core.settings import DEFAULTS, Settings, env_overrides

_D = DEFAULTS  # the values live in core.settings (and its ScanOptions / PlanConfig); here only their names


class PackSettings(dg.ConfigurableResource):
    """Where data lives and how to pack it: the flat fields of `core.settings.Settings`. Under `dagster dev`
    the ``PACK_ASSETS_*`` variables set the defaults (see `core/settings.py`)."""

    input_dir: str = _D["input_dir"]
    work_dir: str = _D["work_dir"]
    output_dir: str = _D["output_dir"]
    profile: str = _D["profile"]
    model_dir: str = _D["model_dir"]
    trust_remote_code: bool = _D["trust_remote_code"]
    chat_template_kwargs: str = _D["chat_template_kwargs"]
    recursive: bool = _D["recursive"]
    audit_scope: str = _D["audit_scope"]
    check_samples: int = _D["check_samples"]
    write_workers: int = _D["write_workers"]
    output_mode: str = _D["output_mode"]
    recipe: str = _D["recipe"]
    hash_members: bool = _D["hash_members"]
    max_member_bytes: int = _D["max_member_bytes"]
    max_json_bytes: int = _D["max_json_bytes"]
    max_media_per_sample: int = _D["max_media_per_sample"]
    max_len: int = _D["max_len"]
    algorithm: str = _D["algorithm"]
    seed: int = _D["seed"]
    pack_per_media_type: bool = _D["pack_per_media_type"]
    max_samples_per_pack: int = _D["max_samples_per_pack"]
    max_media_per_pack: int = _D["max_media_per_pack"]
    max_vision_tokens_per_pack: int = _D["max_vision_tokens_per_pack"]
    pad_multiple: int = _D["pad_multiple"]
    cp_size: int = _D["cp_size"]
    tp_size: int = _D["tp_size"]
    sequence_parallel: bool = _D["sequence_parallel"]
    sample_multiple: int = _D["sample_multiple"]
    keep_overlong: bool = _D["keep_overlong"]
    world_size: int = _D["world_size"]
    micro_batch_size: int = _D["micro_batch_size"]
    target_shard_bytes: int = _D["target_shard_bytes"]
    max_packs_per_shard: int = _D["max_packs_per_shard"]
    incremental: bool = _D["incremental"]
    label_policy: str = _D["label_policy"]
    overlong: str = _D["overlong"]
    split_context: int = _D["split_context"]

    @classmethod
    def of(cls, settings: Settings) -> "PackSettings":
        return cls(**settings.flat())

    def to_settings(self) -> Settings:
        return Settings.from_flat({name: getattr(self, name) for name in type(self).model_fields})

    def work_lock(self, context, step: str):
        """The work folder's lock for a single-writer step: waits (logged) up to PACK_ASSETS_LOCK_WAIT
        seconds for another run; re-entrant, so a CLI run that already holds it goes straight in."""
        return work_lock(self.to_settings().work, f"dagster run {context.run.run_id[:8]} ({step})", wait=lock_wait(),
                         log=context.log.warning)


def settings_from_env() -> PackSettings:
    return PackSettings.of(Settings.from_flat(env_overrides()))


class SummaryIOManager(dg.IOManager):
    """An asset's data is its files (Parquet, DuckDB, tar), written by the stage itself; its return value is
    the stage's typed summary, shown as metadata and read from the run result by in-process runs (the CLI).
    Nothing is stored, so no asset loads another's summary: they depend on each other's files."""

    def handle_output(self, context: dg.OutputContext, obj) -> None:
        pass

    def load_input(self, context: dg.InputContext):
        raise NotImplementedError("pack_assets assets depend on files, not on each other's summaries")


@dg.io_manager(description="Keeps nothing: the assets' data are their files; their values are summaries.")
def summary_io_manager() -> SummaryIOManager:
    return SummaryIOManager()
