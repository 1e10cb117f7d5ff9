"""``json.dumps(value, ensure_ascii=False)``'s text with the C encoder built once, not once per call.

``JSONEncoder.encode`` builds a new C encoder on every call (and a dict for the cycle check, and two Python
frames around it): a fixed cost the scan paid twice per sample (the conversation, the record's test). The encoder
built here is the one ``encode`` builds for ``ensure_ascii=False``, without the cycle check: the same text for
any value without a cycle (a parsed record, the messages made from one). tests/test_jsonform.py compares it
with ``json.dumps`` on values built to break it.
"""

from __future__ import annotations

import functools
import json
from json.encoder import c_encode_basestring, c_make_encoder

_TEXT = json.JSONEncoder(ensure_ascii=False)  # json.dumps(x, ensure_ascii=False)'s encoder
# the arguments JSONEncoder.iterencode passes for _TEXT (markers None: check_circular=False)
_ENCODE = c_make_encoder(None, _TEXT.default, c_encode_basestring, None, _TEXT.key_separator, _TEXT.item_separator,
                         _TEXT.sort_keys, _TEXT.skipkeys, _TEXT.allow_nan) \
    if c_make_encoder is not None and c_encode_basestring is not None else None


def dumps(value) -> str:
    """``json.dumps(value, ensure_ascii=False)`` of a value without a cycle (one would recurse until Python's
    limit, not raise json's ValueError)."""
    if _ENCODE is None or type(value) not in (dict, list):  # (encode writes a top-level string by itself)
        return _TEXT.encode(value)
    return "".join(_ENCODE(value, 0))


def is_dumps_form(text: str, value) -> bool:
    """``json.dumps(value, ensure_ascii=False) == text``, ``value`` being ``json.loads(text)``."""
    return dumps(value) == text


class SharedStrings:
    """``dumps`` and ``is_dumps_form`` of values that share strings (a sample's record, then the messages made
    from it, whose turns hold the record's own strings): each distinct string is escaped once until ``forget``.
    The escaping is per character (about half the scan's JSON time: docs/benchmarks.md, issue 41), and an
    escaped string is looked up by equality, so the text is the same as ``dumps``'s. ``forget`` between samples
    keeps only one sample's strings."""

    def __init__(self) -> None:
        self._escape = functools.lru_cache(maxsize=None)(c_encode_basestring) if _ENCODE is not None else None
        self._encode = c_make_encoder(None, _TEXT.default, self._escape, None, _TEXT.key_separator,
                                      _TEXT.item_separator, _TEXT.sort_keys, _TEXT.skipkeys, _TEXT.allow_nan) \
            if self._escape is not None else None

    def forget(self) -> None:
        if self._escape is not None:
            self._escape.cache_clear()

    def dumps(self, value) -> str:
        """``dumps(value)``."""
        if self._encode is None or type(value) not in (dict, list):
            return _TEXT.encode(value)
        return "".join(self._encode(value, 0))

    def is_dumps_form(self, text: str, value) -> bool:
        """``is_dumps_form(text, value)``."""
        return self.dumps(value) == text
