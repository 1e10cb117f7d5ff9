"""The audit's walk of a pack document in the writer's layout (core/packdoc.py): what it says is what
`json.loads` says, a conversation is taken as the manifest's only where its text is, and any other layout is
left to the parse."""

from __future__ import annotations

import hashlib
import json

import pytest

from pack_assets.core import packdoc
from pack_assets.core.write.jobs import PackJob, SubSample, pack_document

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is \"this\"? é"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}]


def _document(sids=("s/0", "s/1"), extra: bool = False) -> tuple[bytes, dict[str, str]]:
    """A pack document as the writer makes it, and the manifest's conversation text per sample."""
    media = [{"name": "0.jpg", "offset": 512, "size": 3, "sha256": "ab"}]
    subs = [SubSample(sample_id=sid, shard="part-0", key=sid, source_path="/in/part-0.tar", token_len=7,
                      messages=None, json_member={"name": f"{i}.json", "offset": 0, "size": 2, "sha256": "cd"},
                      media=media, extra=[{"name": "0.txt", "offset": 9, "size": 1, "sha256": "ef"}] if extra else [],
                      messages_json=json.dumps(MESSAGES, ensure_ascii=False))
            for i, sid in enumerate(sids)]
    body, _ = pack_document(PackJob("p1", "image", 14, subs), {"tool": "pack_assets"},
                            [json.dumps({"conversations": [{"from": "human", "value": "x"}]}).encode()] * len(subs))
    return body, {sid: json.dumps(MESSAGES, ensure_ascii=False) for sid in sids}


def test_the_walk_reads_what_json_loads_reads():
    for extra in (False, True):
        body, conversations = _document(extra=extra)
        meta, messages = packdoc.walk(body, conversations.get)
        doc = json.loads(body)
        assert meta == doc["_meta"] and set(messages) == {"s/0", "s/1"}
        assert all(m is packdoc.SAME for m in messages.values())
        # an expected text other than the packed one: the packed value itself, parsed
        _, messages = packdoc.walk(body, dict.fromkeys(conversations, json.dumps(MESSAGES[:1])).get)
        assert [messages[s["sample_id"]] for s in doc["samples"]] == [s["messages"] for s in doc["samples"]]
    empty = json.dumps({"pack_id": "p", "media_type": "text", "samples": [], "_meta": {"sources": []}}).encode()
    assert packdoc.walk(empty, {}.get) == ({"sources": []}, {})


def _digest(text: str) -> packdoc.Digest:
    """The audit's expectation of a text as DuckDB gives it: unhex(sha256(text)), length(text)."""
    import duckdb

    with duckdb.connect() as con:
        return packdoc.Digest(*con.execute("SELECT unhex(sha256(?)), length(?)", [text, text]).fetchall()[0])


def test_a_conversation_known_by_its_digest_is_the_manifests_only_where_its_text_is():
    """The audit holds each conversation's digest (DuckDB's, of the text the scan stored), not its text: the
    walk takes the packed text as the manifest's exactly where the text expected would have been taken, non-ASCII
    text included (a length in characters, as Python's)."""
    body, conversations = _document(sids=("s/0", "s/1", "é/ü"))
    digests = {sid: _digest(text) for sid, text in conversations.items()}
    assert packdoc.walk(body, digests.get) == packdoc.walk(body, conversations.get)
    assert all(m is packdoc.SAME for m in packdoc.walk(body, digests.get)[1].values())
    other = json.dumps(MESSAGES[:1], ensure_ascii=False)
    for wrong in (_digest(other), packdoc.Digest(_digest(other).sha256, len(conversations["s/0"])),
                  packdoc.Digest(digests["s/0"].sha256, digests["s/0"].chars - 1)):
        _, messages = packdoc.walk(body, dict.fromkeys(conversations, wrong).get)
        assert [messages[s["sample_id"]] for s in json.loads(body)["samples"]] == [MESSAGES] * 3


def test_every_sample_head_reads_as_json_loads_reads_it():
    """The head read at once (an id without escapes, an integer token_len) and every other head, walked value by
    value, give the ids and messages the parse gives."""
    for sids in (("s/0", "s/1"), ('a"quote', "back\\slash", "tab\there", "é/ü"), ("s/0", "s/0")):
        body, conversations = _document(sids=sids)
        for text in (body, body.replace(b'"token_len": 7,', b'"token_len": 7.0,'),
                     body.replace(b'"token_len": 7,', b'"token_len": -0,')):
            meta, messages = packdoc.walk(text, conversations.get)
            doc = json.loads(text)
            assert meta == doc["_meta"] and set(messages) == {s["sample_id"] for s in doc["samples"]}
            assert all(m is packdoc.SAME for m in messages.values())
    body, conversations = _document(sids=("s/0",))
    quoted = body.replace(b'"token_len": 7,', b'"token_len": "7",')  # JSON, another head: walked value by value
    assert packdoc.walk(quoted, conversations.get) == (json.loads(quoted)["_meta"], {"s/0": packdoc.SAME})
    spaced = body.replace(b'"token_len": 7,', b'"token_len": 7 ,')  # JSON, not the writer's layout
    assert packdoc.walk(spaced, conversations.get) is None
    for broken in (body.replace(b'"token_len": 7,', b'"token_len": 07,'),  # not JSON: left to the parse
                   body.replace(b'"sample_id": "s/0"', b'"sample_id": "s/\x01"', 1)):
        with pytest.raises(ValueError):
            json.loads(broken)
        assert broken != body and packdoc.walk(broken, conversations.get) is None


def test_any_other_layout_is_left_to_the_parse():
    body, conversations = _document()
    doc = json.loads(body)
    for other in (json.dumps(doc, indent=1), json.dumps(doc, ensure_ascii=True) + " ",
                  json.dumps({**doc, "more": 1}), json.dumps({k: doc[k] for k in reversed(list(doc))})):
        assert packdoc.walk(other.encode(), conversations.get) is None
    assert packdoc.walk(body[:-1], conversations.get) is None  # cut short
    assert packdoc.walk(body + b"x", conversations.get) is None
    assert packdoc.walk(b"\xff" + body, conversations.get) is None


def test_a_conversation_elsewhere_in_the_document_does_not_pass_for_the_packed_one():
    """A record (``source``) that holds a sample entry with the expected conversation: the packed messages
    are still the ones at the sample's own place."""
    body, conversations = _document(sids=("s/0",))
    doc = json.loads(body)
    stale = [{"role": "user", "content": [{"type": "text", "text": "old"}]}]
    fake = {"sample_id": "s/0", "token_len": 7, "messages": MESSAGES, "media": [], "source": None}
    doc["samples"][0].update(messages=stale, source=fake)
    _, messages = packdoc.walk(json.dumps(doc, ensure_ascii=False).encode(), conversations.get)
    assert messages == {"s/0": stale}


def test_a_document_whose_meta_is_not_an_object_is_refused_not_crashed_on():
    # the audit turns these errors into a bad_json row (audit._check_pack); a list _meta once reached meta.get
    from pack_assets.core.audit import _read_doc

    for doc in (b'{"_meta": [1, 2], "samples": []}', b'[1]', b'{"samples": []}'):
        with pytest.raises((TypeError, AttributeError, KeyError)):
            _read_doc(doc, {})


ASCII_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]


def _ascii_document(records: list[bytes], extra: bool = False) -> tuple[bytes, dict]:
    media = [{"name": "0.jpg", "offset": 512, "size": 3, "sha256": "ab"}]
    subs = [SubSample(sample_id=f"s/{i}", shard="part-0", key=f"s/{i}", source_path="/in/part-0.tar", token_len=7,
                      messages=None, json_member={"name": f"{i}.json", "offset": 0, "size": 2, "sha256": "cd"},
                      media=media, extra=[{"name": "0.txt", "offset": 9, "size": 1, "sha256": "ef"}] if extra else [],
                      messages_json=json.dumps(ASCII_MESSAGES)) for i in range(len(records))]
    body, _ = pack_document(PackJob("p1", "image", 7 * len(subs), subs), {"tool": "pack_assets"}, records)
    return body, {f"s/{i}": json.dumps(ASCII_MESSAGES) for i in range(len(records))}


def _deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


def test_a_record_whatever_it_holds_is_read_as_json_loads_reads_it():
    """A record holding the layout's own texts (in a string, as a nested entry, an ``extra`` key), nested deep,
    or with numbers beyond 64 bits, NaN or infinity: the walk reads the document as `json.loads` does, or leaves it
    to the parse; ASCII and not (a conversation's digest compared on its bytes in place, or on its text's)."""
    entry = {"sample_id": "s/1", "token_len": 7, "messages": MESSAGES, "media": [], "source": None}
    holds = [{"text": '}, {"sample_id": "s/1", "token_len": 7, "messages": '}, {"text": '}], "_meta": {'},
             {"x": [{"a": 1}, entry]}, {"extra": ["0.txt"], "y": [{"b": 2}], "extra2": {"extra": 1}},
             {"d": _deep(400)}, {"d": _deep(600)}, {"n": 18446744073709551617}, {"n": -9223372036854775809},
             {"f": 1e400}, {"f": float("nan")}, {"u": "é ü 😀"}, [], {}, [[]], "a string", None]
    for hold in holds:
        for extra in (False, True):
            records = [json.dumps(hold).encode(), json.dumps({"conversations": [hold]}).encode()]
            body, conversations = _ascii_document(records, extra)
            doc = json.loads(body)
            walked = packdoc.walk(body, conversations.get)
            assert walked is not None, hold
            digests = {sid: packdoc.Digest(hashlib.sha256(t.encode()).digest(), len(t))
                       for sid, t in conversations.items()}
            assert packdoc.walk(body, digests.get) == walked
            assert walked[0] == doc["_meta"] or repr(walked[0]) == repr(doc["_meta"])  # (nan != nan)
            assert walked[1] == {"s/0": packdoc.SAME, "s/1": packdoc.SAME}
    # a record cut: not JSON, left to the parse as before
    body, conversations = _ascii_document([b'{"a": [1, 2]}', b'{"b": {"c": "}, {"}}'])
    cut = body.replace(b'"c": "}, {"', b'"c": "}, {', 1)
    assert cut != body and packdoc.walk(cut, conversations.get) is None


def test_an_ascii_documents_conversation_known_by_its_digest_is_compared_on_its_bytes_as_on_its_text():
    """An ASCII document (each character one byte): a conversation's digest is compared on the document's bytes in
    place; the walk says what it says where the text is hashed (a non-ASCII document), and what the texts say."""
    records = [json.dumps({"conversations": [{"from": "human", "value": "x"}]}).encode()] * 3
    body, conversations = _ascii_document(records)
    assert body.isascii()
    digests = {sid: _digest(text) for sid, text in conversations.items()}
    assert packdoc.walk(body, digests.get) == packdoc.walk(body, conversations.get)
    assert all(m is packdoc.SAME for m in packdoc.walk(body, digests.get)[1].values())
    other = json.dumps(ASCII_MESSAGES[:1] + [{"role": "assistant"}])
    for wrong in (_digest(other), packdoc.Digest(digests["s/0"].sha256, digests["s/0"].chars - 1),
                  packdoc.Digest(digests["s/0"].sha256, digests["s/0"].chars + 1)):
        _, messages = packdoc.walk(body, dict.fromkeys(conversations, wrong).get)
        assert list(messages.values()) == [ASCII_MESSAGES] * 3
