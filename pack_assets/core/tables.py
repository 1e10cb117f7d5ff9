"""Tables `convert` reads: Parquet files, Arrow files, and folders of them (a Hugging Face Hub snapshot:
``<config>/train-0000N-of-0000M.parquet`` or ``data/<split>-*.parquet``; a ``datasets.save_to_disk``
folder: ``state.json`` naming its ``data-*.arrow`` files, or ``dataset_dict.json`` over split folders).

Rows are read a batch at a time (Parquet pages through a small read buffer, Arrow IPC record batches from
the file, no memory map), so a file is never whole in memory; with ``read_ahead`` a thread decodes the next
batches (pyarrow works without the GIL) while the caller converts the current one. ``save_to_disk``
folders are read with pyarrow alone: their ``.arrow`` files are Arrow IPC streams, so the ``datasets``
package is not needed.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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
        self._put(_DONE)

    def __iter__(self) -> Iterator:
        while (item := self._q.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class TableReader:
    """The schema and the record batches of one source; ``close()`` (or ``with``) releases the file.
    ``read_ahead``: how many batches a thread decodes ahead of the caller (0: none, read in the caller)."""

    def __init__(self, src: TableSource, batch_rows: int = 64, read_ahead: int = 2):
        self.src, self.batch_rows, self.read_ahead = src, batch_rows, read_ahead
        self.rows: int | None = None  # known up front for Parquet (its footer)
        self._ahead: _ReadAhead | None = None
        if src.kind == "parquet":
            self._pf = pq.ParquetFile(src.path, buffer_size=_READ_BUFFER, pre_buffer=False)
            self.schema = self._pf.schema_arrow
            self.rows = self._pf.metadata.num_rows
            self._file = None
        else:
            self._file = pa.OSFile(str(src.path), "rb")
            try:
                self._ipc = pa.ipc.open_stream(self._file)  # what datasets writes
            except pa.ArrowInvalid:
                self._file.seek(0)
                self._ipc = pa.ipc.open_file(self._file)  # the random-access variant
            self.schema = self._ipc.schema

    def _batches(self) -> Iterator[pa.RecordBatch]:
        if self.src.kind == "parquet":
            yield from self._pf.iter_batches(batch_size=self.batch_rows, use_threads=False)
        elif isinstance(self._ipc, pa.ipc.RecordBatchFileReader):
            for i in range(self._ipc.num_record_batches):
                yield self._ipc.get_batch(i)
        else:
            yield from self._ipc

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.read_ahead <= 0:
            return self._batches()
        self._ahead = _ReadAhead(self._batches(), self.read_ahead)
        return iter(self._ahead)

    def close(self) -> None:
        if self._ahead is not None:  # the thread stops before the file it reads closes
            self._ahead.close()
        if self._file is not None:
            self._file.close()
        else:
            self._pf.close()

    def __enter__(self) -> TableReader:
        return self

    def __exit__(self, *_) -> None:
        self.close()
