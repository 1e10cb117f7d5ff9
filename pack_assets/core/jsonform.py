"""``json.dumps(value, ensure_ascii=False)``'s text and ``json.loads``' value, made faster where that is exact.

Encoding. ``JSONEncoder.encode`` builds a new C encoder on every call (and a dict for the cycle check, and two
Python frames around it): a fixed cost the scan paid twice per sample (the conversation, the record's test). The
encoder built here is the one ``encode`` builds for ``ensure_ascii=False``, without the cycle check: the same text
for any value without a cycle (a parsed record, the messages made from one). Where the strings are long (the
caller's hint, `long_strings` of the text read) a second one quotes each long string by orjson, whose quoting is
json's ``c_encode_basestring``'s for every string it accepts (it refuses a lone surrogate: that one goes to
json's) and runs several times faster on long ones; its call per string (a Python function's) costs more than
json's quoting of a short one, which is why a text of many short strings keeps json's quoting throughout.
Separators, numbers and the rest are json's C encoder's in both: orjson cannot write json's ``", "`` and
``": "`` layout, nor its floats (``1e-05``).

Decoding (`loads`, `loads_form`). orjson's value is json's for every text it accepts, but for integers beyond 64
bits, which it reads as floats (NaN, ``1e400`` and lone surrogates it refuses). So its value is kept where it has
no float (`_plain`), or where json's text of it is the very text read (`loads_form`: an integer beyond 64 bits
would be written as a float, and json reads back what it writes); every other text goes to json's own decoder:
the same value, types included, or the same error.

Without orjson installed, both are the stdlib's alone. tests/test_jsonform.py compares each with json's on values
and texts built to break them.
"""

from __future__ import annotations

import json
from json.encoder import c_encode_basestring, c_make_encoder

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the stdlib's paths give the same results
    orjson = None

_TEXT = json.JSONEncoder(ensure_ascii=False)  # json.dumps(x, ensure_ascii=False)'s encoder
_SCAN_ONCE = json.JSONDecoder().scan_once  # json.loads' decoder's: the value at an index and where it ends
_LONG_STRING = 64  # chars: a string quoted by orjson (below, json's C quoting is cheaper than the call)
_CHARS_PER_QUOTE = 32  # a text this long per '"' at least: its strings average 64 chars or more (`long_strings`)
_LONG_TEXT = 1024  # chars: a shorter text is not `long_strings`' (the count's cost, against what it could save)
_LEAVES = frozenset({str, int, bool, type(None)})
_DEPTH = 100  # `_plain` values nest no deeper (json's decoder recurses once per level, to Python's limit)


def _quote(s: str) -> str:
    """``c_encode_basestring(s)`` (json's quoting for ``ensure_ascii=False``), by orjson for a long string."""
    if len(s) < _LONG_STRING:
        return c_encode_basestring(s)
    try:
        return orjson.dumps(s).decode("utf-8")
    except TypeError:  # (orjson.JSONEncodeError) a lone surrogate, which json writes as it is
        return c_encode_basestring(s)


def _encoder(quote):
    """The C encoder ``JSONEncoder.iterencode`` makes for `_TEXT` (markers None: check_circular=False), quoting
    strings by ``quote``."""
    if c_make_encoder is None or c_encode_basestring is None:
        return None
    return c_make_encoder(None, _TEXT.default, quote, None, _TEXT.key_separator, _TEXT.item_separator,
                          _TEXT.sort_keys, _TEXT.skipkeys, _TEXT.allow_nan)


_ENCODE = _encoder(c_encode_basestring)
_ENCODE_LONG = _encoder(_quote) if orjson is not None else _ENCODE


def long_strings(text: str | bytes) -> bool:
    """Whether the JSON ``text``'s strings average 64 characters or more (a record of long conversation texts),
    by its length per quote mark: the hint `dumps` takes, for a value read from ``text`` or made from one."""
    if len(text) < _LONG_TEXT:  # (a short text: not worth its count, ~8 instructions a byte)
        return False
    return len(text) >= _CHARS_PER_QUOTE * text.count(b'"' if isinstance(text, bytes) else '"')


def dumps(value, long: bool = False) -> str:
    """``json.dumps(value, ensure_ascii=False)`` of a value without a cycle (one would recurse until Python's
    limit, not raise json's ValueError). ``long``: its strings are mostly long ones (`long_strings`), a hint for
    the fastest way to the same text."""
    if _ENCODE is None or type(value) not in (dict, list):  # (encode writes a top-level string by itself)
        return _TEXT.encode(value)
    return "".join((_ENCODE_LONG if long else _ENCODE)(value, 0))


def is_dumps_form(text: str, value, long: bool | None = None) -> bool:
    """``json.dumps(value, ensure_ascii=False) == text``, ``value`` being ``json.loads(text)`` (``long``:
    `long_strings(text)`, computed when not given)."""
    return dumps(value, long_strings(text) if long is None else long) == text


def _plain(value, depth: int = 0) -> bool:
    """``value`` (a dict or list) holds only dicts, lists, str, int, bool and None (these very types: no float),
    nested at most `_DEPTH` deep."""
    if depth > _DEPTH:
        return False
    for v in (value.values() if type(value) is dict else value):
        t = type(v)
        if t is dict or t is list:
            if not _plain(v, depth + 1):
                return False
        elif t not in _LEAVES:
            return False
    return True


def _fast(text: str, utf8: bytes | None):
    """orjson's value of the text, or None where it refuses it (a JSON null is no dict, list or leaf here)."""
    try:
        return orjson.loads(text if utf8 is None else utf8)
    except orjson.JSONDecodeError:
        return None


def _json_loads(text: str):
    """``json.loads(text)``: a document with no whitespace around it (json.dumps writes none) by the decoder's
    scanner straight away; anything else (whitespace, a BOM, bad JSON) by ``json.loads``, its value or its error."""
    try:
        value, end = _SCAN_ONCE(text, 0)
        if end == len(text):
            return value
    except (StopIteration, ValueError):  # (JSONDecodeError is a ValueError)
        pass
    return json.loads(text)


def _kept(value) -> bool:
    """orjson's value (not a dict) is json's: a list of `_plain` values, or a str, int or bool (None: refused)."""
    kind = type(value)
    return _plain(value) if kind is list else (kind in _LEAVES and value is not None)


def loads(text: str, utf8: bytes | None = None):
    """``json.loads(text)``: the same value, types included, or the same error. ``utf8``: ``text``'s UTF-8, when
    the caller holds it (orjson reads it; json's decoder reads ``text``)."""
    if orjson is not None:
        value = _fast(text, utf8)
        if _plain(value) if type(value) is dict else _kept(value):
            return value
    return _json_loads(text)


def loads_form(text: str, utf8: bytes | None = None, long: bool | None = None) -> tuple[object, bool]:
    """(``json.loads(text)``, and for a dict whether ``text`` is json.dumps(it, ensure_ascii=False): the scan's
    record and `record_exact`; False for any other value). The same value or the same error as json.loads.
    ``long``: `long_strings(text)`, computed when not given."""
    long = long_strings(text if utf8 is None else utf8) if long is None else long
    if orjson is not None:
        value = _fast(text, utf8)
        if type(value) is dict:
            try:  # text == json.dumps(value) reads back as value: it needs no other test (and json's decoder
                # recurses no deeper than the encoder did here, from fewer frames below)
                if is_dumps_form(text, value, long):
                    return value, True
            except RecursionError:
                pass
            else:
                if _plain(value):
                    return value, False
        elif _kept(value):
            return value, False
    value = _json_loads(text)
    return value, type(value) is dict and is_dumps_form(text, value, long)
