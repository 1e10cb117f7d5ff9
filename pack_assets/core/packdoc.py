"""A pack document read back in the layout the writer gives it (core/write/jobs.py `pack_document`: the bytes
`json.dumps(doc, ensure_ascii=False)` gives), without parsing the conversations again: the audit compares each
packed conversation with the manifest's text, which the writer spliced in as is, where a parse of both cost
most of its time per sample.

`walk` follows the layout token by token: each key and separator must be the exact text there, each other
value is parsed in place (`JSONDecoder.raw_decode`), and the walk must end at the document's last byte; so
where it succeeds the bytes are one JSON document of exactly that shape, as `json.loads` would read it. A
conversation equal to the expected text at its place is that very JSON value (the manifest's text is the
scan's `json.dumps` of a list: valid JSON, and an array ends where its text ends); any other is parsed. Any
other layout returns None: the caller parses the document.

The expected text may be given as its `Digest` (sha256 of its UTF-8 and its length in characters): the text at
its place is then the one whose digest it is. The audit holds an output shard's digests, not its texts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import NamedTuple

_DECODE = json.JSONDecoder().raw_decode
# an entry's head as the writer gives it, read at once: an id with no escape (its text is its value, as the
# decoder reads a string with no backslash, quote or control character) and an integer token_len (the JSON
# number grammar's; the next byte, a comma, ends it). Any other head is walked value by value, as before.
_HEAD = re.compile(r'\{"sample_id": "([^"\\\x00-\x1f]*)", "token_len": -?(?:0|[1-9][0-9]*), "messages": ')


class Same:
    """A packed conversation whose text is the one expected: equal to the manifest's."""


SAME = Same()


class Digest(NamedTuple):
    """A text known by its sha256 (of its UTF-8) and its length in characters."""
    sha256: bytes
    chars: int


Expected = str | Digest | None  # a sample's conversation text, or its digest, as the manifest holds it


class _Layout(Exception):
    pass


def _expect(text: str, pos: int, literal: str) -> int:
    if not text.startswith(literal, pos):
        raise _Layout
    return pos + len(literal)


def _value(text: str, pos: int):
    try:
        return _DECODE(text, pos)
    except (ValueError, RecursionError):
        raise _Layout from None


def _same_end(text: str, pos: int, want: Expected, raw: memoryview | None) -> int | None:
    """Where the expected JSON text (an array or object) ends when it is the text at ``pos``, else None.
    ``raw``: the document's UTF-8 where each character is one byte (ASCII): a text's bytes hashed in place."""
    if isinstance(want, str):
        return pos + len(want) if want and want[0] in "[{" and text.startswith(want, pos) else None
    if want is not None and want.chars and text.startswith(("[", "{"), pos):
        end = pos + want.chars
        if hashlib.sha256(text[pos:end].encode("utf-8") if raw is None else raw[pos:end]).digest() == want.sha256:
            return end
    return None


def _sample(text: str, pos: int, expected: Callable[[object], Expected], messages: dict,
            raw: memoryview | None) -> int:
    """One entry of ``samples``: its id and messages into ``messages`` (SAME, or the value parsed)."""
    head = _HEAD.match(text, pos)
    if head is not None:
        sid, pos = head.group(1), head.end()
    else:
        sid, pos = _value(text, _expect(text, pos, '{"sample_id": '))
        _, pos = _value(text, _expect(text, pos, ', "token_len": '))
        pos = _expect(text, pos, ', "messages": ')
    end = _same_end(text, pos, expected(sid), raw) if isinstance(sid, str) else None
    if end is not None:
        value, pos = SAME, end
    else:
        value, pos = _value(text, pos)
    if not isinstance(sid, (str, int, float, bool, type(None))):
        raise _Layout  # an id no dict can key: the caller's parse reports what it reports
    messages[sid] = value  # (a repeated id: the last one, as a dict of the parsed samples keeps)
    _, pos = _value(text, _expect(text, pos, ', "media": '))
    _, pos = _value(text, _expect(text, pos, ', "source": '))
    if text.startswith(', "extra": ', pos):
        _, pos = _value(text, pos + len(', "extra": '))
    return _expect(text, pos, "}")


def walk(data: bytes, expected: Callable[[object], Expected]) -> tuple[dict, dict] | None:
    """(``_meta``, sample id -> its messages: SAME where the text is ``expected(sample id)``, else the parsed
    value) of a pack document in the writer's layout; None for any other bytes."""
    try:
        text = data.decode("utf-8")
        raw = memoryview(data) if len(text) == len(data) else None  # ASCII: a character's index is its byte's
        _, pos = _value(text, _expect(text, 0, '{"pack_id": '))
        _, pos = _value(text, _expect(text, pos, ', "media_type": '))
        pos = _expect(text, pos, ', "samples": [')
        messages: dict = {}
        if text.startswith("]", pos):
            pos += 1
        else:
            pos = _sample(text, pos, expected, messages, raw)
            while text.startswith(", ", pos):
                pos = _sample(text, pos + 2, expected, messages, raw)
            pos = _expect(text, pos, "]")
        meta, pos = _value(text, _expect(text, pos, ', "_meta": '))
        if _expect(text, pos, "}") != len(text) or not isinstance(meta, dict):
            return None
    except (_Layout, UnicodeDecodeError):
        return None
    return meta, messages
