"""The audit's checks of one pack's sources and members (core/packchecks.py): the one-pass `clean_counts` gives a
pack's counts only where `check_current` and `check_media` find nothing, and the same counts they give; and the
walk of a pack document (core/packdoc.py) reads each record as json's parse does, whatever the record holds (the
layout's own texts, deep nesting, numbers other readers read otherwise)."""

from __future__ import annotations

import copy
import hashlib
import json

from pack_assets.core import packchecks, packdoc
from pack_assets.core.results import AuditResult
from pack_assets.core.write.jobs import PackJob, SubSample, pack_document


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pack():
    """A clean pack of two samples (one with an extra member): parts, _meta, packed messages, the manifest's rows."""
    parts = {"json": b"{}", "s000_00.jpg": b"jpeg0", "s001_00.jpg": b"jpeg1", "s001_x00.txt": b"txt"}
    sources = [{"sample_id": "a", "json_member": {"name": "a.json", "sha256": "ja"},
                "media": [{"name": "a.jpg", "output_name": "p1.s000_00.jpg", "sha256": _sha(b"jpeg0")}]},
               {"sample_id": "b", "json_member": {"name": "b.json", "sha256": "jb"},
                "media": [{"name": "b.jpg", "output_name": "p1.s001_00.jpg", "sha256": _sha(b"jpeg1")}],
                "extra": [{"name": "b.txt", "output_name": "p1.s001_x00.txt", "sha256": _sha(b"txt")}]}]
    samples = {"a": (5, "image", 1, 0, "a.json", None, ["a.jpg"], ()),
               "b": (5, "image", 1, 0, "b.json", None, ["b.jpg"], ["b.txt"])}
    members = {("a", "a.json"): ("ja", 2), ("a", "a.jpg"): (_sha(b"jpeg0"), 5),
               ("b", "b.json"): ("jb", 2), ("b", "b.jpg"): (_sha(b"jpeg1"), 5), ("b", "b.txt"): (_sha(b"txt"), 3)}
    return parts, {"sources": sources}, {"a": packdoc.SAME, "b": packdoc.SAME}, samples, members


def _faults():
    """Each one change to the clean pack, made in place on (parts, meta, packed, samples, members)."""
    def src(meta, i):
        return meta["sources"][i]
    return {
        "clean": lambda *a: None,
        "media byte": lambda p, m, k, s, mb: p.update({"s000_00.jpg": b"jpegX"}),
        "media cut": lambda p, m, k, s, mb: p.update({"s000_00.jpg": b"jpeg"}),
        "missing part": lambda p, m, k, s, mb: p.pop("s001_00.jpg"),
        "extra part": lambda p, m, k, s, mb: p.update({"s009_00.jpg": b"more"}),
        "meta sha": lambda p, m, k, s, mb: src(m, 0)["media"][0].update(sha256="00"),
        "meta sha empty": lambda p, m, k, s, mb: src(m, 0)["media"][0].update(sha256=""),
        "member renamed": lambda p, m, k, s, mb: src(m, 1)["media"][0].update(name="c.jpg"),
        "extra renamed": lambda p, m, k, s, mb: src(m, 1)["extra"][0].update(name="c.txt"),
        "extra dropped": lambda p, m, k, s, mb: src(m, 1).pop("extra"),
        "record renamed": lambda p, m, k, s, mb: src(m, 0)["json_member"].update(name="z.json"),
        "record stale": lambda p, m, k, s, mb: src(m, 0)["json_member"].update(sha256="old"),
        "record unhashed": lambda p, m, k, s, mb: mb.update({("a", "a.json"): (None, 2)}),
        "no json member": lambda p, m, k, s, mb: src(m, 0).pop("json_member"),
        "messages differ": lambda p, m, k, s, mb: k.update(a=[{"role": "user"}]),
        "unknown sample": lambda p, m, k, s, mb: src(m, 0).update(sample_id="zz"),
        "no sample id": lambda p, m, k, s, mb: src(m, 0).pop("sample_id"),
        "unknown member": lambda p, m, k, s, mb: mb.pop(("a", "a.jpg")),
        "member size": lambda p, m, k, s, mb: mb.update({("a", "a.jpg"): (_sha(b"jpeg0"), 6)}),
        "source unhashed": lambda p, m, k, s, mb: mb.update({("a", "a.jpg"): (None, 5)}),
        "sample repeated": lambda p, m, k, s, mb: m["sources"].append(copy.deepcopy(src(m, 0))),
        "no sources": lambda p, m, k, s, mb: m.pop("sources"),
        "sources not a list": lambda p, m, k, s, mb: m.update(sources={"a": 1}),
        "short row": lambda p, m, k, s, mb: s.update(a=(5, "image")),
    }


def test_a_pack_counted_in_one_pass_is_one_the_two_checks_pass_with_the_same_counts():
    texts = {"a": json.dumps([{"role": "user"}]), "b": None}.get
    outcomes = set()
    for fault, change in _faults().items():
        parts, meta, packed, samples, members = _pack()
        change(parts, meta, packed, samples, members)
        fast = packchecks.clean_counts(parts, meta, packed, samples, members, {})
        res = AuditResult()
        try:
            packchecks.check_current(res, "o.tar", "p1", packed, meta, samples, members, lambda sid, _: texts(sid))
            counts = packchecks.check_media(res, "o.tar", "p1", parts, meta, members, {})
        except (KeyError, AttributeError, TypeError):  # the two raise: the one pass gives nothing to count
            assert fast is None, fault
            continue
        if res.violations:
            assert fast is None, fault
        else:  # (a packed conversation equal to the manifest's once parsed is left to the two checks)
            assert fast in (None, counts), fault
        outcomes.add((fault, fast is not None))
    assert ("clean", True) in outcomes and ("messages differ", False) in outcomes
    parts, meta, packed, samples, members = _pack()
    assert packchecks.clean_counts(parts, meta, packed, samples, members, {}) == {
        "media": 2, "media_bytes": 10, "extra": 1, "extra_bytes": 3}
    # a digest taken ahead (audit._hashed) is the one compared
    assert packchecks.clean_counts(parts, meta, packed, samples, members, {"s000_00.jpg": "00"}) is None


MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]


def _document(records: list[bytes], extra: bool = False) -> tuple[bytes, dict]:
    media = [{"name": "0.jpg", "offset": 512, "size": 3, "sha256": "ab"}]
    subs = [SubSample(sample_id=f"s/{i}", shard="part-0", key=f"s/{i}", source_path="/in/part-0.tar", token_len=7,
                      messages=None, json_member={"name": f"{i}.json", "offset": 0, "size": 2, "sha256": "cd"},
                      media=media, extra=[{"name": "0.txt", "offset": 9, "size": 1, "sha256": "ef"}] if extra else [],
                      messages_json=json.dumps(MESSAGES)) for i in range(len(records))]
    body, _ = pack_document(PackJob("p1", "image", 7 * len(subs), subs), {"tool": "pack_assets"}, records)
    return body, {f"s/{i}": json.dumps(MESSAGES) for i in range(len(records))}


def _deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


def test_each_record_ends_where_jsons_parse_ends_it_whatever_it_holds():
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
            body, conversations = _document(records, extra)
            doc = json.loads(body)
            walked = packdoc.walk(body, conversations.get)
            assert walked is not None, hold
            assert walked[0] == doc["_meta"] or repr(walked[0]) == repr(doc["_meta"])  # (nan != nan)
            assert walked[1] == {"s/0": packdoc.SAME, "s/1": packdoc.SAME}
    # a record cut: not JSON, left to the parse as before
    body, conversations = _document([b'{"a": [1, 2]}', b'{"b": {"c": "}, {"}}'])
    cut = body.replace(b'"c": "}, {"', b'"c": "}, {', 1)
    assert cut != body and packdoc.walk(cut, conversations.get) is None
