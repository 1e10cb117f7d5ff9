"""Over-long multi-turn samples split into pieces that fit (the ``overlong = "split"`` setting), at plan time.

A conversation is cut only where a user turn follows an assistant turn (a turn: a user message and everything
up to the next such cut, tool calls and their results included), so each piece ends with an assistant turn and
no tool call is parted from its result. A piece is the leading system message(s), the earlier turns it carries
as context (the most recent whole turns whose render, with the system message, takes at most ``split_context``
tokens; fewer when the piece would not fit otherwise), and its own new turns (as many as fit in the capacity).
Each piece is counted exactly: its messages rendered and counted by the profile's own counter, as a whole
sample is. Only the new turns train: the reader masks the carried ones (``context_messages``, core/labels.py).
A sample that cannot be split (one turn, with the system message, longer than the capacity; or a single turn)
is dropped with its length, as without the setting. Record-level ``tools`` ride on a piece's first message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import store
from .counting.counters import counter_for
from .counting.profiles import ModelProfile
from .reasons import ReasonError
from .settings import PlanConfig


@dataclass(frozen=True)
class Piece:
    """One piece of a split sample: the source's messages ``[:system] + [context_start:end]``; its own turns are
    ``[first_message:end_message]`` (source message indices, end exclusive), the ``context_messages`` before
    them are carried."""

    piece_id: str
    sample_id: str
    piece: int
    pieces: int
    system: int
    context_start: int
    first_message: int
    end_message: int
    conversation: str  # the piece's messages, JSON text as the manifest stores a conversation
    media_members: list[str]  # the source's media the piece's messages hold, images then videos
    extra_members: list[str]  # the source's extra members: on its first piece only (nothing is lost)
    total_tokens: int
    n_media: int
    vision_tokens: int
    media_bytes: int

    @property
    def context_messages(self) -> int:
        return self.system + self.first_message - self.context_start

    def meta(self) -> dict:
        return piece_meta(self.sample_id, self.piece, self.pieces, self.system, self.context_start,
                          self.first_message, self.end_message)


def piece_meta(source: str, piece: int, pieces: int, system: int, context_start: int, first: int, end: int) -> dict:
    """What a pack's ``_meta`` records of a piece (its entry in ``sources``, under ``split``): the source sample,
    which piece of how many, its own turns and the carried ones as source message ranges (end exclusive), the
    system messages kept, and how many leading messages of the piece are carried context (they do not train)."""
    return {"source": source, "piece": piece, "pieces": pieces, "turns": [first, end],
            "context": [context_start, first], "system": system, "context_messages": system + first - context_start}


# the catalog's split_pieces rows (store.SPLIT_PIECES_SCHEMA), in its column order
ROW_FIELDS = ("piece_id", "sample_id", "piece", "pieces", "system", "context_start", "first_message", "end_message",
              "context_messages", "total_tokens", "n_media", "vision_tokens", "media_members", "extra_members",
              "conversation")


def row(p: Piece) -> tuple:
    return tuple(getattr(p, f) for f in ROW_FIELDS)


def piece_id(sample_id: str, k: int) -> str:
    return f"{sample_id}#{k}"


def turns(messages: list[dict]) -> tuple[int, list[tuple[int, int]]]:
    """(leading system messages, each turn's message range): a cut before every user message that follows an
    assistant message; messages after the last assistant turn stay with it."""
    roles = [m.get("role") for m in messages]
    system = 0
    while system < len(roles) and roles[system] == "system":
        system += 1
    cuts = [i for i in range(system + 1, len(roles)) if roles[i] == "user" and roles[i - 1] == "assistant"]
    bounds = [system, *cuts, len(roles)]
    spans = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    if len(spans) > 1 and "assistant" not in roles[spans[-1][0]:spans[-1][1]]:
        spans[-2:] = [(spans[-2][0], spans[-1][1])]
    return system, spans


class _Source:
    """One source sample's messages and media, and the exact count of any piece of it (cached)."""

    def __init__(self, messages: list[dict], image_sizes: list, videos: list, count: Callable):
        self.messages, self.image_sizes, self.videos, self._count = messages, image_sizes, videos, count
        kinds = [[p.get("type") for p in m["content"]] if isinstance(m.get("content"), list) else []
                 for m in messages]
        self.images_before = np.cumsum([0] + [k.count("image") for k in kinds]).tolist()
        self.videos_before = np.cumsum([0] + [k.count("video") for k in kinds]).tolist()
        self.system = turns(messages)[0]
        self._cache: dict[tuple[int, int], dict | None] = {}

    def media(self, start: int, end: int) -> tuple[list[int], list[int]]:
        """Indices of the images and videos held by the system messages and messages [start:end]."""
        ranges = [(0, self.system), (start, end)]
        return ([i for a, b in ranges for i in range(self.images_before[a], self.images_before[b])],
                [i for a, b in ranges for i in range(self.videos_before[a], self.videos_before[b])])

    def piece_messages(self, start: int, end: int) -> list[dict]:
        out = self.messages[:self.system] + self.messages[start:end]
        first = self.messages[0]
        if out and "tools" in first and "tools" not in out[0]:  # the record's tools: on the first message
            out[0] = {**out[0], "tools": first["tools"]}
        return out

    def count(self, start: int, end: int) -> dict | None:
        """The counts of the piece [system] + [start:end], None when the counter refuses it."""
        if (start, end) not in self._cache:
            images, videos = self.media(start, end)
            got = next(iter(self._count([(self.piece_messages(start, end), [self.image_sizes[i] for i in images],
                                          [self.videos[i] for i in videos])])))
            self._cache[start, end] = None if isinstance(got, ReasonError) else got
        return self._cache[start, end]

    def tokens(self, start: int, end: int) -> float:
        got = self.count(start, end)
        return float("inf") if got is None else got["total_tokens"]


def cut(src: _Source, capacity: int, budget: int) -> list[tuple[int, int, int]] | None:
    """The pieces as (context start, first new message, end), greedily: each piece's context the most recent
    turns within ``budget`` (fewer if its first turn would not fit), then as many turns as fit; None when a
    turn does not fit even with no context, or the conversation is a single turn."""
    system, spans = turns(src.messages)
    if len(spans) < 2:
        return None
    out, u = [], 0
    while u < len(spans):
        first = spans[u][0]
        c = u
        while c > 0 and src.tokens(spans[c - 1][0], first) <= budget:
            c -= 1
        while src.tokens(spans[c][0], spans[u][1]) > capacity:  # (c == u: no carried turn)
            if c == u:
                return None
            c += 1
        start = spans[c][0]
        v = u + 1
        while v < len(spans) and src.tokens(start, spans[v][1]) <= capacity:
            v += 1
        out.append((start, first, spans[v - 1][1]))
        u = v
    return out


def split_sample(sample_id: str, conversation: str, image_sizes: list, videos: list, media_members: list[str],
                 extra_members: list[str], sizes: dict[str, int], count: Callable, config: PlanConfig
                 ) -> list[Piece] | None:
    """A source sample's pieces, or None when it cannot be split (it is then dropped as over-long).
    ``sizes``: member name -> bytes; ``count``: the profile's ``count_many``."""
    src = _Source(json.loads(conversation), image_sizes or [], videos or [], count)
    cuts = cut(src, config.capacity, config.split_context)
    if cuts is None:
        return None
    n_images = len(src.image_sizes)
    pieces = []
    for k, (start, first, end) in enumerate(cuts):
        images, vids = src.media(start, end)
        media = [media_members[i] for i in images] + [media_members[n_images + i] for i in vids]
        extra = list(extra_members or []) if k == 0 else []
        got = src.count(start, end)
        pieces.append(Piece(
            piece_id(sample_id, k), sample_id, k, len(cuts), src.system, start, first, end,
            json.dumps(src.piece_messages(start, end), ensure_ascii=False), media, extra, got["total_tokens"],
            len(media), got["image_tokens"] + got["video_tokens"], sum(sizes.get(n, 0) for n in media + extra)))
    return None if any(_over_caps(p, config) for p in pieces) else pieces


def _over_caps(piece: Piece, config: PlanConfig) -> bool:
    """A piece no pack could take for a per-pack cap: the sample is then dropped whole, never partly packed."""
    return bool(config.max_media_per_pack and piece.n_media > config.max_media_per_pack
                or config.max_vision_tokens_per_pack and piece.vision_tokens > config.max_vision_tokens_per_pack)


_SOURCES = """SELECT sample_id, conversation, image_sizes, videos, media_members, extra_members FROM manifest_samples
              WHERE sample_id IN (SELECT sample_id FROM ({asked})) ORDER BY sample_id"""
_SIZES = "SELECT sample_id, name, size FROM members WHERE sample_id IN (SELECT sample_id FROM ({asked}))"


def split_overlong(con, rows: dict[str, np.ndarray], config: PlanConfig, profile: ModelProfile
                   ) -> tuple[dict[str, np.ndarray], list[Piece]]:
    """`plan.ok_lengths`' rows with every over-long sample that splits replaced by its pieces (after the
    samples, in sample id order), and the pieces; those that do not split stay, for the planner to drop."""
    over = np.flatnonzero(rows["lengths"] > config.capacity)
    if config.overlong != "split" or not len(over):
        return rows, []
    ids = rows["sample_ids"][over].tolist()
    with store.columns_relation(con, "_overlong", [ids], pa.schema([("sample_id", pa.string())])) as asked:
        found = con.execute(_SOURCES.format(asked=asked)).fetchall()
        sizes: dict[str, dict[str, int]] = {}
        for sid, name, size in con.execute(_SIZES.format(asked=asked)).fetchall():
            sizes.setdefault(sid, {})[name] = size
    count = counter_for(profile).count_many
    pieces: list[Piece] = []
    split_ids = set()
    for sid, conv, image_sizes, videos, media, extra in found:
        got = split_sample(sid, conv, image_sizes, json.loads(videos or "[]"), media or [], extra,
                           sizes.get(sid, {}), count, config)
        if got is not None:
            pieces += got
            split_ids.add(sid)
    keep = np.asarray([sid not in split_ids for sid in rows["sample_ids"].tolist()], dtype=bool)
    media_type = dict(zip(ids, rows["media_types"][over].tolist()))
    added = {"sample_ids": [p.piece_id for p in pieces], "media_types": [media_type[p.sample_id] for p in pieces],
             "lengths": [p.total_tokens for p in pieces], "media_bytes": [p.media_bytes for p in pieces],
             "n_media": [p.n_media for p in pieces], "vision_tokens": [p.vision_tokens for p in pieces]}
    out = {k: np.concatenate([v[keep], np.asarray(added[k], dtype=v.dtype)]) for k, v in rows.items()}
    return out, pieces


def split_stats(pieces: list[Piece]) -> dict:
    """The plan's figures of the split: source samples split and the pieces they became."""
    return {"split": len({p.sample_id for p in pieces}), "split_pieces": len(pieces)}


def plan_checks(con) -> list[tuple[str, int, str]]:
    """(check, how many bad, detail) of the stored plan's split samples: every piece in a pack, and a split
    sample neither packed nor dropped whole. (No split sample: nothing to look up.)"""
    if not con.execute("SELECT EXISTS (SELECT 1 FROM split_pieces)").fetchone()[0]:
        return [("lost_sample", 0, ""), ("split_and_packed", 0, "")]
    unpacked, twice = con.execute(
        """SELECT (SELECT count(*) FROM split_pieces WHERE piece_id NOT IN (SELECT sample_id FROM pack_members)),
                  (SELECT count(DISTINCT sample_id) FROM split_pieces WHERE sample_id IN
                     (SELECT sample_id FROM pack_members UNION ALL SELECT sample_id FROM dropped))""").fetchone()
    return [("lost_sample", unpacked, f"{unpacked} piece(s) of split samples in no pack"),
            ("split_and_packed", twice, f"{twice} split sample(s) also packed or dropped whole")]
