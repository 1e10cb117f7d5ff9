"""Inline media, tools and the edge rules (issue 18, items 1, 2, 5), against transformers itself:
``apply_chat_template(messages, tools=tools, tokenize=True)`` with the real Qwen templates (copies in
tests/fixtures/models, from ../shared/fixtures, see tests/fixtures/README.md) and the Qwen image processor."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from conftest import chat, image_bytes, write_tar

from pack_assets.core.conversation import normalize, place_media
from pack_assets.core.counting.count import count_records
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.tokenizers import tokenizer_for
from pack_assets.core.counting.tokens import TokenCounter
from pack_assets.core.reasons import ReasonError

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
FOLDERS = {"qwen3-vl": "Qwen3-VL-8B-Instruct", "qwen2.5-vl": "Qwen2.5-VL-7B-Instruct"}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}]


def _records(img_dir: Path) -> list[dict]:
    """HF-native records: what qwen-vl-utils and transformers' examples feed apply_chat_template."""
    img = lambda name: {"type": "image", "image": str(img_dir / name)}  # noqa: E731
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}
    call_str = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    return [
        {"tools": TOOLS, "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": [img("a.png"), {"type": "text", "text": "Weather where this was taken?"}]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'},
            {"role": "assistant", "content": "21 °C and clear in Paris."}]},
        {"tools": json.dumps(TOOLS), "messages": [  # LLaMA-Factory keeps tools as a JSON string
            {"role": "user", "content": "Oslo and Paris?"},
            {"role": "assistant", "content": "Checking both.", "tool_calls": [call_str, call]},
            {"role": "tool", "content": '{"temp": 3}'}, {"role": "tool", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "3 and 21."}]},
        {"messages": [
            {"role": "user", "content": [img("a.png"), img("b.png"), {"type": "text", "text": "Same place?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "No."}]},
            {"role": "user", "content": [{"type": "image", "path": str(img_dir / "b.png")},
                                         {"type": "text", "text": "And?"}]},
            {"role": "assistant", "content": "Yes."}]},
        {"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"file://{img_dir / 'a.png'}"}},
                                         {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A square."}]},
    ]


@functools.lru_cache(maxsize=4)
def _hf(profile: str):
    """transformers' tokenizer (the model's own added tokens only), template and image processor."""
    import tempfile

    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = MODELS / FOLDERS[profile]
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    with tempfile.TemporaryDirectory() as d:
        tokenizer_for(load_profile(profile)).save(f"{d}/tokenizer.json")
        tok = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json")
    return tok, template, Qwen2VLImageProcessorPil.from_pretrained(folder)


def _hf_total(profile: str, rec: dict, img_dir: Path, tmp: Path) -> int:
    """len(input_ids) of transformers' chat path: the template with tools, each image pad grown to the
    image processor's count."""
    from PIL import Image

    tok, template, proc = _hf(profile)
    tools = json.loads(rec["tools"]) if isinstance(rec.get("tools"), str) else rec.get("tools")
    ids = tok.apply_chat_template(rec["messages"], tools=tools, chat_template=template, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    paths = [p.get("image") or p.get("path") or p.get("image_url", {}).get("url", "")[7:]
             for m in rec["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] != "text"]
    extra = 0
    for path in paths:
        w, h = Image.open(path).size
        extra += proc.get_number_of_image_patches(h, w, {}) // proc.merge_size**2 - 1
    return len(ids) + extra


@pytest.fixture
def img_dir(tmp_path: Path) -> Path:
    d = tmp_path / "media"
    d.mkdir()
    (d / "a.png").write_bytes(image_bytes(300, 200, "PNG"))
    (d / "b.png").write_bytes(image_bytes(640, 480, "PNG"))
    return d


@pytest.mark.parametrize("profile", list(FOLDERS))
def test_count_equals_transformers_with_tools_and_inline_media(profile, img_dir, tmp_path):
    records = _records(img_dir)
    (tmp_path / "recs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    got = count_records(tmp_path / "recs.jsonl", None, profile, None)
    for rec, res in zip(records, got):
        assert "error" not in res, res
        assert res["total_tokens"] == _hf_total(profile, rec, img_dir, tmp_path), (profile, rec["messages"][0])


def test_the_tool_record_counts_what_the_qwen3_vl_template_counts(img_dir, tmp_path):
    rec = _records(img_dir)[0]
    counter = TokenCounter(load_profile("qwen3-vl"))
    msgs = place_media(normalize(rec), 1, 0)
    no_tools = TokenCounter(load_profile("qwen3-vl")).render(
        [{k: v for k, v in m.items() if k != "tools"} for m in msgs], tools=[])
    assert "<tools>" in counter.render(msgs) and "<tools>" not in no_tools
    (res,) = counter.count_many([(msgs, [[300, 200]], [])])
    assert res["total_tokens"] == _hf_total("qwen3-vl", rec, img_dir, tmp_path)


def test_inline_media_in_shards_by_member_name_or_kind_only(tmp_path):
    from pack_assets.core.scan import scan_shard

    named = {"messages": [{"role": "user", "content": [{"type": "image", "image": "b.png"},
                                                      {"type": "image", "image": "a.jpg"},
                                                      {"type": "text", "text": "?"}]},
                          {"role": "assistant", "content": "ok"}]}
    kind_only = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]},
                              {"role": "assistant", "content": "ok"}]}
    tools = {**chat("Weather?", "Sunny."), "tools": json.dumps(TOOLS)}
    shard = write_tar(tmp_path / "s.tar", [
        ("k1.json", json.dumps(named)), ("k1.a.jpg", image_bytes(64, 48)), ("k1.b.png", image_bytes(100, 80, "PNG")),
        ("k2.json", json.dumps(kind_only)), ("k2.jpg", image_bytes(32, 32)),
        ("k3.json", json.dumps(tools))])
    rows = {s.key: s for s in scan_shard(shard, "s") if hasattr(s, "key") and hasattr(s, "image_sizes")}
    assert rows["k1"].status == "ok" and rows["k1"].image_sizes == [[100, 80], [64, 48]]
    assert rows["k1"].media_members == ["k1.b.png", "k1.a.jpg"]
    assert rows["k2"].status == "ok" and rows["k2"].n_images == 1
    conv = json.loads(rows["k3"].conversation)
    assert conv[0]["tools"] == TOOLS
    assert "<tools>" in TokenCounter(load_profile("qwen3-vl")).render(conv)


def test_llama_factory_function_call_turns_become_tool_calls():
    rec = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                             {"from": "function_call",
                              "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
                             {"from": "observation", "value": '{"temp": 21}'}, {"from": "gpt", "value": "21 °C."}],
           "tools": json.dumps([t["function"] for t in TOOLS])}
    msgs = place_media(normalize(rec), 0, 0)
    assert msgs[1] == {"role": "assistant", "content": [], "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    text = TokenCounter(load_profile("qwen3-vl")).render(msgs)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text


@pytest.mark.parametrize("text", ["look <|image_pad|> here", "x<|video_pad|>", "<image_soft_token>", "<IMG_CONTEXT>"])
def test_a_literal_media_token_in_text_is_rejected(text):
    with pytest.raises(ReasonError) as e:
        normalize({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]})
    assert e.value.reason == "media_token_in_text"


@pytest.mark.parametrize("where", ["reasoning_content", "tool_call arguments", "name", "record tools"])
def test_a_literal_media_token_in_any_rendered_key_is_rejected(where):
    """Every key of a turn but role reaches the template: a media token there would be expanded by the
    processor (which refuses the sample) while the fast rule counted it as text."""
    token = "the <|image_pad|> token"
    answer = {"role": "assistant", "content": "A."}
    if where == "reasoning_content":
        answer["reasoning_content"] = token
    elif where == "tool_call arguments":
        answer["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": {"q": token}}}]
    elif where == "name":
        answer["name"] = token
    rec = {"messages": [{"role": "user", "content": "hi"}, answer]}
    if where == "record tools":
        rec["tools"] = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": token}}]
    with pytest.raises(ReasonError) as e:
        normalize(rec)
    assert e.value.reason == "media_token_in_text" and "<|image_pad|>" in e.value.detail
    answer.pop("reasoning_content", None), answer.pop("tool_calls", None), answer.pop("name", None)
    rec.pop("tools", None)
    normalize(rec)  # the same record without the token is fine


def test_bad_tools_and_remote_inline_media_are_rejected(tmp_path):
    with pytest.raises(ReasonError) as e:
        normalize({**chat(), "tools": "{not json"})
    assert e.value.reason == "bad_tools"
    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "https://x.org/a.jpg"}]},
                        {"role": "assistant", "content": "ok"}]}
    (tmp_path / "r.json").write_text(json.dumps([rec]))
    assert count_records(tmp_path / "r.json", None, "qwen3-vl", None)[0]["error"] == "remote_media"


def test_nfc_runs_after_special_tokens_are_split_off():
    counter = TokenCounter(load_profile("qwen3-vl"))
    hf = tokenizer_for(counter.profile)
    for text in ["<|vision_end|>\u0338", "a<|im_end|>\u0338b", "e\u0301<|im_start|>\u0338<|im_end|>", "cafe\u0301"]:
        assert counter.lengths([text]) == [len(hf.encode(text, add_special_tokens=False).ids)], repr(text)
    assert counter.lengths(["<|vision_end|>\u0338"]) == [len(hf.encode("<|vision_end|>\u0338").ids)] != [8]


def test_qwen3_video_frame_pixel_cap_is_a_profile_setting(tmp_path):
    import shutil

    from pack_assets.core.counting.profiles import profile_from_model_dir
    from pack_assets.core.counting.vision import video_count

    for f in (MODELS / FOLDERS["qwen3-vl"]).iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "video_preprocessor_config.json").read_text())
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({**cfg, "frame_max_pixels": 256 * 32 * 32}))
    capped = profile_from_model_dir(tmp_path).video
    assert capped.frame_max_pixels == 256 * 32 * 32 and load_profile("qwen3-vl").video.frame_max_pixels == 0
    meta = {"frames": 300, "fps": 30.0, "width": 1920, "height": 1080}
    base, small = video_count(meta, load_profile("qwen3-vl").video), video_count(meta, capped)
    assert small.frame_tokens <= 256 < base.frame_tokens and len(small.timestamps) == len(base.timestamps)


def test_tool_and_inline_media_records_pack_and_the_reader_encodes_the_counted_length(tmp_path):
    """What a user trains on: the packed tool record renders (tools included) to the length that was planned."""
    from pack_assets.core import store
    from pack_assets.core.counting.token_lengths import run_token_lengths
    from pack_assets.core.plan import PlanConfig, run_plan
    from pack_assets.core.scan import run_manifest
    from pack_assets.core.write import run_write
    from pack_assets.reader import PackEncoder, iter_packs

    inp, work, out = tmp_path / "in", tmp_path / "work", tmp_path / "out"
    inp.mkdir()
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    tool = {"tools": TOOLS, "messages": [
        {"role": "user", "content": [{"type": "image", "image": "k1.jpg"}, {"type": "text", "text": "Where?"}]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 °C."}]}
    write_tar(inp / "s.tar", [("k1.json", json.dumps(tool)), ("k1.jpg", image_bytes(64, 48)),
                             ("k2.json", json.dumps({**chat("Weather?", "Sunny."), "tools": json.dumps(TOOLS)}))])
    profile = load_profile("qwen3-vl")
    run_manifest(inp, work, "s")
    run_token_lengths(work, "s", profile)
    run_plan(work, ["s"], PlanConfig(max_len=4096), profile)
    run_write(work, inp, out, workers=1)
    with store.connect(work, read_only=True) as con:
        counted = dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths WHERE status = 'ok'").fetchall())
    assert set(counted) == {"s/k1", "s/k2"}
    encoder = PackEncoder("qwen3-vl")
    for pack in iter_packs(sorted(out.glob("*.tar"))):
        enc = encoder.encode(pack)  # raises when a sub-sample's length differs from `_meta`
        for sid, a, b in zip(enc["sample_ids"], enc["cu_seqlens"][:-1], enc["cu_seqlens"][1:]):
            assert b - a == counted[sid]
