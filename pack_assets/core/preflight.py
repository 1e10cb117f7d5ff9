"""What a run refuses from its folders and settings alone, checked before it takes the work folder's lock,
writes anything or scans a shard: an output or work folder this process cannot write (read-only, missing
permissions), overlapping folders (an output in or around the input, a work folder in
the output or the input), a recipe's missing or overlapping inputs, a missing input or one without shards,
a profile that does not resolve, and a file the tool did not write at a name its writer uses. Settings of
an unknown name or of the wrong type are refused earlier still, when they are built (`Settings.from_flat`).

A refusal is one exception with one line of text; the CLI prints it and exits 2."""

from __future__ import annotations

from pathlib import Path

from . import faults, owned, store
from .blend import epoch_name
from .counting import procount
from .indexmode import INDEX_FILE
from .settings import Settings


def output_folders(settings: Settings) -> list[Path]:
    """The folders the writer writes shards into: the output, or with a recipe one folder per epoch."""
    if settings.recipe:
        return [settings.out / epoch_name(k) for k in range(settings.blend().epochs)]
    return [settings.out]


def preflight(settings: Settings) -> list[str]:
    """Every refusal that needs no scan (module docstring), cheapest first; returns the input's shards."""
    settings.check_paths()
    faults.check_writable(settings.work, "work", "--work", (store.DB_NAME,))
    for folder in output_folders(settings):
        faults.check_writable(folder, "output", "--output", (owned.RECORD,))
    extra = (INDEX_FILE,) if settings.output_mode == "index" else ()
    for folder in output_folders(settings):
        owned.refuse_foreign(folder, extra)
    return listing(settings)


def listing(settings: Settings) -> list[str]:
    """The input's shards, refusing (before any shard is touched) a missing input folder, one with no shards,
    and a profile that does not resolve or whose processor cannot be built (a missing package)."""
    root = settings.sources
    if not settings.recipe and not root.is_dir():
        raise FileNotFoundError(f"input directory {root} does not exist")
    shards = list(store.find_sources(root, settings.recursive))
    if not shards:
        raise FileNotFoundError(f"no *.tar shards under {root}")
    profile = settings.model_profile()
    if profile.rule == "processor":
        procount.processor_counter(profile)  # here: built, the forked helpers and the audit's recount reuse it
    return shards
