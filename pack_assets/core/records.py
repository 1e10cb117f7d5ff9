"""Typed records that flow between stages, and the Arrow schemas they are stored with."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(slots=True)
class Member:
    """One tar member of a source sample: where its payload lies and what it hashes to. (Not frozen: the scan
    makes one per member, and a frozen dataclass's __init__ sets each field through object.__setattr__; nothing
    changes a Member after the scan made it.)"""

    sample_id: str
    name: str
    offset: int
    size: int
    sha256: str | None


@dataclass(slots=True)
class Sample:
    """One source sample as the manifest records it (ok or rejected)."""

    sample_id: str
    shard: str
    key: str
    media_type: str = "text"
    status: str = "ok"
    reason: str | None = None
    n_images: int = 0
    n_videos: int = 0
    json_member: str | None = None
    media_members: list[str] = field(default_factory=list)
    # normalized chat messages (JSON text) with one {"type": "image"|"video"} part per media item
    conversation: str | None = None
    # [[width, height], ...] in media order
    image_sizes: list[list[int]] = field(default_factory=list)
    # [{"frames", "fps", "width", "height", "duration"}, ...] in media order (JSON text)
    videos: str = "[]"
    members: list[Member] = field(default_factory=list)
    # members that are neither the record nor its media, in tar order: copied into the pack as they are
    extra_members: list[str] = field(default_factory=list)
    # the messages `conversation` was written from (not stored): a count in the process that scanned reads them
    messages: list[dict] | None = None
    # a .json record whose bytes are what json.dumps(json.loads(them), ensure_ascii=False) writes: the writer
    # copies them into the pack document as they are instead of parsing and dumping them again
    record_exact: bool | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    shard: str
    key: str | None
    reason: str
    detail: str
    stage: str = "manifest"


@dataclass(slots=True)
class SourceRef:
    """One sub-sample of a pack, as its ``_meta`` names it: where it came from and which source members
    (``{"name", "offset", "size", "sha256"}``, plus ``"output_name"`` for media and extras) it copied."""

    sample_id: str
    shard: str
    key: str
    json_member: dict | None
    media: list[dict]
    extra: list[dict] = field(default_factory=list)
    # a piece of a split sample (core/split.py, `piece_meta`): its source sample and turn ranges
    split: dict | None = None

    def as_dict(self) -> dict:
        d = {"sample_id": self.sample_id, "shard": self.shard, "key": self.key, "json_member": self.json_member,
             "media": self.media}
        if self.extra:  # only when present, so packs without extras keep their bytes
            d["extra"] = self.extra
        if self.split:
            d["split"] = self.split
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SourceRef:
        return cls(d["sample_id"], d["shard"], d["key"], d["json_member"], d["media"], d.get("extra", []),
                   d.get("split"))


@dataclass(slots=True)
class PackMeta:
    """A packed sample's ``_meta``: the plan row it realizes, its sources in order, and the run context
    (profile, settings, tool version, shard fingerprint) after them. ``as_dict`` is the JSON the writer
    stores, key for key and in order (`write.pack_document` writes that text without building the dict; a
    test compares the bytes): output shards stay byte-identical."""

    pack_id: str
    media_type: str
    sample_ids: list[str]
    sample_token_lens: list[int]
    total_token_len: int
    sources: list[SourceRef]
    context: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"pack_id": self.pack_id, "media_type": self.media_type, "sample_ids": self.sample_ids,
                "sample_token_lens": self.sample_token_lens, "total_token_len": self.total_token_len,
                "sources": [s.as_dict() for s in self.sources], **self.context}

    @classmethod
    def from_dict(cls, d: dict) -> PackMeta:
        fixed = ("pack_id", "media_type", "sample_ids", "sample_token_lens", "total_token_len", "sources")
        return cls(d["pack_id"], d["media_type"], d["sample_ids"], d["sample_token_lens"], d["total_token_len"],
                   [SourceRef.from_dict(s) for s in d["sources"]], {k: v for k, v in d.items() if k not in fixed})


# Bump when what the manifest records changes (columns or their meaning): an older manifest is then rescanned
# by the CLI and by new_shard_sensor alike, never misread.
MANIFEST_FORMAT = 4


@dataclass(slots=True)
class ShardInfo:
    shard: str
    path: str
    size: int
    mtime_ns: int
    status: str = "ok"  # ok | empty | rejected | truncated
    n_samples: int = 0
    n_ok: int = 0
    n_rejected: int = 0
    n_members: int = 0
    n_meta_members: int = 0
    seconds: float = 0.0
    manifest_format: int = MANIFEST_FORMAT


@dataclass(slots=True)
class Scanned:
    """A shard's scan as this process wrote it (run_manifest's `keep`): its ShardInfo and its samples with their
    messages, so the count that follows in the same process takes them instead of reading and parsing the
    manifest back (core/counting/token_lengths.py, only while the manifest on disk is still this scan)."""

    info: ShardInfo | None = None
    samples: list[Sample] = field(default_factory=list)


# the Parquet files' columns, in order (a reader of a file finds them so; Arrow types as written)
_STR, _I32, _I64 = pa.string(), pa.int32(), pa.int64()
SAMPLES_SCHEMA = pa.schema([
    ("sample_id", _STR), ("shard", _STR), ("key", _STR), ("media_type", _STR), ("status", _STR), ("reason", _STR),
    ("n_images", _I32), ("n_videos", _I32), ("json_member", _STR), ("media_members", pa.list_(_STR)),
    ("conversation", _STR), ("image_sizes", pa.list_(pa.list_(_I64))), ("videos", _STR),
    ("extra_members", pa.list_(_STR)), ("record_exact", pa.bool_())])
MEMBERS_SCHEMA = pa.schema([("sample_id", _STR), ("name", _STR), ("offset", _I64), ("size", _I64), ("sha256", _STR)])
REJECTED_SCHEMA = pa.schema([("shard", _STR), ("key", _STR), ("reason", _STR), ("detail", _STR), ("stage", _STR)])
SHARDS_SCHEMA = pa.schema([
    ("shard", _STR), ("path", _STR), ("size", _I64), ("mtime_ns", _I64), ("status", _STR), ("n_samples", _I64),
    ("n_ok", _I64), ("n_rejected", _I64), ("n_members", _I64), ("n_meta_members", _I64), ("seconds", pa.float64()),
    ("manifest_format", _I32)])
TOKEN_LENGTHS_SCHEMA = pa.schema([
    ("sample_id", _STR), ("shard", _STR), ("media_type", _STR), ("text_tokens", _I64), ("image_tokens", _I64),
    ("video_tokens", _I64), ("total_tokens", _I64), ("n_images", _I32), ("n_videos", _I32), ("vision_tokens", _I64),
    ("media_bytes", _I64), ("profile", _STR), ("status", _STR), ("reason", _STR),
    ("counted_by", _STR),  # "fast" (a header-only rule) or "processor" (the model's own processor)
])
