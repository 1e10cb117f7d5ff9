"""PyTorch datasets over a packed output folder, for a training loop, the HF ``Trainer`` or TRL's ``SFTTrainer``.

``PackDataset`` streams the packs of an output folder (copy or index mode; a recipe's output of ``epoch-*``
folders, one per epoch) through a webdataset pipeline, each pack encoded for the model (``PackEncoder``,
what ``PackCollator`` takes). Each rank and DataLoader worker reads its own share; the position is (epoch,
pack): ``start`` packs of the epoch consumed by all ranks together. ``PackIndex`` opens one epoch folder by
index with wids (map-style: any sampler). ``ModelInputs`` keeps the collated keys a model's ``forward`` takes;
``hf_dataset`` wraps a PackDataset as a ``datasets.IterableDataset`` (TRL takes only those). Recipes:
docs/training.md. torch is imported here only (the ``train`` extra), never by the core or the CLI.

How packs are dealt (``split``):

- ``"pack"`` (default): every reader walks the epoch's shard list in the same order and keeps its blocks of
  ``batch_size`` packs (block b to rank b % world, within the rank to worker (b // world) % workers: the order
  in which DataLoader batches reach the trainer), reading only the tar headers of the others' packs. The
  packs consumed after any step are exactly the epoch's first ``start`` ones, so a resumed run at (epoch,
  start) yields exactly the rest, for any number of ranks and workers.
- ``"shard"``: webdataset's ``split_by_node`` / ``split_by_worker`` give each reader whole shards, each read
  once, sequentially. Resumable where ``start`` is a multiple of batch_size x world x workers (each reader
  skips the packs it gave), while every reader still has packs.
- ``"resample"``: webdataset's ``ResampledShards`` (deterministic, seeded by seed, epoch, rank and worker):
  each reader draws shards with replacement and gives its share of the epoch's pack count.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import webdataset as wds

from .core.counting.profiles import ProfileError, load_profile
from .core.indexmode import SourceFiles
from .core.tario import first_pack_meta, group_by_key, iter_entries, split_key
from .reader import PackEncoder, pack_from_parts

__all__ = ["ModelInputs", "PackDataset", "PackIndex", "epoch_folders", "hf_dataset", "shard_list"]

WIDS_INDEX = "wids-index.json"
SPLITS = ("pack", "shard", "resample")


# -- the output folder --------------------------------------------------------------------------------------

def epoch_folders(output: str | Path) -> list[Path]:
    """The packed folders of an output, in epoch order: the folder itself, or a recipe's ``epoch-<k>`` folders
    (those with a ``wids-index.json``: a retired epoch holds none of the tool's files)."""
    out = Path(output)
    if (out / WIDS_INDEX).is_file():
        return [out]
    folders = sorted(p for p in out.glob("epoch-[0-9][0-9][0-9]") if (p / WIDS_INDEX).is_file())
    if not folders:
        raise FileNotFoundError(f"{out}: no packed output here (no {WIDS_INDEX}, no epoch-<k>/ folder with one)")
    return folders


def shard_list(folder: Path) -> list[tuple[str, int]]:
    """(tar path, packs in it) of a packed folder, in the order its ``wids-index.json`` lists them (the
    plan's training order)."""
    try:
        index = json.loads((folder / WIDS_INDEX).read_text(encoding="utf-8"))
        return [(str(folder / s["url"]), int(s["nsamples"])) for s in index["shardlist"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{folder / WIDS_INDEX}: not a shard list this tool wrote ({type(e).__name__}: {e})") from None


def output_profile(folder: Path) -> str:
    """The profile the output was packed for, as its first pack's ``_meta`` records it."""
    meta = next((m for path, _ in shard_list(folder) if (m := first_pack_meta(Path(path)))), None)
    name = (meta or {}).get("profile")
    try:
        load_profile(name)
    except ProfileError:
        raise ValueError(
            f"{folder}: packed for profile {name!r}, which is not built in: pass profile= or model_dir="
        ) from None
    return name


# -- who reads what -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reader:
    """One reader of the stream: a rank (of ``world``) and a DataLoader worker (of ``workers``); ``block``: the
    packs one of its batches holds in the global order."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    block: int = 1

    @property
    def index(self) -> int:
        """Global blocks go to readers in turn: block b to reader b % count (rank first, then worker)."""
        return self.rank + self.world * self.worker

    @property
    def count(self) -> int:
        return self.world * self.workers

    def owns(self, block: int) -> bool:
        return block % self.count == self.index

    def share(self, n: int) -> int:
        """How many of the first ``n`` packs of a stream dealt in blocks fall to this reader."""
        full, rest = divmod(n, self.block * self.count)
        return full * self.block + min(max(rest - self.index * self.block, 0), self.block)


def current_reader(batch_size: int, by_rank: bool, by_worker: bool = True) -> Reader:
    """This process's reader: rank and world from ``RANK``/``WORLD_SIZE`` or torch.distributed, worker from the
    DataLoader (webdataset's ``pytorch_worker_info``). ``by_rank=False``: the trainer splits ranks itself
    (accelerate cuts each run of world x batch_size packs), so a block is that run."""
    rank, world, worker, workers = wds.utils.pytorch_worker_info()
    if not by_worker:
        worker, workers = 0, 1
    if by_rank:
        return Reader(rank, world, worker, workers, batch_size)
    return Reader(0, 1, worker, workers, batch_size * world)


# -- pipeline stages (webdataset style: each takes and returns an iterator) -----------------------------------


def own_packs(shards: Iterable[dict], reader: Reader, start: int) -> Iterator[dict]:
    """The packs (as webdataset samples: ``__key__``, ``__url__``, part name -> bytes) whose position in the
    stream of ``shards`` is >= ``start`` and whose block, counted from ``start``, this reader owns. Shards
    with none of them are not opened; in the others only these packs' payloads are read."""
    lo = 0
    for shard in shards:
        url, n = shard["url"], shard["nsamples"]
        first, lo = lo, lo + n
        wanted = [p for p in range(max(first, start), lo) if reader.owns((p - start) // reader.block)]
        if wanted:
            yield from _read_packs(url, {p - first for p in wanted})


def _read_packs(path: str, wanted: set[int]) -> Iterator[dict]:
    with open(path, "rb") as f:
        fd = f.fileno()
        for i, (key, entries) in enumerate(group_by_key(iter_entries(f, os.fstat(fd).st_size))):
            if i > max(wanted):
                return
            if any(e.kind == "break" for e in entries):
                raise ValueError(f"{path}: broken tar at pack {key}: {entries[-1].detail}")
            if i in wanted:
                parts = {split_key(e.name)[1]: os.pread(fd, e.size, e.offset) for e in entries if e.kind == "file"}
                yield {"__key__": key, "__url__": path, **parts}


def skip_mine(samples: Iterator[dict], reader: Reader, start: int, stop: int | None = None) -> Iterator[dict]:
    """A reader's own stream (shard or resample split) from the packs it gave before the first ``start`` of
    the global order, up to its share of ``stop``."""
    return itertools.islice(samples, reader.share(start), None if stop is None else reader.share(stop))


# -- the datasets -------------------------------------------------------------------------------------------


class PackDataset(torch.utils.data.IterableDataset):
    """Encoded packs (``PackEncoder.encode``: what ``PackCollator`` takes) of an output folder, this rank's and
    DataLoader worker's share, from pack ``start`` of epoch ``epoch``.

    ``profile`` / ``model_dir``: what to encode for (default: the profile the output was packed for);
    ``encode=False`` yields the packs as ``iter_packs`` does. ``batch_size``: the per-device batch size (the
    DataLoader's), so that each batch is the next run of packs. ``by_rank=False`` under the HF Trainer and
    TRL, whose accelerate splits ranks itself. ``set_epoch(n)`` (the Trainer calls it) moves to epoch
    ``epoch + n`` from its first pack; a recipe's output has a folder per epoch, epoch k reads folder k modulo
    their count (a single folder: every epoch). ``shuffle``: the shards in a seeded order per epoch
    (webdataset's ``detshuffle``, the same on every rank), else the plan's. ``source_root``: where an
    index-mode output's sources are now (see ``iter_packs``)."""

    def __init__(self, output: str | Path, profile: str | None = None, *, model_dir: str | None = None,
                 epoch: int = 0, start: int = 0, batch_size: int = 1, split: str = "pack", by_rank: bool = True,
                 shuffle: bool = False, seed: int = 0, source_root: str | Path | Mapping | None = None,
                 encode: bool = True, **encoder_options):
        if split not in SPLITS:
            raise ValueError(f"split is one of {', '.join(SPLITS)}, not {split!r}")
        if epoch < 0 or start < 0 or batch_size < 1:
            raise ValueError("epoch and start are >= 0, batch_size >= 1")
        self.folders = epoch_folders(output)
        self.epoch, self.start, self.batch_size, self.split = epoch, start, batch_size, split
        self.by_rank, self.by_worker, self.shuffle, self.seed = by_rank, True, shuffle, seed
        self.source_root, self.encode = source_root, encode
        if encode and profile is None and model_dir is None:
            profile = output_profile(self.folders[0])
        self.encoder_args = dict(profile=profile, model_dir=model_dir, **encoder_options)
        self.passes = 0
        self._encoder: PackEncoder | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_encoder": None}  # each DataLoader worker builds its own

    def set_epoch(self, n: int) -> None:
        """The n-th pass over this dataset (0 first): epoch ``epoch + n``, from ``start`` on the first pass only."""
        self.passes = n

    def position(self) -> tuple[int, int]:
        """(epoch, first pack) of the current pass."""
        return self.epoch + self.passes, self.start if self.passes == 0 else 0

    def num_packs(self, epoch: int | None = None) -> int:
        """The packs in an epoch (default: the current pass's), over all ranks."""
        return sum(n for _, n in shard_list(self._folder(self.position()[0] if epoch is None else epoch)))

    def locate(self, batches: int, world: int = 1) -> tuple[int, int]:
        """(epoch, pack) after ``batches`` more batches per rank from the current position, ``world`` ranks
        taking ``batch_size`` packs each per step (a pass of n packs is ceil(n / (batch_size x world)) steps;
        the last may be short): where a resumed run starts. Under the HF Trainer, ``state.global_step`` x
        ``gradient_accumulation_steps`` batches (exact with no accumulation, or within the first pass)."""
        if batches < 0 or world < 1:
            raise ValueError("batches >= 0 and world >= 1")
        epoch, start = self.position()
        per_step = self.batch_size * world
        if not any(self.num_packs(e) for e in range(epoch, epoch + len(self.folders))):
            raise ValueError("the output holds no packs")
        while True:
            steps = -(-(self.num_packs(epoch) - start) // per_step)
            if batches < steps:
                return epoch, start + batches * per_step
            batches, epoch, start = batches - steps, epoch + 1, 0

    def _folder(self, epoch: int) -> Path:
        return self.folders[epoch % len(self.folders)]

    def __iter__(self) -> Iterator[dict]:
        epoch, start = self.position()
        reader = current_reader(self.batch_size, self.by_rank, self.by_worker)
        if self._encoder is None and self.encode:
            self._encoder = PackEncoder(**self.encoder_args)
        with SourceFiles(self.source_root) as sources:
            for sample in self._samples(shard_list(self._folder(epoch)), reader, epoch, start):
                pack = pack_from_parts({k: v for k, v in sample.items() if not k.startswith("__")}, sources)
                yield self._encoder.encode(pack) if self.encode else pack

    def _samples(self, shards: list[tuple[str, int]], reader: Reader, epoch: int, start: int) -> Iterator[dict]:
        """The raw packs (webdataset samples) this reader gives in this epoch, from ``start``."""
        total = sum(n for _, n in shards)
        urls = [{"url": url, "nsamples": n} for url, n in shards]
        order = [wds.detshuffle(len(urls), len(urls), seed=self.seed, epoch=epoch - 1)] if self.shuffle else []
        if self.split == "pack":
            return iter(wds.DataPipeline(lambda: iter(urls), *order, lambda src: own_packs(src, reader, start)))
        if start % (reader.block * reader.count):
            raise ValueError(
                f"split={self.split!r} resumes at a multiple of {reader.block * reader.count} packs "
                f"(batch size x ranks x workers), not {start}: use split='pack' to resume anywhere"
            )
        if self.split == "shard":
            splitters = ([wds.split_by_node] if self.by_rank else []) + (
                [wds.split_by_worker] if self.by_worker else []
            )
            stream = wds.DataPipeline(lambda: iter(urls), *order, *splitters, wds.tarfile_to_samples())
            return skip_mine(iter(stream), reader, start)
        source = wds.ResampledShards(
            [u["url"] for u in urls],
            seed=self.seed,
            deterministic=True,
            worker_seed=lambda: reader.rank * 1000 + reader.worker,
        )
        source.epoch = epoch - 1  # ResampledShards counts one up per pass: this pass draws with `epoch`
        return skip_mine(iter(wds.DataPipeline(source, wds.tarfile_to_samples())), reader, start, total)


class PackIndex(torch.utils.data.Dataset):
    """Map-style: pack i of one epoch folder (the plan's order), read by index with webdataset's ``wids``
    (each tar memory-mapped in place, never copied), encoded as ``PackDataset`` does. Any sampler works
    (``DistributedSampler``; the Trainer's); resume by index (``Subset(ds, range(start, len(ds)))``)."""

    def __init__(self, output: str | Path, profile: str | None = None, *, model_dir: str | None = None,
                 epoch: int = 0, source_root: str | Path | Mapping | None = None, encode: bool = True,
                 **encoder_options):
        folders = epoch_folders(output)
        self.folder = folders[epoch % len(folders)]
        self.size = sum(n for _, n in shard_list(self.folder))
        if encode and profile is None and model_dir is None:
            profile = output_profile(self.folder)
        self.encoder_args = None if not encode else dict(profile=profile, model_dir=model_dir, **encoder_options)
        self.source_root = source_root
        self._open: tuple[int, object, SourceFiles, PackEncoder | None] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": None}

    def __len__(self) -> int:
        return self.size

    def _opened(self):
        """This process's wids dataset, sources and encoder (a DataLoader worker opens its own)."""
        if self._open is None or self._open[0] != os.getpid():
            import wids

            shards = wids.ShardListDataset(str(self.folder / WIDS_INDEX), transformations=[], localname=_in_place)
            encoder = PackEncoder(**self.encoder_args) if self.encoder_args is not None else None
            self._open = (os.getpid(), shards, SourceFiles(self.source_root), encoder)
        return self._open[1:]

    def __getitem__(self, i: int) -> dict:
        shards, sources, encoder = self._opened()
        sample = shards[i]
        parts = {k.lstrip("."): v.read() for k, v in sample.items() if not k.startswith("__")}
        pack = pack_from_parts(parts, sources)
        return encoder.encode(pack) if encoder is not None else pack


def _in_place(url: str) -> str:
    """wids' local file for a shard: the tar itself (its default copies every shard to a cache folder)."""
    return url[len("file://") :] if url.startswith("file://") else url


# -- trainers -----------------------------------------------------------------------------------------------


class ModelInputs:
    """A ``data_collator`` for the HF Trainer and TRL: ``collate(packs)`` (a ``PackCollator``) with only the keys
    ``model.forward`` takes by name (``cu_seqlens``, ``rope_position_ids``, ``loss_weights`` and the raw bytes
    are not forward arguments; ``remove_unused_columns=False`` leaves the filtering to this)."""

    def __init__(self, collate, model):
        params = inspect.signature(model.forward).parameters.values()
        self.keys = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        self.collate = collate

    def __call__(self, packs: list[dict]) -> dict:
        return {k: v for k, v in self.collate(packs).items() if k in self.keys}


def hf_dataset(dataset: PackDataset, epochs: int | None = None):
    """``dataset`` as a ``datasets.IterableDataset`` (TRL's SFTTrainer takes no other kind): its epochs one
    after the other from its position, ``epochs`` of them (None: without end; bound the run with
    ``max_steps``). It reads the whole stream in one DataLoader worker (an HF generator is one shard)."""
    import datasets

    whole = copy.copy(dataset)
    whole.by_worker = False
    return datasets.IterableDataset.from_generator(_passes, gen_kwargs={"dataset": whole, "epochs": epochs})


def _passes(dataset: PackDataset, epochs: int | None) -> Iterator[dict]:
    for n in itertools.count() if epochs is None else range(epochs):
        dataset.set_epoch(n)
        yield from dataset
