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
