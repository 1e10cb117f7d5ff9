"""The row shapes of the Hugging Face Hub's VLM datasets, and one row -> one record plus its image bytes.

Shapes (docs/formats.md cites the dataset cards and docs each one comes from):

- ``messages`` (TRL / HuggingFaceH4, e.g. llava-instruct-mix-vsft): ``messages`` (turns whose content is a
  list of typed parts ``{type: image|text, text, index}``) + ``images`` (list of ``{bytes, path}``);
- ``prompt_completion`` (TRL's conversational prompt-completion type): ``prompt`` + ``completion`` turns,
  their concatenation is the conversation; ``images`` as above;
- ``cauldron`` (The Cauldron, FineVision): ``images`` + ``texts`` (list of ``{user, assistant, source}``);
  the images go at the start of the first user turn;
- ``llava`` (LLaVA-OneVision-Data and the lmms-lab LLaVA sets): ``id``, ``image`` (one ``{bytes, path}``),
  ``conversations`` (``[{from, value}]`` with ``<image>`` markers), ``data_source``.

The record is what the scan reads (docs/formats.md): ``messages`` or ``conversations`` plus ``images``, the
names of the image members, in order; every other column is kept as it is, except binary ones that are not
images (listed in the report as dropped). An image is a ``{bytes, path}`` struct (``datasets``' Image
feature; a null ``bytes`` reads the file at ``path``), raw bytes, or a path string. Its member is the bytes
unchanged, named by the format the bytes are (``img0.png`` for PNG bytes, whatever ``path`` says).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from PIL import Image

from .media import probe_image
from .reasons import ReasonError

# names `--columns` can map (NAME=COLUMN): the columns each shape reads and the fields of a `texts` item
CANONICAL = ("messages", "prompt", "completion", "texts", "user", "assistant", "conversations", "images", "image")
_ITEM_FIELDS = ("user", "assistant")  # names of fields inside a `texts` item, not of columns
_UNSUPPORTED = ("audio", "audios", "video", "videos")  # media kinds a table row may hold that are not converted
# the record's conversation and media keys: a column of that name the shape does not read is dropped
_RECORD_KEYS = ("messages", "conversations", "conversation", "images", "image")
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"), (b"GIF89a", "gif"),
          (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))
_HEADER = 4096  # the header probe reads this much first, and the whole image only if that is not enough
_PIL_EXT = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff"}


@dataclass(frozen=True, slots=True)
class Shape:
    """How the rows of one table become records: which column holds what (actual column names)."""

    name: str
    turns: str  # the conversation column (``prompt`` for prompt_completion)
    images: str | None  # the image column, or None (text-only rows)
    single_image: bool  # the image column holds one image per row, not a list
    keep: tuple[str, ...]  # other columns, carried into the record as they are
    dropped: tuple[str, ...]  # binary columns that are not images, and a second conversation or image column
    unsupported: tuple[str, ...]  # audio/video columns: a row with a value there is refused
    completion: str = ""
    user: str = "user"
    assistant: str = "assistant"


def parse_columns(specs: list[str] | None) -> dict[str, str]:
    """``["images=photos", "texts=dialog,user=q"]`` -> ``{"images": "photos", ...}``; unknown names refused."""
    out: dict[str, str] = {}
    for spec in specs or []:
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, sep, column = item.partition("=")
            if not sep or not column.strip() or name.strip() not in CANONICAL:
                raise ValueError(f"--columns {item!r}: give NAME=COLUMN with NAME one of {', '.join(CANONICAL)}")
            out[name.strip()] = column.strip()
    return out


def _has_binary(t: pa.DataType) -> bool:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_binary(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_binary(t.value_type)
    return False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_one_image(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        names = {t.field(i).name for i in range(t.num_fields)}
        return "bytes" in names or "path" in names
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _struct_fields(t: pa.DataType) -> set[str]:
    """Field names of a list-of-struct column's items (empty for anything else)."""
    if not _is_list(t) or not pa.types.is_struct(t.value_type):
        return set()
    return {t.value_type.field(i).name for i in range(t.value_type.num_fields)}


def _image_column(schema: pa.Schema, col) -> tuple[str | None, bool]:
    for name in (col("images"), col("image")):
        if name in schema.names:
            t = schema.field(name).type
            if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_one_image(t.value_type):
                return name, False
            if _is_one_image(t):
                return name, True
    return None, False


def _is_text_or_list(t: pa.DataType) -> bool:
    return _is_list(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _images_elsewhere(schema: pa.Schema, columns: list[str]) -> list[str]:
    """Columns among ``columns`` that hold images (one or a list of ``{bytes, path}`` structs or raw bytes)."""
    out = []
    for name in columns:
        t = schema.field(name).type
        if (_is_one_image(t) and not pa.types.is_string(t) and not pa.types.is_large_string(t)) or \
                (_is_list(t) and _is_one_image(t.value_type) and _has_binary(t.value_type)):
            out.append(name)
    return out


def detect(schema: pa.Schema, mapping: dict[str, str] | None = None) -> Shape:
    """The shape of a table from its columns (after ``mapping``: canonical name -> column). Refused
    (``unknown_shape``, the detail says why): columns that match no shape, a ``--columns`` mapping to a column
    the table lacks, a conversation column that holds bytes (images inline in the turns' parts are not read),
    and images in a column the shape does not read (they would be lost: map it with ``--columns images=``)."""
    mapping = mapping or {}
    missing = sorted(f"{name}={column}" for name, column in mapping.items()
                     if name not in _ITEM_FIELDS and column not in schema.names)
    if missing:
        raise ReasonError("unknown_shape", f"--columns {', '.join(missing)}: no such column (columns: "
                          f"{', '.join(schema.names)})")
    shape = _detect(schema, mapping)
    if shape.images is None and (lost := _images_elsewhere(schema, list(shape.dropped))):
        raise ReasonError("unknown_shape", f"column(s) {', '.join(lost)} hold images the {shape.name} shape does "
                          f"not read; map the one to pack with --columns images={lost[0]}")
    return shape


def _detect(schema: pa.Schema, mapping: dict[str, str]) -> Shape:

    def col(name: str) -> str:
        return mapping.get(name, name)

    names, types = set(schema.names), {f.name: f.type for f in schema}
    shape = turns = completion = None
    if col("messages") in names and _is_list(types[col("messages")]):
        shape, turns = "messages", col("messages")
    elif col("prompt") in names and col("completion") in names and \
            _is_text_or_list(types[col("prompt")]) and _is_text_or_list(types[col("completion")]):
        shape, turns, completion = "prompt_completion", col("prompt"), col("completion")
    elif col("texts") in names and {col("user"), col("assistant")} <= _struct_fields(types[col("texts")]):
        shape, turns = "cauldron", col("texts")
    elif col("conversations") in names and _is_list(types[col("conversations")]):
        shape, turns = "llava", col("conversations")
    if shape is None:
        raise ReasonError("unknown_shape", f"columns {', '.join(schema.names)} match no known shape (map them with "
                          "--columns NAME=COLUMN)")
    if any(_has_binary(types[c]) for c in (turns, completion) if c):
        raise ReasonError("unknown_shape", f"{turns!r} holds bytes: images inside the turns' parts are not read")
    images, single = _image_column(schema, col)
    used = {turns, completion, images}
    unsupported = tuple(n for n in schema.names if n in _UNSUPPORTED and n not in used)
    rest = [n for n in schema.names if n not in used and n not in unsupported]
    dropped = tuple(n for n in rest if _has_binary(types[n]) or n in _RECORD_KEYS)
    return Shape(shape, turns, images, single, keep=tuple(n for n in rest if n not in dropped), dropped=dropped,
                 unsupported=unsupported,
                 completion=completion or "", user=col("user"), assistant=col("assistant"))


def _offsets(arr: pa.Array, wide: bool) -> list[int]:
    """A binary or list array's offsets from its buffer (``np.asarray(arr.offsets)`` would import pandas)."""
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=np.int64 if wide else np.int32)[arr.offset: arr.offset + len(arr) + 1].tolist()


def _binary_views(arr: pa.Array) -> list:
    """A binary array's cells as memoryviews of its Arrow buffer (None where null): the image bytes reach
    the shard without a copy in Python. Any other array (path strings): its values."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        return arr.to_pylist()  # path strings
    o = _offsets(arr, pa.types.is_large_binary(arr.type))
    data = arr.buffers()[2]
    mv = memoryview(data) if data is not None else memoryview(b"")
    null = arr.is_null().to_pylist() if arr.null_count else [False] * len(arr)
    return [None if null[i] else mv[o[i]:o[i + 1]] for i in range(len(arr))]


def _one_image_cells(arr: pa.Array) -> list:
    """Cells of a one-image-per-cell array: ``{"bytes", "path"}`` dicts for structs, else the value; None
    where the cell itself is null."""
    if not pa.types.is_struct(arr.type):
        return _binary_views(arr)
    fields = {arr.type.field(i).name: child for i, child in enumerate(arr.flatten())}
    data = _binary_views(fields["bytes"]) if "bytes" in fields else [None] * len(arr)
    paths = fields["path"].to_pylist() if "path" in fields else [None] * len(arr)
    null = arr.is_null().to_pylist() if arr.null_count else [False] * len(arr)
    return [None if null[i] else {"bytes": data[i], "path": paths[i]} for i in range(len(arr))]


def image_cells(column: pa.Array, single: bool) -> list:
    """Per row, the image column's value as ``row_record`` takes it (a list of images, or one image)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if single:
        return _one_image_cells(column)
    offsets = _offsets(column, pa.types.is_large_list(column.type))
    values = _one_image_cells(column.values)
    null = column.is_null().to_pylist() if column.null_count else [False] * len(column)
    return [None if null[i] else values[offsets[i]:offsets[i + 1]] for i in range(len(column))]


def batch_rows(shape: Shape, batch: pa.RecordBatch) -> list[dict]:
    """A record batch as row dicts; the image column's bytes stay in Arrow's buffers (memoryviews)."""
    if shape.images is None:
        return batch.to_pylist()
    rows = batch.drop_columns([shape.images]).to_pylist()
    for row, cell in zip(rows, image_cells(batch.column(shape.images), shape.single_image)):
        row[shape.images] = cell
    return rows


def image_ext(data) -> str:
    """The packed extension of image bytes (``bytes`` or a memoryview), from their format (never the name
    they came with); the header must read as the scan reads it, else ``bad_image``; a format we do not pack
    is ``unsupported_media``."""
    if not len(data):
        raise ReasonError("bad_image", "image is zero bytes")
    head = bytes(data[:_HEADER])
    ext = next((e for magic, e in _MAGIC if head.startswith(magic)), None)
    if ext is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        ext = "webp"
    if ext is None:
        try:
            with Image.open(io.BytesIO(bytes(data))) as im:
                fmt = im.format or "?"
        except Exception as e:  # Pillow's UnidentifiedImageError and friends
            raise ReasonError("bad_image", f"not an image Pillow can read ({type(e).__name__})") from None
        ext = _PIL_EXT.get(fmt)
        if ext is None:
            raise ReasonError("unsupported_media", f"image format {fmt} is not a packed image type")
    try:
        probe_image(head, ext)
    except Exception:
        try:
            probe_image(bytes(data), ext)
        except Exception as e:
            raise ReasonError("bad_image", f"{ext} header does not read: {type(e).__name__}: {e}") from None
    _check_end(data, ext)
    return ext


_END = {"jpg": b"\xff\xd9", "png": b"IEND"}  # the marker a complete file has near its end
_TAIL = 1 << 16
_NEAR_END = 64  # searched first: the marker is almost always there, and copying 64 KiB per image is not free


def _check_end(data, ext: str) -> None:
    """A truncated download (the bytes stop inside the image data) has a header that reads but no end marker:
    refused here, as the trainer's decoder would refuse it. Decoding every image to be sure costs far more
    than reading it; a file whose data is damaged but complete is not caught (docs/formats.md)."""
    if ext == "webp":
        declared = int.from_bytes(bytes(data[4:8]), "little") + 8
        if len(data) < declared:
            raise ReasonError("bad_image", f"webp is truncated: {len(data)} of {declared} bytes")
        return
    marker = _END.get(ext)
    if marker is None:
        return
    if marker in bytes(data[-_NEAR_END:]):
        return
    if bytes(data[-_TAIL:]).rfind(marker) < 0 and (len(data) <= _TAIL or bytes(data).rfind(marker) < 0):
        raise ReasonError("bad_image", f"{ext} has no end marker ({marker!r}): the file is truncated")


def _image_bytes(value, i: int, read_path: Callable[[str], bytes]) -> bytes:
    data, path = None, None
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = value
    elif isinstance(value, str):
        path = value
    if data is not None:
        return data
    if not path:
        raise ReasonError("missing_media", f"image {i} has neither bytes nor a path")
    return read_path(path)  # raises missing_media / remote_media


def _images(shape: Shape, row: dict, read_path) -> list[tuple[str, bytes]]:
    value = row.get(shape.images) if shape.images else None
    values = ([] if value is None else [value]) if shape.single_image else list(value or [])
    media = []
    for i, v in enumerate(values):
        data = _image_bytes(v, i, read_path)
        media.append((f"img{i}.{image_ext(data)}", data))
    return media


def _turn_list(value, role: str) -> list:
    if isinstance(value, str):  # TRL's standard (not conversational) prompt-completion
        return [{"role": role, "content": value}]
    return list(value or [])


def _cauldron_messages(shape: Shape, texts: list, n_images: int) -> list[dict]:
    messages = []
    for i, t in enumerate(texts):
        t = t or {}
        lead = [{"type": "image"} for _ in range(n_images)] if i == 0 else []
        messages.append({"role": "user", "content": [*lead, {"type": "text", "text": t.get(shape.user) or ""}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": t.get(shape.assistant) or ""}]})
    return messages


def row_record(shape: Shape, row: dict, read_path: Callable[[str], bytes]) -> tuple[dict, list[tuple[str, object]]]:
    """The record a row becomes and its image members ``[("img0.jpg", bytes), ...]``, or a ReasonError.
    ``read_path`` reads an image given by path (a ``{bytes: null, path}`` struct or a path column)."""
    for c in shape.unsupported:
        if row.get(c) not in (None, [], ""):
            raise ReasonError("unsupported_media", f"column {c!r} holds audio or video: convert reads neither "
                              "from tables")
    media = _images(shape, row, read_path)
    record = {k: row[k] for k in shape.keep}
    turns = row.get(shape.turns)
    if shape.name == "cauldron":
        if not turns:
            raise ReasonError("no_conversation", f"{shape.turns!r} is empty")
        record["messages"] = _cauldron_messages(shape, turns, len(media))
        sources = [t.get("source") for t in turns if isinstance(t, dict) and t.get("source") is not None]
        if sources and "source" not in record:  # The Cauldron's per-turn sub-dataset name
            record["source"] = sources[0] if len(set(sources)) == 1 else sources
    elif shape.name == "prompt_completion":
        record["messages"] = _turn_list(turns, "user") + _turn_list(row.get(shape.completion), "assistant")
    elif turns is None:
        raise ReasonError("no_conversation", f"{shape.turns!r} is null")
    else:
        record["messages" if shape.name == "messages" else "conversations"] = turns
    if media:
        record["images"] = [name for name, _ in media]
    return record, media
