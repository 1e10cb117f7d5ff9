"""What a run refuses from its folders and settings alone, checked before it takes the work folder's lock,
writes anything or scans a shard: an output or work folder this process cannot write (read-only, missing
permissions), overlapping folders (an output in or around the input, a work folder in the output or the
input), a work or output folder that is a file or lies under one (`usable_folder`; the CLI checks the Dagster
home with it too), a recipe's missing or overlapping inputs, a missing input or one without shards, a profile
that does not resolve, ``check_samples`` without a processor to recount with, and a file the tool did not
write at a name its writer uses (a recorded output shard is read unless the writer's record shows it as
written). Settings of an unknown name or of the wrong type are refused earlier still, when they are built
(`Settings.from_flat`).

A refusal is one exception with one line of text; the CLI prints it and exits 2."""

from __future__ import annotations

from pathlib import Path

from . import faults, owned, store
from .blend import epoch_name, epoch_work
from .counting import drift, procount
from .indexmode import INDEX_FILE
from .settings import Settings
from .write.record import left_as_written


def output_folders(settings: Settings) -> list[Path]:
    """The folders the writer writes shards into: the output, or with a recipe one folder per epoch."""
    if settings.recipe:
        return [settings.out / epoch_name(k) for k in range(settings.blend().epochs)]
    return [settings.out]


def work_folders(settings: Settings) -> list[Path]:
    """The work folder of each of `output_folders`: the work folder, or with a recipe one per epoch."""
    if settings.recipe:
        return [epoch_work(settings.work, k) for k in range(settings.blend().epochs)]
    return [settings.work]


def preflight(settings: Settings) -> list[str]:
    """Every refusal that needs no scan (module docstring), cheapest first; returns the input's shards."""
    settings.check_paths()
    usable_folders(settings)
    faults.check_writable(settings.work, "work", "--work", (store.DB_NAME,))
    for folder in output_folders(settings):
        faults.check_writable(folder, "output", "--output", (owned.RECORD,))
    extra = (INDEX_FILE,) if settings.output_mode == "index" else ()
    for folder, work in zip(output_folders(settings), work_folders(settings)):
        owned.refuse_foreign(folder, extra, left_as_written(work, folder))
    check_samples_processor(settings)
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


def check_samples_processor(settings: Settings) -> None:
    """``check_samples`` recounts with the ``--model-dir`` folder's real processor: refuse a run that cannot
    build it (a built-in profile, a missing package) now, not as the audit's FAIL at the end of the run."""
    if settings.check_samples > 0:
        drift.reference_counter(settings.model_profile(), "--check-samples")  # the processor stays cached


class UnusableFolder(ValueError):
    """A folder the run would create or write in is a file, or lies under one."""


def usable_folder(path: Path, what: str) -> None:
    """Refuse a folder whose path holds a file (or a broken link) at it or above it: creating it, its lock or
    Dagster's files there would fail after the run has started."""
    p = Path(path).expanduser().absolute()
    for q in (p, *p.parents):
        if q.is_dir():
            return
        if q.is_symlink() or q.exists():
            kind = "a broken link" if q.is_symlink() and not q.exists() else "a file"
            raise UnusableFolder(f"{what} {p}: {q} is {kind}, not a folder; choose another")


def usable_folders(settings: Settings) -> None:
    """The work folder and the output folder(s), as `usable_folder` wants them."""
    usable_folder(settings.work, "the work folder")
    for folder in output_folders(settings):
        usable_folder(folder, "the output folder")
