"""Tables `convert` reads: Parquet files, Arrow files, and folders of them (a Hugging Face Hub snapshot:
``<config>/train-0000N-of-0000M.parquet`` or ``data/<split>-*.parquet``; a ``datasets.save_to_disk``
folder: ``state.json`` naming its ``data-*.arrow`` files, or ``dataset_dict.json`` over split folders).

Rows are read a batch at a time (Parquet pages through a small read buffer, about 8 MiB of rows a batch as
the footer's sizes tell; Arrow IPC record batches as written, read from the file, no memory map), so a file is
never whole in memory; with ``read_ahead`` a thread decodes the next batches, of the next file too (pyarrow
works without the GIL) while the caller converts the current one. ``save_to_disk``
folders are read with pyarrow alone: their ``.arrow`` files are Arrow IPC streams, so the ``datasets``
package is not needed.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .reasons import ReasonError

TABLE_SUFFIXES = (".parquet", ".arrow")
_READ_BUFFER = 1 << 20  # Parquet column chunks are read through this much, not whole


@dataclass(frozen=True, slots=True)
class TableSource:
    """One file of rows: ``rel`` names it in reports (its path under the folder given, or its file name)."""

    path: Path
    rel: str
    kind: str  # "parquet" | "arrow"


def is_table_input(path: Path) -> bool:
    return path.is_dir() or path.suffix.lower() in TABLE_SUFFIXES


def _saved_files(folder: Path) -> list[Path] | None:
    """The Arrow files of a ``save_to_disk`` folder, in its own order (``state.json``), or None."""
    state = folder / "state.json"
    if not state.is_file():
        return None
    try:
        files = json.loads(state.read_text(encoding="utf-8")).get("_data_files") or []
        return [folder / f["filename"] for f in files]
    except (ValueError, TypeError, KeyError, AttributeError, OSError):
        return None  # not datasets' state file after all: the folder is walked like any other


def _walk(folder: Path) -> Iterator[Path]:
    saved = _saved_files(folder)
    if saved is not None:
        yield from saved
        return
    for p in sorted(folder.iterdir(), key=lambda q: q.name):
        if p.name.startswith("."):  # huggingface_hub's .cache/, editors' files
            continue
        if p.is_dir():
            yield from _walk(p)
        elif p.suffix.lower() in TABLE_SUFFIXES and p.is_file():
            yield p


def find_sources(path: Path) -> list[TableSource]:
    """The table files of an input: the file itself, or every Parquet/Arrow file under a folder (sorted by
    path, each ``save_to_disk`` folder in its own file order); hidden folders are skipped."""
    if not path.is_dir():
        return [TableSource(path, path.name, _kind(path))]
    return [TableSource(p, p.relative_to(path).as_posix(), _kind(p)) for p in _walk(path)]


def _kind(path: Path) -> str:
    return "parquet" if path.suffix.lower() == ".parquet" else "arrow"


_DONE = object()
_BATCH_BYTES = 8 << 20  # a Parquet batch's decoded size, about (the footer's row sizes say how many rows)
_MAX_BATCH_ROWS = 4096  # text-only rows: enough for the per-batch overhead to vanish
_UNSIZED_BATCH_ROWS = 64


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class _ReadAhead:
    """Items of an iterator produced by a thread, at most ``n`` ahead of the consumer; the producer's error
    is raised in the consumer, in order. ``close()`` stops and joins the thread."""

    def __init__(self, items: Iterator, n: int):
        self._q: queue.Queue = queue.Queue(n)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(items,), name="table-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a generator's open file closes on this thread, which read it
                close()
        self._put(_DONE)

    def __iter__(self) -> Iterator:
        while (item := self._q.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def batch_rows_for(meta: pq.FileMetaData, batch_bytes: int | None = None) -> int:
    """Rows per batch for about ``batch_bytes`` decoded (default ``_BATCH_BYTES``), from the widest row group's
    mean row (the footer's uncompressed sizes): rows of large images come a few at a time, text rows by the
    thousand. Small batches decode faster than large ones (they stay in the CPU's cache), and bound memory."""
    widest = max((_row_group_bytes(rg) / rg.num_rows for rg in map(meta.row_group, range(meta.num_row_groups))
                  if rg.num_rows), default=None)
    if widest == 0:  # rows of no stated size (a writer that leaves the sizes out): the old fixed batch
        return _UNSIZED_BATCH_ROWS
    batch_bytes = batch_bytes or _BATCH_BYTES
    return max(1, min(_MAX_BATCH_ROWS, int(batch_bytes // widest) if widest else _MAX_BATCH_ROWS))


def _row_group_bytes(rg: pq.RowGroupMetaData) -> int:
    return rg.total_byte_size or sum(rg.column(i).total_compressed_size for i in range(rg.num_columns))


class TableReader:
    """The schema and the record batches of one source; ``close()`` (or ``with``) releases the file.
    Parquet is read ``batch_rows`` rows at a time (None: as many as make about 8 MiB decoded)."""

    def __init__(self, src: TableSource, batch_rows: int | None = None):
        self.src = src
        self.rows: int | None = None  # known up front for Parquet (its footer)
        if src.kind == "parquet":
            self._pf = pq.ParquetFile(src.path, buffer_size=_READ_BUFFER, pre_buffer=False)
            self.schema = self._pf.schema_arrow
            self.rows = self._pf.metadata.num_rows
            self.batch_rows = batch_rows or batch_rows_for(self._pf.metadata)
            self._file = None
        else:
            self._file = pa.OSFile(str(src.path), "rb")
            try:
                self._ipc = pa.ipc.open_stream(self._file)  # what datasets writes
            except pa.ArrowInvalid:
                self._file.seek(0)
                self._ipc = pa.ipc.open_file(self._file)  # the random-access variant
            self.schema = self._ipc.schema
            self.batch_rows = 0  # Arrow files: their record batches as written

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.src.kind == "parquet":
            yield from self._pf.iter_batches(batch_size=self.batch_rows, use_threads=False)
        elif isinstance(self._ipc, pa.ipc.RecordBatchFileReader):
            for i in range(self._ipc.num_record_batches):
                yield self._ipc.get_batch(i)
        else:
            yield from self._ipc

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        else:
            self._pf.close()

    def __enter__(self) -> TableReader:
        return self

    def __exit__(self, *_) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Opened:
    """A source as ``stream`` opens it, before its batches: ``plan`` is what the caller's ``plan`` made of
    it; ``error`` is set instead when the file could not be opened or ``plan`` refused it (no batch follows)."""

    src: TableSource
    rows: int | None = None
    plan: object = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ReadFailed:
    """The source's batches stopped here (a damaged page): the batches before it stand."""

    error: BaseException


def _items(sources: list[TableSource], plan: Callable, batch_rows: int | None) -> Iterator:
    for src in sources:
        try:
            reader = TableReader(src, batch_rows)
        except (pa.ArrowException, OSError) as e:
            yield Opened(src, error=e)
            continue
        with reader:
            try:
                what = plan(reader.schema)
            except ReasonError as e:
                yield Opened(src, reader.rows, error=e)
                continue
            yield Opened(src, reader.rows, what)
            try:
                yield from reader.batches()
            except (pa.ArrowException, OSError) as e:
                yield ReadFailed(e)


@contextlib.contextmanager
def stream(sources: list[TableSource], plan: Callable[[pa.Schema], object], batch_rows: int | None = None,
           read_ahead: int = 2) -> Iterator[Iterator]:
    """Every source in turn: an ``Opened``, then (unless it carries an error) the source's record batches,
    a ``ReadFailed`` where they stop early. ``plan(schema)`` runs as each source opens and may refuse it with
    a ReasonError. With ``read_ahead`` a thread reads that many items ahead, across sources: the next file
    opens and decodes while the last batches of the one before are converted."""
    items = _items(sources, plan, batch_rows)
    if read_ahead <= 0:
        with contextlib.closing(items):
            yield items
        return
    ahead = _ReadAhead(items, read_ahead)
    try:
        yield iter(ahead)
    finally:  # the thread stops (and closes the file it reads) before the caller goes on
        ahead.close()
