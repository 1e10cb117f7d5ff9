"""``json.dumps(value, ensure_ascii=False)``'s text with the C encoder built once, not once per call.

``JSONEncoder.encode`` builds a new C encoder on every call (and a dict for the cycle check, and two Python
frames around it): a fixed cost the scan paid twice per sample (the conversation, the record's test). The encoder
built here is the one ``encode`` builds for ``ensure_ascii=False``, without the cycle check: the same text for
any value without a cycle (a parsed record, the messages made from one). tests/test_jsonform.py compares it
with ``json.dumps`` on values built to break it.
"""

from __future__ import annotations

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
