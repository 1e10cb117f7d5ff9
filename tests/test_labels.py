"""Label policies (issue 36, item 2): which tokens train, per dataset, recorded in `_meta` and honoured by
PackEncoder's labels and loss_weights. Each policy against the trained text written out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pack_assets.core.settings import Settings

CALL = {"type": "function", "function": {"name": "zoom", "arguments": {"x": 1}}}
MESSAGES = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>r1</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"t": 1}'},
    {"role": "assistant", "content": "<think>r2</think>\n\nA2 <tool_response>echo</tool_response> done"},
]
FIRST = "<think>r1</think>\n\nA1<|im_end|>"
CALLED = '<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call><|im_end|>'
LAST = "<think>r2</think>\n\nA2 <tool_response>echo</tool_response> done<|im_end|>"
EXPECTED = {
    "all": [FIRST, CALLED, LAST],
    "last_turn": [LAST],
    "no_tool_results": [FIRST, CALLED, "<think>r2</think>\n\nA2 ", " done<|im_end|>"],
    "no_earlier_reasoning": ["A1<|im_end|>", CALLED, LAST],
}


def _trained(encoder, out: dict) -> list[str]:
    """The text of each run of trained tokens."""
    runs, run = [], []
    for tid, lab in zip(out["input_ids"], out["labels"]):
        if lab != -100:
            assert lab == tid
            run.append(tid)
        elif run:
            runs.append(run)
            run = []
    runs += [run] if run else []
    return [encoder.tok.decode(r, skip_special_tokens=False) for r in runs]


@pytest.fixture(scope="module")
def encoder():
    from pack_assets.reader import PackEncoder

    return PackEncoder("qwen3-vl", loss_weighting="sample")


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_each_policy_trains_what_it_says(policy, encoder):
    out = encoder.encode_sample(MESSAGES, [], policy)
    assert _trained(encoder, out) == EXPECTED[policy]


def _zoom(box: list[int]) -> dict:
    return {"type": "function", "function": {"name": "zoom", "arguments": {"box": box}}}


ZOOM_CALL = ("<tool_call>\n<function=zoom>\n<parameter=box>\n[0, 0, 32, 32]\n</parameter>\n</function>\n"
             "</tool_call><|im_end|>")
# an agent trajectory as thinking models' data holds it: reasoning_content, a tool call, the tool's turn
AGENT = [{"role": "user", "content": "Read the sign."},
         {"role": "assistant", "reasoning_content": "Too small: zoom first.", "content": "",
          "tool_calls": [_zoom([0, 0, 32, 32])]},
         {"role": "tool", "name": "zoom", "content": "zoomed 4x"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    """Encoders of a checkpoint folder with the real Qwen3.6 thinking template (tests/thinking_fixtures.py),
    by its template variables."""
    from thinking_fixtures import thinking_folder

    from pack_assets.reader import PackEncoder

    folder = thinking_folder(tmp_path_factory.getbasetemp(), "qwen3.6")
    return lambda **kwargs: PackEncoder(model_dir=str(folder), chat_template_kwargs=kwargs)


def test_no_tool_results_on_an_agent_trajectory_trains_no_tool_output(thinking):
    """The template puts the tool's turn in a user turn (never trained); a tool output the data wrote into an
    assistant turn trains under `all` and not under `no_tool_results`, whose other tokens are `all`'s."""
    messages = [*AGENT, {"role": "assistant", "reasoning_content": "Run OCR on it.",
                         "content": "OCR:\n<tool_response>\nSTOP\n</tool_response>\nIt says STOP."}]
    enc = thinking()
    first = "<think>\nToo small: zoom first.\n</think>\n\n" + ZOOM_CALL
    assert _trained(enc, enc.encode_sample(messages, [], "all")) == [
        first, "<think>\nRun OCR on it.\n</think>\n\nOCR:\n<tool_response>\nSTOP\n</tool_response>\n"
               "It says STOP.<|im_end|>"]
    assert _trained(enc, enc.encode_sample(messages, [], "no_tool_results")) == [
        first, "<think>\nRun OCR on it.\n</think>\n\nOCR:\n", "\nIt says STOP.<|im_end|>"]


def test_no_earlier_reasoning_with_a_preserve_thinking_template(thinking):
    """With preserve_thinking the template keeps every turn's reasoning: `all` trains it, `no_earlier_reasoning`
    only the last turn's. Without it the template drops the earlier reasoning itself: the policies agree."""
    messages = [*AGENT, {"role": "assistant", "reasoning_content": "Now read it.", "content": "It says STOP."},
                {"role": "user", "content": "And the other sign?"},
                {"role": "assistant", "reasoning_content": "Second sign: AHEAD.", "content": "AHEAD."}]
    last = "<think>\nSecond sign: AHEAD.\n</think>\n\nAHEAD.<|im_end|>"
    preserving = thinking(preserve_thinking=True)
    assert _trained(preserving, preserving.encode_sample(messages, [], "all")) == [
        "<think>\nToo small: zoom first.\n</think>\n\n" + ZOOM_CALL,
        "<think>\nNow read it.\n</think>\n\nIt says STOP.<|im_end|>", last]
    assert _trained(preserving, preserving.encode_sample(messages, [], "no_earlier_reasoning")) == [
        ZOOM_CALL, "It says STOP.<|im_end|>", last]
    plain = thinking()
    for policy in ("all", "no_earlier_reasoning"):
        trained = _trained(plain, plain.encode_sample(messages, [], policy))
        assert trained == [ZOOM_CALL, "It says STOP.<|im_end|>", last]


def test_the_pack_meta_decides_each_sub_samples_policy_and_the_weights_follow(encoder):
    """A blend's `_meta` maps datasets to policies; the encoder picks each sub-sample's by its dataset; the
    "sample" weights are 1/n over exactly the trained tokens of each sub-sample."""
    n = len(encoder.encode_sample(MESSAGES, [])["input_ids"])
    pack = {"_meta": {"pack_id": "p0", "media_type": "text", "sample_ids": ["chat/a", "agent/b"],
                      "sample_token_lens": [n, n], "total_token_len": 2 * n, "sources": [],
                      "label_policy": {"chat": "all", "agent": "last_turn"}},
            "samples": [{"messages": MESSAGES, "media": []}, {"messages": MESSAGES, "media": []}]}
    enc = encoder.encode(pack)
    labels, weights = enc["labels"], enc["loss_weights"]
    first, second = slice(0, n), slice(n, 2 * n)
    assert (labels[second] != -100).sum() < (labels[first] != -100).sum()
    for part in (first, second):
        trained = labels[part] != -100
        assert np.all((weights[part] > 0) == trained)
        assert weights[part].sum() == pytest.approx(1.0)
    from pack_assets.reader import PackEncoder

    forced = PackEncoder("qwen3-vl", label_policy="last_turn").encode(pack)["labels"]
    assert np.array_equal(forced[first], forced[second])  # the encoder's own policy over the recorded one


def test_the_setting_from_flags_config_and_recipe(tmp_path):
    from pack_assets.core.plan import PlanConfig, PlanInfo
    from pack_assets.core.recipe import load
    from pack_assets.core.write import write_context

    assert Settings.from_flat({"label_policy": "last_turn"}).plan.label_policy == "last_turn"
    with pytest.raises(ValueError, match="label_policy 'last'"):
        Settings.from_flat({"label_policy": "last"})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "r.yaml").write_text("datasets:\n  - {name: a, input: a}\n  - {name: b, input: b, label_policy: "
                                     "no_earlier_reasoning}\nlabel_policy: last_turn\n")
    s = Settings.from_flat({"recipe": str(tmp_path / "r.yaml")})
    assert json.loads(s.plan.label_policy) == {"a": "last_turn", "b": "no_earlier_reasoning"}
    assert load(tmp_path / "r.yaml").datasets[1].label_policy == "no_earlier_reasoning"
    # a mapping is checked against what it maps: a misspelt dataset or policy is refused with the valid names,
    # never trained under `all` unsaid; without a recipe there are no datasets to map
    with pytest.raises(ValueError, match=r"'agnt', not a dataset of the recipe; its datasets: a, b"):
        Settings.from_flat({"recipe": str(tmp_path / "r.yaml"), "label_policy": '{"a": "all", "agnt": "last_turn"}'})
    with pytest.raises(ValueError, match=r"'lastturn' \(dataset 'b'\): expected one of all, last_turn"):
        Settings.from_flat({"recipe": str(tmp_path / "r.yaml"), "label_policy": {"a": "all", "b": "lastturn"}})
    with pytest.raises(ValueError, match="a policy per dataset needs a recipe"):
        Settings.from_flat({"label_policy": {"a": "last_turn"}})
    info = PlanInfo("f", "qwen3-vl", "pf", None, [], PlanConfig(label_policy=s.plan.label_policy), {})
    assert write_context(info)["label_policy"] == {"a": "last_turn", "b": "no_earlier_reasoning"}
