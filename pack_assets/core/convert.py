"""Chat datasets -> WebDataset shards: ShareGPT / LLaVA / "messages" JSON or JSONL with media folders, and
Hugging Face tables (Parquet or Arrow files, Hub snapshot folders of them, ``datasets.save_to_disk``
folders) whose rows hold their images (core/tables.py reads them, core/hfshapes.py knows their shapes).

Each record or row becomes one sample keyed by its position among all inputs (`000000042`): `<key>.json`
(the record, its media named by the member names, and ``origin``: its file and position there) and its
media as `<key>.img0.jpg`, `<key>.vid0.mp4`, ... in the order the conversation uses them. Shards are written
with fixed tar headers, atomically, so the same input gives the same bytes. Records that cannot be converted
(media missing, remote, undecodable or of a kind we do not pack) are listed with a reason in
`<out>/convert_rejected.jsonl`, and so are table files that cannot be read or whose columns match no shape;
nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import hfshapes, tables
from .jsonrecords import iter_records
from .media import IMAGE_EXTS, VIDEO_EXTS
from .reasons import ReasonError
from .safety import mkstemp
from .shardsink import ShardSink

_IMAGE_KEYS = ("image", "image_url", "image_path")
_VIDEO_KEYS = ("video", "video_url", "video_path")
_AUDIO_FIELDS = ("audio", "audios")
_REMOTE = ("http://", "https://", "data:", "s3://", "gs://", "hf://")


def _part_ref(part: dict) -> tuple[str, str] | None:
    """(kind, path) of a typed content part that carries media, e.g. {"type": "image", "image": "a.jpg"};
    path "" for a part that gives only the kind (a placeholder for the record's media list)."""
    kind = part.get("type", "")
    is_image = kind in ("image", "image_url") or any(k in part for k in ("image", "image_url"))
    is_video = kind in ("video", "video_url") or any(k in part for k in ("video", "video_url"))
    if not (is_image or is_video):
        return None
    for k in (*(_IMAGE_KEYS if is_image else _VIDEO_KEYS), "path", "url", "value", "content"):
        v = part.get(k)
        if isinstance(v, dict):
            v = v.get("url") or v.get("path")
        if isinstance(v, str) and v:
            return ("image" if is_image else "video"), v
    return ("image" if is_image else "video"), ""


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]


@dataclass
class Converted:
    record: dict
    media: list[tuple[str, Path]]  # (member part name, source file)


def _locate(ref: str, roots: list[Path]) -> Path:
    if ref.startswith("file://"):
        ref = ref[len("file://"):]
    if Path(ref).is_absolute():
        return Path(ref)
    for root in roots:
        if (root / ref).is_file():
            return root / ref
    return roots[0] / ref


def _inline_refs(rec: dict) -> list[tuple[str, str, dict]]:
    """Media named inside typed parts (kind, path, the part); kind-only parts name nothing."""
    refs = []
    for turns in (rec.get("messages"), rec.get("conversations")):
        for turn in turns or []:
            content = turn.get("content") if isinstance(turn, dict) else None
            for part in content if isinstance(content, list) else []:
                ref = _part_ref(part) if isinstance(part, dict) else None
                if ref and ref[1]:
                    refs.append((*ref, part))
    return refs


def convert_record(rec, roots: list[Path]) -> Converted:
    """The record with its media resolved to files and renamed to member parts (or a ReasonError)."""
    if not isinstance(rec, dict):
        raise ReasonError("not_an_object", f"record is a {type(rec).__name__}")
    if any(rec.get(f) for f in _AUDIO_FIELDS):
        raise ReasonError("unsupported_media", "audio is not packed")
    rec = copy.deepcopy(rec)
    refs: list[tuple[str, str, dict | None]] = _inline_refs(rec)
    if not refs:  # LLaVA / LLaMA-Factory / TRL fields; placeholders (or kind-only parts) in the turns
        refs = [("image", p, None) for p in _as_list(rec.pop("image", None)) + _as_list(rec.pop("images", None))]
        refs += [("video", p, None) for p in _as_list(rec.pop("video", None)) + _as_list(rec.pop("videos", None))]
    media: list[tuple[str, Path]] = []
    names: dict[str, list[str]] = {"image": [], "video": []}
    for kind, ref, part in refs:
        if not ref or ref.startswith(_REMOTE):
            raise ReasonError("remote_media", f"{kind} {ref[:80]!r} is not a local file")
        path = _locate(ref, roots)
        if not path.is_file():
            raise ReasonError("missing_media", f"{kind} file {str(path)!r} does not exist")
        ext = path.suffix.lower().lstrip(".")
        if ext not in (IMAGE_EXTS if kind == "image" else VIDEO_EXTS):
            raise ReasonError("unsupported_media",
                              f"{kind} {path.name!r}: extension .{ext} is not a packed {kind} type")
        name = f"{'img' if kind == 'image' else 'vid'}{len(names[kind])}.{ext}"
        names[kind].append(name)
        media.append((name, path))
        if part is not None:  # the typed part now names the member, not a path on this machine
            for k in list(part):
                if k != "type":
                    part.pop(k)
            part["type"] = kind
    rec.pop("audios", None)
    if names["image"]:
        rec["images"] = names["image"]
    if names["video"]:
        rec["videos"] = names["video"]
    for k in ("image", "video"):
        rec.pop(k, None)
    return Converted(rec, media)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ReasonError("missing_media", f"{str(path)!r} cannot be read: {e.strerror or e}") from None


def _path_reader(roots: list[Path]) -> Callable[[str], bytes]:
    """How a table's image given by path is read: local files only, relative ones under ``roots``."""
    def read(ref: str) -> bytes:
        if ref.startswith(_REMOTE):
            raise ReasonError("remote_media", f"image {ref[:80]!r} is not a local file; nothing is downloaded")
        return _read_bytes(_locate(ref, roots))
    return read


@dataclass
class FileReport:
    """One input file: which shape its rows were read as and what became of them."""

    file: str
    format: str  # json | parquet | arrow
    shape: str = ""  # json, or a table shape (core/hfshapes.py); "" when none matched
    rows: int = 0
    converted: int = 0
    rejected: int = 0
    columns_dropped: list[str] = field(default_factory=list)
    refused: str = ""  # a reason code when the file (or its rest) could not be read
    refused_detail: str = ""  # ... and what was found


class _Run:
    """Keys, the shard sink and the rejection log of one conversion."""

    def __init__(self, sink: ShardSink, rejected_out):
        self.sink, self.rejected_out = sink, rejected_out
        self.index = 0
        self.files: list[FileReport] = []
        self.reasons: Counter = Counter()

    def reject(self, rep: FileReport, index: int | None, rid, e: ReasonError) -> None:
        self.reasons[e.reason] += 1
        row = {"file": rep.file, "index": index, "id": rid, "reason": e.reason, "detail": e.detail}
        self.rejected_out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")

    def refuse(self, rep: FileReport, reason: str, detail: str) -> None:
        rep.refused, rep.refused_detail = reason, detail
        self.reject(rep, None, None, ReasonError(reason, detail))

    def add(self, rep: FileReport, rec, make: Callable) -> None:
        """One record or row -> one sample, or a rejection with its reason."""
        key = f"{self.index:09d}"
        self.index += 1
        rep.rows += 1
        try:
            record, media = make(rec)
        except (ReasonError, TypeError, AttributeError, KeyError) as e:  # a value of a type the shape did not expect
            rep.rejected += 1
            why = e if isinstance(e, ReasonError) else ReasonError("bad_row", f"{type(e).__name__}: {e}")
            self.reject(rep, rep.rows - 1, rec.get("id") if isinstance(rec, dict) else None, why)
            return
        record["origin"] = {"file": rep.file, "index": rep.rows - 1}
        members = [(f"{key}.json", _record_json(record))]
        members += [(f"{key}.{name}", data) for name, data in media]
        self.sink.add(members)
        rep.converted += 1


def _record_json(record: dict) -> bytes:
    """Standard JSON: a NaN or infinity (a float column's missing value) becomes null, as strict readers need."""
    try:
        text = json.dumps(record, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(record), ensure_ascii=False, default=str, allow_nan=False)
    return text.encode("utf-8")


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _convert_json(run: _Run, path: Path, roots: list[Path]) -> None:
    rep = FileReport(path.name, "json", "json")
    run.files.append(rep)

    def make(rec):
        c = convert_record(rec, roots)
        return c.record, [(name, _read_bytes(src)) for name, src in c.media]

    for rec in iter_records(path):
        run.add(rep, rec, make)


def _open_table(run: _Run, opened: tables.Opened, roots: list[Path]) -> tuple[FileReport, Callable | None]:
    """A table file's report, and how its rows become samples (None: refused, no row of it is read)."""
    rep = FileReport(opened.src.rel, opened.src.kind)
    run.files.append(rep)
    if isinstance(opened.error, ReasonError):
        rows = opened.rows if opened.rows is not None else "its"
        run.refuse(rep, opened.error.reason, f"{rows} rows not read: {opened.error.detail}")
        return rep, None
    if opened.error is not None:
        run.refuse(rep, "unreadable_file", f"{type(opened.error).__name__}: {opened.error}")
        return rep, None
    shape: hfshapes.Shape = opened.plan
    rep.shape, rep.columns_dropped = shape.name, list(shape.dropped)
    read = _path_reader([opened.src.path.parent, *roots])

    def make(row):
        return hfshapes.row_record(shape, row, read)

    def convert_batch(batch) -> None:
        for row in hfshapes.batch_rows(shape, batch):
            run.add(rep, row, make)

    return rep, convert_batch


def _convert_tables(run: _Run, sources: list[tables.TableSource], roots: list[Path], columns: dict,
                    batch_rows: int | None, read_ahead: int) -> None:
    """The files' rows in order; a file that cannot be opened, or whose columns match no shape, is refused
    whole, and one that breaks part way keeps the rows read before."""
    rep, convert_batch = None, None
    with tables.stream(sources, lambda schema: hfshapes.detect(schema, columns), batch_rows, read_ahead) as items:
        for item in items:
            if isinstance(item, tables.Opened):
                rep, convert_batch = _open_table(run, item, roots)
            elif isinstance(item, tables.ReadFailed):  # a damaged file: the rows before stay converted
                e = item.error
                run.refuse(rep, "unreadable_file", f"after {rep.rows} rows: {type(e).__name__}: {e}")
            else:
                convert_batch(item)


def _check_inputs(inputs: list[Path]) -> None:
    for path in inputs:
        if not path.exists():
            raise FileNotFoundError(f"input {path} does not exist")
        if path.is_dir() and not tables.find_sources(path):
            raise ValueError(f"{path} is a folder with no .parquet or .arrow file (nor a datasets save_to_disk "
                             "folder) under it; JSON records are given as files: --input FILE.json(l)")


def convert(inputs: list[Path], out_dir: Path, media_roots: list[Path] | None = None, samples_per_shard: int = 1000,
            max_shard_bytes: int = 1 << 30, prefix: str = "shard", columns: dict[str, str] | None = None,
            batch_rows: int | None = None, read_ahead: int = 2, background: bool = True) -> dict:
    """Convert every record and table row; relative media paths are looked up in each media root in turn
    (default: the input file's folder). ``columns`` maps shape names to a table's columns (``--columns``);
    a table is read ``batch_rows`` rows at a time (None: about 8 MiB of rows by the Parquet footer's sizes),
    a thread decoding ``read_ahead`` batches ahead, across the files of an input (0: none);
    with ``background`` another thread writes the shards while the next rows are converted.
    Returns counts per outcome, per input file (shape, rows, refusals) and the shard paths."""
    _check_inputs(inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    rejected_file = out_dir / "convert_rejected.jsonl"
    fd, tmp = mkstemp(prefix=".convert_rejected.tmp-", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as rejected_out, \
                ShardSink(out_dir, samples_per_shard, max_shard_bytes, prefix, background=background) as sink:
            run = _Run(sink, rejected_out)
            for path in inputs:
                roots = list(media_roots or []) or [path if path.is_dir() else path.parent]
                if tables.is_table_input(path):
                    _convert_tables(run, tables.find_sources(path), roots, columns or {}, batch_rows, read_ahead)
                else:
                    _convert_json(run, path, roots)
        os.replace(tmp, rejected_file)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return _summary(run, sink, rejected_file)


def _summary(run: _Run, sink: ShardSink, rejected_file: Path) -> dict:
    shapes: Counter = Counter()
    for f in run.files:
        if f.shape:
            shapes[f.shape] += f.rows
    converted = sum(f.converted for f in run.files)
    return {"records": run.index, "converted": converted, "rejected": run.index - converted,
            "reasons": dict(run.reasons), "shapes": dict(shapes), "shards": sink.shards,
            "files_refused": sum(1 for f in run.files if f.refused), "files": [asdict(f) for f in run.files],
            "rejected_file": str(rejected_file)}
