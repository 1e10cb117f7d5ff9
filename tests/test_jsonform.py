"""core/jsonform.py gives exactly what json.dumps(..., ensure_ascii=False) gives: its text, and whether a
record's text is that text (the scan's `record_exact`), on values and texts of every character class, number
and layout json treats apart."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pack_assets.core.jsonform import dumps, is_dumps_form

# characters escaped short, as \u00XX, or not at all (ASCII or not), and look-alikes of escapes
_CHARS = ["a", " ", '"', "\\", "\n", "\t", "\r", "\b", "\f", "\x00", "\x07", "\x0b", "\x1f", "\x7e", "\x7f", "\x80",
          "é", "\u2028", "中", "\U0001f600", "\\u", "u", "0"]
_STRING = st.lists(st.sampled_from(_CHARS), max_size=8).map("".join)
_SCALAR = st.one_of(_STRING, st.integers(-10**20, 10**20), st.floats(allow_nan=True), st.booleans(), st.none())
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(_STRING, inner, max_size=4)), max_leaves=12)


def _forms(value) -> list[str]:
    """The dumps form and texts of the same value that are not it (or are, when the two coincide)."""
    return [json.dumps(value, ensure_ascii=False), json.dumps(value), json.dumps(value, indent=1),
            json.dumps(value, separators=(",", ":"), ensure_ascii=False),
            json.dumps(value, ensure_ascii=False).replace("/", "\\/"),
            json.dumps(value, ensure_ascii=False).replace("\\n", "\\u000a").replace("\\u001f", "\\u001F"),
            " " + json.dumps(value, ensure_ascii=False)]


def _check(value) -> None:
    assert dumps(value) == json.dumps(value, ensure_ascii=False)
    assert dumps([value, 1.5]) == json.dumps([value, 1.5], ensure_ascii=False)
    for text in _forms(value):
        loaded = json.loads(text)
        assert is_dumps_form(text, loaded) == (json.dumps(loaded, ensure_ascii=False) == text), text


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_STRING, _VALUE, max_size=5))
def test_the_same_text_and_the_same_verdict_as_json_dumps(value):
    _check(value)


def test_records_in_and_out_of_the_dumps_form():
    rec = {"id": 7, "score": 0.25, "conversations": [{"from": "human", "value": "<image>\nwhat is 中文?"}],
           "path": "a/b.jpg", "nested": {"x": [1, 2.5, None, True, "tab\there"]}}
    text = json.dumps(rec, ensure_ascii=False)
    assert is_dumps_form(text, rec)
    ascii_rec = {k: v for k, v in rec.items() if k != "conversations"}
    assert is_dumps_form(json.dumps(ascii_rec), ascii_rec)  # ASCII values: both forms are the same text
    for other in (text.replace("0.25", "0.250"), text.replace('"id": 7', '"id": 6, "id": 7'),
                  text.replace("[1, 2.5", "[1,2.5"), json.dumps(rec),
                  json.dumps(rec, indent=2, ensure_ascii=False), text.replace("a/b", "a\\/b"),
                  text.replace("\\t", "\\u0009"), text + "\n", '{"a": -0}', '{"a": 1E2}', '{"a": 1e400}'):
        assert not is_dumps_form(other, json.loads(other)), other
    for same in ('{"a": NaN, "b": -Infinity}', '{"a": "\\u0001\\\\u"}', "{}", '{"a": {}, "b": []}',
                 '{"a": "\x7f\u2028"}', '{"a": -0.0}'):
        assert is_dumps_form(same, json.loads(same)), same
    _check(rec)


def test_what_json_refuses_it_refuses():
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"a": object()})
    assert dumps("a\n") == json.dumps("a\n", ensure_ascii=False) and dumps(1.0) == "1.0"
