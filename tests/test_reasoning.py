"""Reasoning traces and thinking templates (issue 36, item 1), against transformers itself: the count equals
``len(processor.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
**chat_template_kwargs)["input_ids"][0])`` on a Qwen3-VL checkpoint folder whose chat template is a real
thinking model's (tests/thinking_fixtures.py), with the record's messages as given."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from conftest import image_bytes, needs, write_tar
from thinking_fixtures import thinking_folder

try:
    import torchvision  # noqa: F401  (the Qwen3-VL processor's video part needs it)
    NO_TORCHVISION = False
except ImportError:
    NO_TORCHVISION = True
processor_needed = needs(NO_TORCHVISION, "torchvision is not installed (the processor extra): transformers cannot "
                                         "build the Qwen3-VL processor the oracle is")

TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "Zoom into a region of the image.",
                                           "parameters": {"type": "object", "properties": {
                                               "box": {"type": "array", "items": {"type": "integer"}}},
                                               "required": ["box"]}}},
         {"type": "function", "function": {"name": "ocr", "description": "Read the text in a region.",
                                           "parameters": {"type": "object", "properties": {
                                               "box": {"type": "array", "items": {"type": "integer"}}}}}}]


def _call(name: str, box: list[int]) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": {"box": box}}}


def hf_records(img: str) -> list[dict]:
    """HF "messages" records as thinking-model data comes: reasoning_content (vLLM / SGLang / OpenAI style),
    inline <think> in string or typed content, multi-turn (the template drops reasoning before the last user
    query), multi-step tool calls after the last query, a `thinking` key, tool turns with names."""
    pic = {"type": "image", "image": img}
    def r(i):
        return f"Step {i}: the user wants a short answer, so I check the picture first.\n\nThen answer."

    return [
        {"messages": [{"role": "user", "content": [pic, {"type": "text", "text": "What colour is it?"}]},
                      {"role": "assistant", "reasoning_content": r(1), "content": "Red."}]},
        {"messages": [{"role": "system", "content": "Think, then answer."},
                      {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "reasoning_content": r(2), "content": "4."},
                      {"role": "user", "content": "And 3+3?"},
                      {"role": "assistant", "reasoning_content": r(3), "content": "6."}]},
        {"messages": [{"role": "user", "content": "Why is the sky blue?"},
                      {"role": "assistant",
                       "content": "<think>\nRayleigh scattering.\n</think>\n\nShort waves scatter."},
                      {"role": "user", "content": "Sunsets?"},
                      {"role": "assistant", "content": "<think>Longer path.</think>Red light is left."}]},
        {"messages": [{"role": "user", "content": [pic, {"type": "text", "text": "Describe."}]},
                      {"role": "assistant",
                       "content": [{"type": "text", "text": "<think>A square.</think>\n\nA red square."}]}]},
        {"tools": TOOLS, "messages": [
            {"role": "system", "content": "You use tools."},
            {"role": "user", "content": [pic, {"type": "text", "text": "Read the sign."}]},
            {"role": "assistant", "reasoning_content": "Too small: zoom first.", "content": "",
             "tool_calls": [_call("zoom", [0, 0, 32, 32])]},
            {"role": "tool", "name": "zoom", "tool_call_id": "c1", "content": "zoomed 4x"},
            {"role": "assistant", "reasoning_content": "Now read it.", "content": "Reading.",
             "tool_calls": [_call("ocr", [0, 0, 8, 8]), _call("ocr", [8, 8, 16, 16])]},
            {"role": "tool", "name": "ocr", "content": "STOP"},
            {"role": "tool", "name": "ocr", "content": "AHEAD"},
            {"role": "assistant", "reasoning_content": "Both parts read.", "content": "It says STOP AHEAD."}]},
        {"tools": json.dumps(TOOLS), "messages": [
            {"role": "user", "content": "Zoom somewhere."},
            {"role": "assistant", "reasoning_content": "Earlier turn: dropped by the template.", "content": "Done.",
             "tool_calls": [_call("zoom", [1, 2, 3, 4])]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "Zoomed."},
            {"role": "user", "content": "Again, then read."},
            {"role": "assistant", "content": "<think>\nzoom, then ocr\n</think>\n\n",
             "tool_calls": [_call("zoom", [5, 6, 7, 8])]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "reasoning_content": "", "content": "Read: nothing."}]},
        {"messages": [{"role": "user", "content": "Hi"},
                      {"role": "assistant", "thinking": "A greeting.", "reasoning_content": "A greeting.",
                       "content": "Hello!"}]},
        {"messages": [{"role": "user", "content": "Tell me about the image."},
                      {"role": "assistant", "reasoning_content": "Long one. " * 200, "content": "Nothing to see."}]},
    ]


def sharegpt_records(img: str) -> list[tuple[dict, list[dict]]]:
    """ShareGPT / LLaMA-Factory records with <think> inside ``value``, each with the HF messages it means."""
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    return [
        ({"conversations": [{"from": "human", "value": "<image>What is it?"},
                            {"from": "gpt", "value": "<think>\nLooks red.\n</think>\n\nA red square."}],
          "images": [img]},
         [{"role": "user", "content": [{"type": "image", "image": img}, t("What is it?")]},
          {"role": "assistant", "content": "<think>\nLooks red.\n</think>\n\nA red square."}]),
        ({"system": "Be careful.", "conversations": [
            {"from": "human", "value": "First?"}, {"from": "gpt", "value": "<think>one</think>1"},
            {"from": "human", "value": "Second?"}, {"from": "gpt", "value": "<think>two</think>2"}]},
         [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "First?"},
          {"role": "assistant", "content": "<think>one</think>1"}, {"role": "user", "content": "Second?"},
          {"role": "assistant", "content": "<think>two</think>2"}]),
        ({"tools": json.dumps([t_["function"] for t_ in TOOLS]), "conversations": [
            {"from": "human", "value": "Zoom in."},
            {"from": "function_call", "value": json.dumps({"name": "zoom", "arguments": {"box": [1, 1, 2, 2]}})},
            {"from": "observation", "value": "zoomed"},
            {"from": "gpt", "value": "<think>It worked.</think>\n\nZoomed in."}]},
         [{"role": "user", "content": "Zoom in."},
          {"role": "assistant", "content": "", "tool_calls": [
              {"type": "function", "function": {"name": "zoom", "arguments": {"box": [1, 1, 2, 2]}}}]},
          {"role": "tool", "content": "zoomed"},
          {"role": "assistant", "content": "<think>It worked.</think>\n\nZoomed in."}]),
    ]


@functools.lru_cache(maxsize=4)
def _processor(folder: str):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(folder, local_files_only=True)


def oracle(folder: Path, messages: list[dict], tools, kwargs: dict) -> int:
    tools = json.loads(tools) if isinstance(tools, str) else tools  # LLaMA-Factory's JSON string, as given
    out = _processor(str(folder)).apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True, **kwargs)
    return len(out["input_ids"][0])


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("media")
    (d / "a.png").write_bytes(image_bytes(640, 360, "PNG"))
    return d


CASES = [("qwen3-vl-thinking", {}), ("qwen3.6", {}), ("qwen3.6", {"enable_thinking": False}),
         ("qwen3.6", {"enable_thinking": True, "preserve_thinking": True})]


@processor_needed
@pytest.mark.parametrize("template,kwargs", CASES)
def test_count_equals_transformers_on_reasoning_records(template, kwargs, media, tmp_path_factory):
    from pack_assets.cli import main

    folder = thinking_folder(tmp_path_factory.getbasetemp(), template)
    img = str(media / "a.png")
    hf = [(r, r["messages"]) for r in hf_records(img)]
    records = hf + sharegpt_records(img)
    path = media / f"recs-{template}-{len(kwargs)}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r, _ in records))
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["count", "--input", str(path), "--model-dir", str(folder),
                     *(["--chat-template-kwargs", json.dumps(kwargs)] if kwargs else [])])
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert code == 0, rows
    want = [oracle(folder, msgs, rec.get("tools"), kwargs) for rec, msgs in records]
    assert [r["total_tokens"] for r in rows] == want
    if kwargs.get("preserve_thinking"):  # the variable reaches the template: earlier reasoning is kept
        assert sum(w > oracle(folder, msgs, rec.get("tools"), {}) for w, (rec, msgs) in zip(want, records)) >= 3
    assert {r["counted_by"] for r in rows} == {"fast"}


@processor_needed
def test_the_processor_rule_with_template_variables_equals_transformers(media, tmp_path_factory):
    """The processor rule (any folder, core/counting/procount.py) renders with the same template variables:
    with preserve_thinking the earlier turns' reasoning is counted, as transformers counts it."""
    from dataclasses import replace

    from pack_assets.core.chatkw import canonical
    from pack_assets.core.counting.count import count_records
    from pack_assets.core.counting.profiles import processor_profile

    folder = thinking_folder(tmp_path_factory.getbasetemp(), "qwen3.6")
    kwargs = {"preserve_thinking": True}
    records = [(r, r["messages"]) for r in hf_records(str(media / "a.png"))]
    path = media / "recs-processor.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r, _ in records))
    profile = replace(processor_profile(folder), chat_template_kwargs=canonical(kwargs))
    rows = count_records(path, None, profile)
    assert {r["counted_by"] for r in rows} == {"processor"}
    assert [r["total_tokens"] for r in rows] == [oracle(folder, m, r.get("tools"), kwargs) for r, m in records]
    assert [r["total_tokens"] for r in rows] != [oracle(folder, m, r.get("tools"), {}) for r, m in records]


def _shard_records(img_name: str) -> list[tuple[dict, list[dict]]]:
    """hf_records and sharegpt_records naming the image as a member of their sample."""
    return [(r, r["messages"]) for r in hf_records(img_name)] + sharegpt_records(img_name)


@processor_needed
def test_run_through_shards_counts_packs_and_encodes_exactly(media, tmp_path, tmp_path_factory, monkeypatch, capsys):
    """`pack-assets run --model-dir <thinking checkpoint> --chat-template-kwargs ...`: every sample's stored length
    equals transformers' on the record, the packs hold the reasoning and record the template variables, the
    audit's recount (every sample) agrees, and the reader encodes each sub-sample to its planned length."""
    from pack_assets.cli import main
    from pack_assets.core import store
    from pack_assets.reader import PackEncoder, iter_packs

    folder = thinking_folder(tmp_path_factory.getbasetemp(), "qwen3.6")
    kwargs = {"preserve_thinking": True}
    records = _shard_records("a.png")
    png = (media / "a.png").read_bytes()
    members = []
    for i, (rec, _) in enumerate(records):
        members.append((f"k{i:02d}.json", json.dumps(rec)))
        if "a.png" in json.dumps(rec):
            members.append((f"k{i:02d}.a.png", png))
    write_tar(tmp_path / "in" / "s.tar", members)
    work, out = tmp_path / "work", tmp_path / "out"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    code = main(["run", "--input", str(tmp_path / "in"), "--max-len", "4096", "--model-dir", str(folder),
                 "--chat-template-kwargs", json.dumps(kwargs), "--work", str(work), "--output", str(out),
                 "--dagster-home", str(tmp_path / "dh"), "--check-samples", "3", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["rejected"] == 0 and summary["dropped"] == 0, summary
    # --check-samples reached the audit (flag -> resource -> asset): its processor agreed on the first 3
    assert "3 sample(s) recounted with the model's real processor" in Path(summary["audit_report"]).read_text()
    with store.connect(work, read_only=True) as con:
        got = dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths").fetchall())
    img = str(media / "a.png")
    want = {f"s/k{i:02d}": oracle(folder, msgs, rec.get("tools"), kwargs)
            for i, (rec, msgs) in enumerate(_shard_records(img))}
    assert got == want
    packs = list(iter_packs(out))
    assert {json.dumps(p["_meta"]["chat_template_kwargs"]) for p in packs} == {json.dumps(kwargs)}
    kept = [m.get("reasoning_content") for p in packs for s in p["samples"] for m in s["messages"]]
    assert "Too small: zoom first." in kept  # the packed conversation keeps what the record had
    encoder = PackEncoder(model_dir=str(folder))  # the template variables: each pack's own, from its _meta
    for pack in packs:
        enc = encoder.encode(pack)  # raises when a sub-sample's length differs from the plan's
        assert len(enc["input_ids"]) == pack["_meta"]["total_token_len"]
    with pytest.raises(ValueError, match="differ from the plan"):  # other variables: other lengths, refused
        for pack in packs:
            PackEncoder(model_dir=str(folder), chat_template_kwargs={}).encode(pack)
    assert main(["verify", "--work", str(work), "--output", str(out)]) == 0
