"""core/jsonform.py gives exactly what json.dumps(..., ensure_ascii=False) gives: its text, and whether a
record's text is that text (the scan's `record_exact`), on values and texts of every character class, number
and layout json treats apart."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pack_assets.core.jsonform import dumps, is_dumps_form, loads, loads_form, long_strings

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


# --- jsonform.loads, and dumps through orjson: the same as json's ----------------------------------------------

_ANY_CHAR = st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)  # surrogates included
_ODD_STRING = st.one_of(_STRING, st.text(_ANY_CHAR, max_size=12), st.text(_ANY_CHAR, min_size=60, max_size=200),
                        st.lists(st.sampled_from(_CHARS), min_size=60, max_size=120).map("".join))
_NUMBER = st.one_of(st.integers(-2**70, 2**70), st.integers(-2**63 - 2, -2**63 + 2), st.integers(2**64 - 2, 2**64 + 2),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-0.0, 1e-05, 1e16, 5e-324, 0.1]))
_ODD_VALUE = st.recursive(st.one_of(_ODD_STRING, _NUMBER, st.booleans(), st.none()),
                          lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                  st.dictionaries(_ODD_STRING, inner, max_size=4)), max_leaves=16)


def _same(a, b) -> bool:
    """Equal values of the same types all the way down (NaN equal to NaN, -0.0 not to 0.0), in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return (a != a and b != b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def _outcome(fn, *args):
    try:
        return "value", fn(*args)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return "error", (type(e), str(e))


def _assert_loads_as_json(text: str) -> None:
    """loads and loads_form give json.loads' value (types included) or its error, and loads_form the dumps-form
    verdict, with and without the text's UTF-8 at hand."""
    want = _outcome(json.loads, text)
    utf8 = text.encode("utf-8", "surrogatepass")
    for got in (_outcome(loads, text), _outcome(loads, text, utf8), _outcome(loads_form, text),
                _outcome(loads_form, text, utf8)):
        if want[0] == "value" and isinstance(got[1], tuple):
            exact = isinstance(want[1], dict) and json.dumps(want[1], ensure_ascii=False) == text
            assert got[1][1] is exact, (text, got, want)
            got = got[0], got[1][0]
        assert got[0] == want[0], (text, got, want)
        assert _same(got[1], want[1]) if want[0] == "value" else got[1] == want[1], (text, got, want)


def _texts(value) -> list[str]:
    out = [json.dumps(value, ensure_ascii=False), json.dumps(value), json.dumps(value, separators=(",", ":")),
           json.dumps(value, indent=2, ensure_ascii=False), " \n" + json.dumps(value) + "\r\t"]
    return out


@settings(max_examples=300, deadline=None)
@given(_ODD_VALUE)
def test_loads_gives_json_loads_value_with_its_types(value):
    for text in _texts(value):
        _assert_loads_as_json(text)


@settings(max_examples=300, deadline=None)
@given(_ODD_VALUE)
def test_dumps_gives_json_dumps_text_on_odd_values(value):
    for v in (value, [value], {"k": value}, {"k" * 70: [value, "x" * 70]}):
        want = json.dumps(v, ensure_ascii=False)
        assert dumps(v) == want and dumps(v, True) == want
        assert is_dumps_form(want, json.loads(want)) and is_dumps_form(want + " " * 3000, v) is False


_PIECES = list('{}[]:," \t\n\r\x0b\x0c\xa0\ufeff\\u0123456789.eE+-truefalsnNIiy\x00\x1f\x7f\u2028') + [
    "\ud800", "\udc00", "\\ud800", "\\udc00", "\\ud83d\\ude00", "9" * 19, "NaN", "Infinity", "1e400", "-0", '"a"']
_JSONISH = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)


@settings(max_examples=1500, deadline=None)
@given(_JSONISH)
def test_loads_gives_json_loads_value_or_error_on_any_text(text):
    _assert_loads_as_json(text)


@pytest.mark.parametrize("text", [
    '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"\\ud800\\u0041"', '"\ud800"', "NaN", "Infinity",
    "-Infinity", "[NaN]", '{"a": Infinity}', "18446744073709551615", "18446744073709551616", "-9223372036854775808",
    "-9223372036854775809", '{"id": 123456789012345678901234567890}', "[" + "9" * 5000 + "]", "1e400", "-1e400",
    "1e-400", "-0", "-0.0", "0e0", "-0e0", "1E5", "1.7976931348623159e308", '{"a": 1, "a": 2}',
    '{"a": 1, "b": 3, "a": 2}', "\ufeff{}", " {} ", "{}\n", "{}\x0c", "\x0b{}", "\xa0{}", "{}\u2028", '"a\x00b"',
    '"a\x1fb"', '"a\x7fb"', '"\u2028"', "01", "1.", ".5", "[1,]", '{"a":1,}', "", " ", '"\\/"', '{"":1}', "[1 , 2]",
    '"\\x"', "'a'", "True", "null", "[" * 50 + "]" * 50, "[" * 101 + "]" * 101, "[" * 1100 + "]" * 1100,
    "[" * 990 + "]" * 990, '{"a": [{"b": [' + "[" * 120 + "]" * 120 + "]}]}",
])
def test_loads_on_the_known_differences_of_the_two_decoders(text):
    """orjson reads each of these otherwise than json, or refuses it: loads gives json's value or error."""
    _assert_loads_as_json(text)


def test_dumps_every_character_as_json():
    """Each character alone, and every one in long strings (which orjson quotes in a long text), as json writes it."""
    chars = "".join(map(chr, range(0x110000)))
    for long in (False, True):
        assert dumps(list(chars), long) == json.dumps(list(chars), ensure_ascii=False)
        for at in range(0, len(chars), 0x1000):
            value = {chars[at:at + 80]: [chars[at:at + 0x1000], chars[at + 3:at + 70]]}
            assert dumps(value, long) == json.dumps(value, ensure_ascii=False), hex(at)


def test_dumps_on_values_orjson_writes_otherwise():
    class S(str):
        def __str__(self):
            return "S"

    class I(int):  # noqa: E742
        def __repr__(self):
            return "I"

    long = "x" * 100
    for value in ([1e-05, 1e16, long], [float("nan"), float("inf"), long], [2**64, -2**63 - 1, long],
                  [(1, 2), long], [S(long), S("a")], {S(long): I(3)}, {"a": {1: 2, long: None}},
                  [True, False, None, long], {long: "\ud800" + long}, {"k": long + "\udfff"}):
        assert dumps(value, True) == json.dumps(value, ensure_ascii=False), value


def test_long_strings_tells_a_conversation_from_many_short_strings():
    talk = json.dumps({"conversations": [{"from": "human", "value": "describe it " * 60}] * 2})
    tags = json.dumps({"tags": ["a", "bb", "ccc"] * 100, "text": "describe it " * 30})
    assert long_strings(talk) and long_strings(talk.encode())
    assert not long_strings(tags) and not long_strings('{"a": "' + "x" * 900 + '"}')
