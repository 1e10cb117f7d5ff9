"""Over-long multi-turn samples split, not dropped (issue 36, item 3; core/split.py): pieces cut at assistant
turns, each counted exactly, traceable in `_meta`, only its own turns trained, and accounted for by the audit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import image_bytes, write_tar
from test_labels import _trained
from test_reasoning import oracle, processor_needed
from thinking_fixtures import thinking_folder

from pack_assets.core import store
from pack_assets.core.audit import run_audit
from pack_assets.core.counting.profiles import resolve_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.plan import PlanConfig, run_plan
from pack_assets.core.scan import run_manifest
from pack_assets.core.split import turns
from pack_assets.core.write import run_write

MAX_LEN = 320


def long_chat(n: int, system: bool = True, image_at: tuple[int, ...] = (0,)) -> dict:
    """A conversation of ``n`` user/assistant turns (~90 tokens each), images in the turns ``image_at``, a tool
    call in turn 1 (the cut keeps it with its result)."""
    msgs = [{"role": "system", "content": "Answer briefly."}] if system else []
    for i in range(n):
        text = f"Question {i}: " + "why " * 30
        msgs.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
                    if i in image_at else {"role": "user", "content": text})
        if i == 1:
            msgs += [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "look", "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "seen"}]
        msgs.append({"role": "assistant", "reasoning_content": f"Think {i}: " + "hmm " * 10,
                     "content": f"Answer {i}: " + "because " * 30})
    return {"messages": msgs}


def _members(key: str, record: dict, images: int) -> list[tuple[str, bytes | str]]:
    out: list[tuple[str, bytes | str]] = [(f"{key}.json", json.dumps(record))]
    out += [(f"{key}.{j}.png", image_bytes(56 + 28 * j, 56, "PNG")) for j in range(images)]
    return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict:
    """One shard: a short sample, a 6-turn sample with two images and extra members (split), a sample whose one
    turn is longer than max_len (dropped), planned with overlong split, written and audited."""
    root = tmp_path_factory.mktemp("split")
    huge = {"messages": [{"role": "user", "content": "x " * 400}, {"role": "assistant", "content": "y"},
                         {"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]}
    members = [*_members("a", long_chat(1, image_at=()), 0),
               *_members("b", long_chat(6, image_at=(0, 4)), 2), ("b.txt", "note"),
               *_members("c", huge, 0)]
    write_tar(root / "in" / "s.tar", members)
    work, out = root / "work", root / "out"
    # a thinking template (Qwen3.6: reasoning of turns before the last user query is dropped), so a piece's count
    # is not the sum of its turns' counts
    prof = resolve_profile("qwen3-vl", str(thinking_folder(tmp_path_factory.getbasetemp(), "qwen3.6")))
    run_manifest(root / "in", work, "s")
    run_token_lengths(work, "s", prof)
    cfg = PlanConfig(max_len=MAX_LEN, overlong="split", split_context=120)
    plan = run_plan(work, ["s"], cfg, prof)
    run_write(work, root / "in", out, workers=1)
    audit = run_audit(work, out, recount_fraction=1.0, workers=1)
    return {"root": root, "work": work, "out": out, "plan": plan, "audit": audit, "profile": prof, "config": cfg}


def _pieces(work: Path) -> list[dict]:
    with store.connect(work, read_only=True) as con:
        cur = con.execute("SELECT * FROM split_pieces ORDER BY piece_id")
        return [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]


def test_turns_cut_only_before_a_user_turn_after_an_assistant_turn():
    msgs = long_chat(3)["messages"]  # system, u0 a0, u1 a(call) tool a1, u2 a2
    assert turns(msgs) == (1, [(1, 3), (3, 7), (7, 9)])
    assert turns(msgs + [{"role": "user", "content": "trailing"}])[1][-1] == (7, 10)  # no turn without an answer


def _fake_count(items):
    """A counter on plain data: 10 tokens a message, 100 for one whose content is "long"."""
    for messages, _, _ in items:
        yield {"total_tokens": sum(100 if m["content"] == "long" else 10 for m in messages), "image_tokens": 0,
               "video_tokens": 0}


def test_the_cut_keeps_the_system_carries_turns_within_the_budget_and_drops_a_turn_too_long():
    from pack_assets.core.split import split_sample

    def chat(*answers):
        return json.dumps([{"role": "system", "content": "s"}] + [
            m for a in answers for m in ({"role": "user", "content": "q"}, {"role": "assistant", "content": a})])

    cfg = PlanConfig(max_len=70, overlong="split", split_context=30)
    pieces = split_sample("x", chat(*"abcdefgh"), [], [], [], [], {}, _fake_count, cfg)
    # a turn is 20 tokens: system (10) + one carried turn = 30, the budget; then two own turns fit in 70
    assert [(p.context_start, p.first_message, p.end_message, p.total_tokens) for p in pieces] == [
        (1, 1, 7, 70), (5, 7, 11, 70), (9, 11, 15, 70), (13, 15, 17, 50)]
    assert all(p.context_messages == 1 + p.first_message - p.context_start for p in pieces)
    assert split_sample("x", chat("a", "long"), [], [], [], [], {}, _fake_count, cfg) is None  # one turn > max_len
    assert split_sample("x", chat("a"), [], [], [], [], {}, _fake_count, cfg) is None  # a single turn
    no_context = PlanConfig(max_len=70, overlong="split", split_context=0)
    assert {p.context_messages for p in split_sample("x", chat(*"abcdefgh"), [], [], [], [], {}, _fake_count,
                                                     no_context)} == {1}  # the system message only


def test_a_sample_with_a_piece_no_pack_could_take_for_a_cap_is_dropped_whole():
    """A per-pack cap a piece breaks (here vision tokens) would leave that piece in no pack and the rest
    packed: the sample is dropped whole instead, as an over-long one is."""
    from pack_assets.core.split import split_sample

    def count(items):  # 10 tokens a message; a message whose content is "img" holds 5 vision tokens
        for messages, _, _ in items:
            vision = sum(5 for m in messages if m["content"] == "img")
            yield {"total_tokens": 10 * len(messages) + vision, "image_tokens": vision, "video_tokens": 0}

    conv = json.dumps([{"role": "system", "content": "s"}] + [
        m for q in ("img", "q", "q", "q")
        for m in ({"role": "user", "content": q}, {"role": "assistant", "content": "a"})])
    for cap, split in ((0, True), (10, True), (4, False)):
        cfg = PlanConfig(max_len=50, overlong="split", split_context=0, max_vision_tokens_per_pack=cap)
        pieces = split_sample("x", conv, [], [], [], [], {}, count, cfg)
        assert (pieces is not None) == split, cap
        assert pieces is None or len(pieces) > 1


def test_the_audit_accounts_for_every_sample_as_packed_dropped_rejected_or_split(packed):
    stats, plan = packed["audit"].stats, packed["plan"]
    assert packed["audit"].ok, packed["audit"].violations
    pieces = _pieces(packed["work"])
    assert {p["sample_id"] for p in pieces} == {"s/b"} and len(pieces) >= 3
    assert (stats["samples_read"], stats["packed"], stats["dropped"], stats["rejected"], stats["split"],
            stats["split_pieces"]) == (3, 1, 1, 0, 1, len(pieces))
    assert stats["per_shard"]["s"]["read"] == 1 + 1 + 0 + 1
    assert plan.stats["split"] == 1 and plan.stats["split_pieces"] == len(pieces) and not plan.violations
    with store.connect(packed["work"], read_only=True) as con:  # the one-turn sample: dropped with its length
        assert con.execute("SELECT sample_id, reason, total_tokens > ? FROM dropped", [MAX_LEN]).fetchall() == [
            ("s/c", "overlong", True)]
    from pack_assets.core.lookup import lookup

    with store.connect(packed["work"], read_only=True) as con:  # `pack-assets lookup`: the source and its pieces
        found = lookup(con, "s/b")
        assert found["outcome"] == "split" and [p["piece_id"] for p in found["pieces"]] == [
            p["piece_id"] for p in sorted(pieces, key=lambda p: p["piece"])]
        in_pack = lookup(con, found["pieces"][1]["pack_id"])["sources"]
        assert any(s.get("split", {}).get("source") == "s/b" and s["key"] == "b" for s in in_pack)
        assert lookup(con, "s/b#0")["kind"] == "piece"
    report = (packed["work"] / "audit_report.md").read_text()
    assert "| 3 | 1 | 1 | 0 | 1 (" in report and "Samples read = packed + dropped + rejected + split" in report


def test_each_piece_fits_its_meta_names_its_source_and_turns_and_media_are_copied_once(packed):
    """Every pack fits and encodes to its planned lengths (PackEncoder checks each sub-sample); the pieces' own
    turns tile the conversation after the system message; each piece is the system message, its carried turns
    and its own; the source's media and extra members are each copied once."""
    from pack_assets.reader import PackEncoder, iter_packs

    source = long_chat(6, image_at=(0, 4))["messages"]
    enc = PackEncoder(packed["profile"])
    subs = {}
    for pack in iter_packs(packed["out"]):
        assert pack["_meta"]["total_token_len"] <= MAX_LEN
        enc.encode(pack)  # raises unless every sub-sample encodes to its planned length
        subs.update({s["sample_id"]: (s, src) for s, src in zip(pack["samples"], pack["_meta"]["sources"])})
    pieces = sorted((k for k in subs if "#" in k), key=lambda k: int(k.split("#")[1]))
    spans = [subs[k][1]["split"]["turns"] for k in pieces]
    assert spans[0][0] == 1 and spans[-1][1] == len(source)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert sorted(m["name"] for k in pieces for m in subs[k][1]["media"]) == ["b.0.png", "b.1.png"]
    assert [m["name"] for k in pieces for m in subs[k][1].get("extra", [])] == ["b.txt"]
    for k in pieces:
        s, src = subs[k]
        split = src["split"]
        assert split["source"] == "s/b" and split["pieces"] == len(pieces) and src["sample_id"] == k
        c0, first = split["context"]
        assert s["messages"] == source[:1] + source[c0:split["turns"][1]]
        assert split["context_messages"] == 1 + first - c0


@processor_needed
def test_each_piece_is_counted_exactly_as_transformers_renders_it(packed):
    """Each piece's stored length equals transformers' apply_chat_template on the piece's messages (its images
    given), on the thinking template's folder."""
    folder = Path(packed["profile"].model_dir)
    pieces = _pieces(packed["work"])
    images = {f"b.{j}.png": packed["root"] / f"b.{j}.png" for j in range(2)}
    for name, path in images.items():
        path.write_bytes(image_bytes(56 + 28 * int(name[2]), 56, "PNG"))
    for p in pieces:
        names = iter(p["media_members"])
        messages = [{**m, "content": [{**c, "image": str(images[next(names)])} if c.get("type") == "image" else c
                                      for c in m["content"]]} if isinstance(m["content"], list) else m
                    for m in json.loads(p["conversation"])]
        assert p["total_tokens"] == oracle(folder, messages, None, {}), p["piece_id"]


def test_a_piece_trains_only_its_own_assistant_turns(packed):
    """Labels of a piece with carried context: exactly the assistant turns of its own new messages."""
    from pack_assets.reader import PackEncoder, iter_packs

    enc = PackEncoder(packed["profile"])
    carried_seen = False
    for pack in iter_packs(packed["out"]):
        for s, src in zip(pack["samples"], pack["_meta"]["sources"]):
            if "split" not in src:
                continue
            split = src["split"]
            out = enc.encode_sample(s["messages"], s["media"], "all", split)
            trained = enc.tok.decode([t for t, lab in zip(out["input_ids"], out["labels"]) if lab != -100],
                                     skip_special_tokens=False)
            own = s["messages"][split["context_messages"]:]
            want = [m for m in own if m["role"] == "assistant"]
            carried = [m for m in s["messages"][:split["context_messages"]] if m["role"] == "assistant"]
            carried_seen |= bool(carried)
            assert trained.count("<|im_end|>") == len(want)
            # token for token: the runs "all" trains on the whole piece, without those of the carried turns
            runs = _trained(enc, enc.encode_sample(s["messages"], s["media"], "all"))
            assert _trained(enc, out) == runs[len(carried):] and len(runs) == len(carried) + len(want)
            # the assistant answers that train are exactly the piece's own (each "Answer <turn>:" once)
            assert re.findall(r"Answer \d+:", trained) == [m["content"].split(" because")[0] for m in want
                                                             if m["content"]]
    assert carried_seen  # the budget let some piece carry an earlier turn


def test_the_split_is_deterministic_and_part_of_the_plan_fingerprint(packed):
    prof, cfg = packed["profile"], packed["config"]
    again = run_plan(packed["work"], ["s"], cfg, prof)
    assert again.fingerprint == packed["plan"].fingerprint
    assert _pieces(packed["work"]) == _pieces(packed["work"])
    dropping = run_plan(packed["work"], ["s"], PlanConfig(max_len=MAX_LEN), prof)
    assert dropping.fingerprint != again.fingerprint and dropping.stats["dropped"] == 2
    assert _pieces(packed["work"]) == []
    run_plan(packed["work"], ["s"], cfg, prof)  # leave the module's plan as it was


def test_the_setting_from_flags_config_resource_and_its_refusals(tmp_path):
    """`--overlong split --split-context N`, a --config file and the Dagster resource give the same settings; the
    setting is in the plan's fingerprint (asserted above); a recipe, and split with keep_overlong, are refused."""
    from pack_assets.cli import _settings, build_parser
    from pack_assets.core.settings import Settings
    from pack_assets.defs.resources import PackSettings

    base = ["run", "--input", str(tmp_path), "--max-len", "512"]
    flags = _settings(build_parser().parse_args([*base, "--overlong", "split", "--split-context", "64"]))
    (tmp_path / "c.json").write_text(json.dumps({"overlong": "split", "split_context": 64}))
    config = _settings(build_parser().parse_args([*base, "--config", str(tmp_path / "c.json")]))
    assert (flags.plan.overlong, flags.plan.split_context) == ("split", 64) and flags == config
    assert PackSettings.of(flags).to_settings() == flags and PackSettings().overlong == "drop"
    with pytest.raises(ValueError, match="overlong 'cut'"):
        Settings.from_flat({"overlong": "cut"})
    with pytest.raises(ValueError, match="exclude each other"):
        Settings.from_flat({"overlong": "split", "keep_overlong": True})
    (tmp_path / "a").mkdir()
    (tmp_path / "r.yaml").write_text("datasets:\n  - {name: a, input: a}\noverlong: split\n")
    with pytest.raises(ValueError, match="not supported with a recipe"):
        Settings.from_flat({"recipe": str(tmp_path / "r.yaml")})


def test_a_rerun_rewrites_nothing_and_index_mode_and_an_incremental_plan_stay_whole(packed):
    """Pieces through the writer's reruns (its record's digests do not cover pieces: their shards are decided
    by fingerprint), index mode, and an incremental plan (which plans the pieces again, into new packs): the
    audit passes each time and still counts the split."""
    from dataclasses import replace

    from pack_assets.core.write import WRITERS

    work, inp, out = packed["work"], packed["root"] / "in", packed["out"]
    run_plan(work, ["s"], packed["config"], packed["profile"])
    assert run_write(work, inp, out, workers=1).written == 0
    WRITERS["index"](work, inp, packed["root"] / "index", workers=1)
    assert run_audit(work, packed["root"] / "index", workers=1).ok
    inc = run_plan(work, ["s"], replace(packed["config"], incremental=True), packed["profile"])
    assert not inc.violations and inc.stats["split"] == 1
    run_write(work, inp, out, workers=1)
    audit = run_audit(work, out, workers=1)
    assert audit.ok, audit.violations
    assert (audit.stats["split"], audit.stats["split_pieces"], audit.stats["dropped"]) == (
        1, packed["audit"].stats["split_pieces"], 1)
