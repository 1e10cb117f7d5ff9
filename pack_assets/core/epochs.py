"""A recipe's epochs after their plans (core/blend.py): each epoch's output folder ``<output>/epoch-<k>/``
written and audited as a plan of its own (the writer and the audit run on it unchanged), folders of epochs the
recipe no longer has retired, and one result over all epochs for the assets and the CLI."""

from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from . import owned, store
from .audit import run_audit
from .blend import epoch_name, epoch_work
from .recipe import Recipe
from .report import blend_report
from .results import AuditResult, FilePath, summed
from .write import writer


@dataclass(frozen=True)
class BlendWriteSummary:
    epochs: list  # WriteSummary per epoch
    output_dir: Path
    retired: list = dataclasses.field(default_factory=list)  # epoch folders past the recipe's epochs, emptied
    shards = summed("shards")
    written = summed("written")
    bytes = summed("bytes")

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
    write = writer(mode)
    written = [write(epoch_work(work, k), recipe.roots, out_dir / epoch_name(k), workers, progress)
               for k in range(recipe.epochs)]
    return BlendWriteSummary(written, out_dir, retire_epochs(out_dir, recipe.epochs))


def run_blend_audit(work: Path, recipe: Recipe, out_dir: Path, scope: str = "all", check_samples: int = 0,
                    progress=None, pool: Executor | None = None) -> AuditResult:
    """Every epoch audited (its report in ``<work>/epoch-<k>/audit_report.md``); one result over all of them:
    violations tagged with their epoch, totals summed, per dataset per epoch, and a blend report beside them.
    ``progress``: as `audit.audit`'s, epoch by epoch."""
    results = [run_audit(epoch_work(work, k), out_dir / epoch_name(k), scope=scope, check_samples=check_samples,
                          progress=progress, pool=pool)
               for k in range(recipe.epochs)]
    total = AuditResult()
    for k, r in enumerate(results):
        total.violations += [{**v, "epoch": k} for v in r.violations]
    keys = ("samples_read", "packed", "dropped", "rejected", "packs_read", "output_shards", "output_shards_trusted",
            "output_shards_hashed", "media_members_checked", "media_bytes_checked")
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
